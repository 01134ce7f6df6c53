"""The worker's intake without Kafka: which consumed record starts next, which waits for
its scheduled_at (and what waits behind it), and when the partitions pause."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from confluent_kafka import Message

from cronstream.services.worker.intake import HOLD_AT_MOST_SECONDS, Intake
from cronstream.shared.fast_records import DueRecord
from cronstream.shared.records import JobDue, JobSnapshot

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
TIERS = {"w.high": "high", "w.normal": "normal", "w.low": "low"}


class Log:
    """Records appended per partition, and the JobDue each one carries."""

    def __init__(self) -> None:
        self.dues: dict[tuple[str, int, int], JobDue | None] = {}
        self.ends: dict[tuple[str, int], int] = {}

    def append(self, topic: str, partition: int = 0, at: datetime = NOW,
               garbage: bool = False) -> Message:
        offset = self.ends.get((topic, partition), 0)
        self.ends[(topic, partition)] = offset + 1
        due = None if garbage else JobDue(
            execution_id=uuid.uuid4(), job_id="job", run_id=uuid.uuid4(), scheduled_at=at,
            reason="SCHEDULE", idempotency_key="k", job=JobSnapshot(handler="noop"))
        self.dues[(topic, partition, offset)] = due
        return Message(topic=topic, partition=partition, offset=offset, key=b"job", value=b"{}")

    def read(self, msg: Message) -> DueRecord | None:
        return self.dues[(msg.topic() or "", msg.partition() or 0, msg.offset() or 0)]


def drain(intake: Intake, log: Log, now: datetime = NOW) -> list[tuple[str, int, int]]:
    """The positions `next` gives, in order, until it gives nothing."""
    taken = []
    intake.begin()
    while (head := intake.next(log.read, now)) is not None:
        msg = head[0]
        taken.append((msg.topic() or "", msg.partition() or 0, msg.offset() or 0))
    return taken


def test_higher_tiers_start_first_each_in_the_order_consumed() -> None:
    log, intake = Log(), Intake(TIERS, capacity=8)
    intake.add([log.append("w.low"), log.append("w.normal"), log.append("w.high"),
                log.append("w.normal"), log.append("w.high")])
    assert drain(intake, log) == [("w.high", 0, 0), ("w.high", 0, 1), ("w.normal", 0, 0),
                                  ("w.normal", 0, 1), ("w.low", 0, 0)]
    assert len(intake) == 0


def test_a_record_due_ahead_holds_its_partition_and_lets_the_others_go() -> None:
    log, intake = Log(), Intake(TIERS, capacity=8)
    ahead = NOW + timedelta(milliseconds=300)
    intake.add([log.append("w.normal", 0, at=ahead), log.append("w.normal", 0),
                log.append("w.normal", 1)])
    assert drain(intake, log) == [("w.normal", 1, 0)]
    assert intake.hold_until == ahead.timestamp()
    assert len(intake) == 2
    # Still early: nothing; at its time, the held one and then what waited behind it.
    assert drain(intake, log, NOW + timedelta(milliseconds=299)) == []
    assert drain(intake, log, ahead) == [("w.normal", 0, 0), ("w.normal", 0, 1)]
    assert intake.hold_until is None


def test_a_record_far_ahead_was_not_fired_ahead_and_starts_at_once() -> None:
    log, intake = Log(), Intake(TIERS, capacity=8)
    far = NOW + timedelta(seconds=HOLD_AT_MOST_SECONDS + 1)
    intake.add([log.append("w.normal", at=far)])
    assert drain(intake, log) == [("w.normal", 0, 0)]


def test_a_record_that_does_not_decode_is_given_without_a_due() -> None:
    log, intake = Log(), Intake(TIERS, capacity=8)
    intake.add([log.append("w.normal", garbage=True), log.append("w.normal")])
    intake.begin()
    first, second = intake.next(log.read, NOW), intake.next(log.read, NOW)
    assert first is not None and first[1] is None
    assert second is not None and second[1] is not None


def test_a_full_buffer_pauses_only_at_twice_its_limit_and_resumes_half_empty() -> None:
    log, intake = Log(), Intake(TIERS, capacity=8)
    assert (intake.limit, intake.pause_limit) == (1000, 2000)
    assert Intake(TIERS, capacity=512).limit == 2048  # four records a slot
    intake.add([log.append("w.normal") for _ in range(1999)])
    assert intake.room() == 1  # past the limit: one record a consume
    assert not intake.wants_pause(paused=False)
    intake.add([log.append("w.normal")])
    assert intake.wants_pause(paused=False)
    intake.begin()
    for _ in range(1499):
        intake.next(log.read, NOW)
    assert intake.wants_pause(paused=True)  # 501: still above half the limit
    intake.next(log.read, NOW)
    assert not intake.wants_pause(paused=True)


def test_revoked_partitions_are_forgotten_buffered_and_held() -> None:
    log, intake = Log(), Intake(TIERS, capacity=8)
    intake.add([log.append("w.normal", 0, at=NOW + timedelta(milliseconds=300)),
                log.append("w.normal", 0), log.append("w.normal", 1), log.append("w.high", 2)])
    assert drain(intake, log) == [("w.high", 2, 0), ("w.normal", 1, 0)]
    intake.add([log.append("w.normal", 1), log.append("w.high", 2)])
    intake.drop({("w.normal", 0), ("w.high", 2)})
    assert intake.partitions() == {("w.normal", 1)}
    assert drain(intake, log, NOW + timedelta(seconds=1)) == [("w.normal", 1, 1)]
