"""A consumer of execution-events as another team would write it, for the e2e tests:

    python -m tests.e2e.subscriber_for_tests GROUP OUT_FILE

Appends one JSON line per event to OUT_FILE (flushed before the event counts as done);
SIGTERM stops it cleanly after the current event.
"""

from __future__ import annotations

import json
import signal
import sys

from cronstream.events import subscribe


def main(group: str, out_path: str) -> None:
    with subscribe(group_id=group, from_beginning=True) as events, \
            open(out_path, "a", encoding="utf-8") as out:
        signal.signal(signal.SIGTERM, lambda *_: events.stop())
        print("subscribed", flush=True)
        for event in events:
            out.write(json.dumps({"event_id": str(event.event_id), "status": event.status,
                                  "job_id": event.job_id}) + "\n")
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
