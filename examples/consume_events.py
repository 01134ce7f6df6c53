"""Following cronstream's executions from another system (mypy --strict clean).

    python examples/consume_events.py billing     # the consumer group

Each event is committed only after the loop body for it returned; a clean stop (Ctrl-C,
SIGTERM) commits what was finished, so a restart continues exactly where it stopped.
"""

from __future__ import annotations

import signal
import sys

from cronstream import ExecutionEvent, events


def record(event: ExecutionEvent) -> None:
    # Effects keyed by event_id stay exactly-once even after a crash (docs/consuming-events.md).
    print(f"{event.event_id} {event.job_id} {event.status} attempt={event.attempt_number}")


def main(group_id: str) -> None:
    with events.subscribe(group_id=group_id, statuses={"COMPLETED", "PERMANENTLY_FAILED"}) as stream:
        signal.signal(signal.SIGTERM, lambda *_: stream.stop())
        try:
            for event in stream:
                record(event)
        except KeyboardInterrupt:
            pass  # leaving the `with` commits what was finished


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "example-consumer")
