"""If anything ever imports this module because a record named it, the test sees it."""

import os
from pathlib import Path

marker = os.environ.get("CRONSTREAM_TEST_IMPORT_MARKER")
if marker:
    Path(marker).write_text("imported")


def system(ctx: object) -> None:
    raise AssertionError("never to be called")
