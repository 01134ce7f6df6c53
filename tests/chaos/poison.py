"""A flood of garbage, poison and ~1 MB records on every topic (issue 9, item 7).

Garbage is what no decoder accepts (bytes that are not JSON, JSON of the wrong shape,
JSON nested deeper than any parser recurses, an empty value, a huge key); poison is a
record that decodes and once stopped a service: the issue's examples on
`job-definitions` (a condition nesting 300 parentheses, `start_at` in year 9999, a
1 MB definition) and a few more of the same kind. Every record is keyed outside the
load's job ids, so none of them can touch the load itself; the only records that may
legitimately change state are the poison definitions, which are refused or suspended.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import Producer

from cronstream.shared.settings import Settings

# Under the broker's default max.message.bytes (1048588) with the batch overhead, above
# the 1,000,000 bytes that the services' producers may copy into a dead letter.
BIG_BYTES = 1_040_000


def _deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


GARBAGE: dict[str, bytes] = {
    "not-json": b"\xff\xfe\x00 not json at all",
    "json-array": b"[1, 2, 3]",
    "schema-invalid": json.dumps({"job_id": 5, "surprise": True}).encode(),
    "deep-json": _deep_json(50_000),
    "empty": b"",
    "truncated": b'{"job_id": "poison", "type": "INTERVAL", "interv',
}


def _big(kind: str) -> bytes:
    """A ~1 MB JSON object (valid JSON, invalid as every record: too large)."""
    head = json.dumps({"job_id": "poison-big", "type": "INTERVAL", "interval_seconds": 1,
                       "handler": "noop", "kind": kind, "params": {"blob": ""}}).encode()
    return head.replace(b'"blob": ""', b'"blob": "' + b"x" * (BIG_BYTES - len(head)) + b'"')


def poison_definitions() -> list[dict[str, object]]:
    """Definitions that decode but once crashed the scheduler or the monitor, or that a
    scheduler cannot compute: each must be refused or suspended, never crash a leader."""
    window = {"type": "INTERVAL", "interval_seconds": 1, "handler": "noop"}
    return [
        # issue 9: RecursionError in the condition parser (~600 characters).
        {"job_id": "poison-deep-condition", "type": "DEPENDENT", "handler": "noop",
         "depends_on": ["poison-upstream"],
         "condition": "(" * 300 + "poison-upstream.result.rows > 0" + ")" * 300},
        # issue 9: "year 10000 is out of range" when the next fire is computed.
        {"job_id": "poison-year-9999", "type": "CRON", "schedule": "0 * * * *", "handler": "noop",
         "start_at": "9999-12-31T23:00:00Z"},
        {"job_id": "poison-end-of-time", "end_at": "9999-12-31T23:59:59.999Z",
         "start_at": "9999-12-31T23:59:59Z", **window},
        # A cron that can never fire, and one that fires once in years.
        {"job_id": "poison-feb-31", "type": "CRON", "schedule": "0 0 31 2 *", "handler": "noop"},
        {"job_id": "poison-leap-day-sunday", "type": "CRON", "schedule": "0 0 29 2 0",
         "handler": "noop"},
        {"job_id": "poison-huge-interval", "type": "INTERVAL", "interval_seconds": 10**15,
         "handler": "noop"},
        {"job_id": "poison-year-1", "type": "ONE_TIME", "run_at": "0001-01-01T00:00:00Z",
         "handler": "noop"},
        {"job_id": "poison-bad-zone", "type": "CRON", "schedule": "* * * * *",
         "timezone": "Mars/Olympus_Mons", "handler": "noop"},
        {"job_id": "poison-long-condition", "type": "DEPENDENT", "handler": "noop",
         "depends_on": ["poison-upstream"],
         "condition": " and ".join(["poison-upstream.result.rows > 0"] * 60)},
    ]


@dataclass
class Flood:
    sent: Counter[str] = field(default_factory=Counter)  # records per topic
    garbage: Counter[str] = field(default_factory=Counter)  # undecodable records per topic
    # Of those, the ones no consumer may take for anything but garbage (an empty value
    # may be read as a deletion on a compacted topic; the rest cannot be read at all).
    invalid: Counter[str] = field(default_factory=Counter)
    big: Counter[str] = field(default_factory=Counter)  # ~1 MB records per topic


def flood(settings: Settings, topics: list[str], total: int = 1000) -> Flood:
    """~`total` records over `topics`: each topic gets one ~1 MB record and a share of the
    garbage kinds in turn; `job-definitions` also gets the poison definitions."""
    result = Flood()
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap_servers,
                         "partitioner": "murmur2_random", "enable.idempotence": True, "compression.type": "none",
                         "message.max.bytes": 1_048_576, "linger.ms": 20})

    def send(topic: str, key: bytes, value: bytes | None,
             headers: list[tuple[str, str | bytes | None]] | None = None) -> None:
        while True:
            try:
                producer.produce(topic, value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        result.sent[topic] += 1

    kinds = list(GARBAGE.items())
    per_topic = max(len(kinds), total // max(1, len(topics)))
    for topic in topics:
        send(topic, f"poison-big-{topic}".encode(), _big(topic))
        result.big[topic] += 1
        for n in range(per_topic - 1):
            kind, value = kinds[n % len(kinds)]
            # A malformed trace header on some, a 100 KB key on one.
            headers: list[tuple[str, str | bytes | None]] | None = \
                [("traceparent", b"00-zz-not-a-trace-01")] if n % 3 == 0 else None
            key = (b"k" * 100_000) if n == 1 else f"poison-{kind}-{n}".encode()
            send(topic, key, value, headers)
            result.garbage[topic] += 1
            if kind != "empty":
                result.invalid[topic] += 1
        producer.poll(0)
    definitions = settings.topics.job_definitions
    if definitions in topics:
        for definition in poison_definitions():
            send(definitions, str(definition["job_id"]).encode(), json.dumps(definition).encode())
    remaining = producer.flush(60)
    assert remaining == 0, f"{remaining} flood records not delivered"
    return result
