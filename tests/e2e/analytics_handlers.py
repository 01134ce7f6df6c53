"""Handlers the analytics e2e tests register in their workers (`--import`): their
behaviour is steered by a file the test writes, so a job can degrade and recover
without being redefined."""

from __future__ import annotations

import time
from pathlib import Path

from cronstream import Context, handler


@handler("test.fail-while-flagged")
def fail_while_flagged(ctx: Context) -> dict[str, bool]:
    """Fails while the file params.path exists."""
    if Path(ctx.params["path"]).exists():
        raise RuntimeError("flagged to fail")
    return {"ok": True}


@handler("test.sleep-as-told")
def sleep_as_told(ctx: Context) -> dict[str, float]:
    """Sleeps as many seconds as the file params.path says."""
    seconds = float(Path(ctx.params["path"]).read_text())
    time.sleep(seconds)
    return {"slept": seconds}
