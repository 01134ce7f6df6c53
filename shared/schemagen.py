"""Generate the JSON Schemas in `schemas/` from the record models (docs/reference/records.md).

    python -m cronstream.shared.schemagen schemas     # or: make schemas

The models are the source of truth; a unit test fails when the files drift from them.
The schemas cover structure, types, patterns and bounds; rules that span fields (e.g.
`schedule` is required for CRON) and semantic checks (cron syntax, IANA zones) are in
the models and documented in each schema's description.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from cronstream.shared.records import (
    Alert,
    Calendar,
    Command,
    ExecutionEvent,
    Heartbeat,
    JobDefinition,
    JobDue,
    LogBatch,
    Pool,
    Record,
    RetryRequest,
)

MODELS: dict[str, type[Record]] = {
    "job-definition": JobDefinition,
    "job-due": JobDue,
    "execution-event": ExecutionEvent,
    "heartbeat": Heartbeat,
    "retry-request": RetryRequest,
    "command": Command,
    "alert": Alert,
    "log-batch": LogBatch,
    "calendar": Calendar,
    "pool": Pool,
}


def schema(name: str, model: type[Record]) -> dict[str, Any]:
    generated = model.model_json_schema(mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://cronstream.dev/schemas/{name}.schema.json",
        **generated,
    }


def render(name: str, model: type[Record]) -> str:
    return json.dumps(schema(name, model), indent=2, sort_keys=True) + "\n"


def write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in MODELS.items():
        path = folder / f"{name}.schema.json"
        path.write_text(render(name, model))
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write(Path(sys.argv[1] if len(sys.argv) > 1 else "schemas")):
        print(f"wrote {path}")
