"""A flood of ~1,000 garbage, poison and ~1 MB records on every topic, amid the load."""

from __future__ import annotations

from collections import Counter

import pytest

from cronstream.shared.inbound import DLQ_TOPIC
from tests.chaos.conftest import RunFactory
from tests.chaos.harness import RESTART_TARGET_SECONDS, hold_until, short_or_full
from tests.chaos.poison import flood
from tests.support import header, read_all

# Log lines stay bounded whatever a record holds (issue 9: a 100 KB traceback line).
MAX_LOG_LINE = 32 * 1024


@pytest.mark.chaos_short
def test_flood_of_garbage_and_poison_on_every_topic(chaos_run: RunFactory) -> None:
    """Every consumer survives every record: garbage is dead-lettered (a copy truncated
    when too big), poison definitions are refused or suspended, and the load goes on
    with no restart at all (issue 9: one record crash-looped every scheduler)."""
    run = chaos_run("poison_flood")
    run.start_system()
    t = run.settings.topics
    topics = [s.name for s in t.specs() if s.name != t.dead_letters]
    run.start_load(short_or_full(35, 60))
    hold_until(run.at(short_or_full(8, 15)))
    sent = flood(run.settings, topics, total=1000)
    run.fault_ended("flood of garbage and poison", RESTART_TARGET_SECONDS)
    run.figures["flood_records"] = sum(sent.sent.values())
    run.settle()

    problems = []
    # Each topic a service consumes on its hot path dead-letters what it cannot read.
    consumed = [t.job_definitions, t.retries, t.job_due, *t.work_topics(["default"]),
                t.execution_events, t.heartbeats, t.commands]
    dead = Counter(header(m, DLQ_TOPIC) or "" for m in read_all(run.settings, t.dead_letters, 30))
    run.figures["dead_letters"] = {t.logical(k): v for k, v in dead.items()}
    for topic in consumed:
        expected = sent.invalid[topic] + sent.big[topic]
        if dead[topic] < expected:
            problems.append(f"{t.logical(topic)}: {dead[topic]} dead letters for {expected} "
                            f"unreadable records (garbage and ~1 MB)")
    longest = {name: max((len(line) for p in run.supervisor.all_logs(name)
                          for line in p.read_text(errors="replace").splitlines()), default=0)
               for name in run.supervisor.names}
    run.figures["longest_log_line"] = longest
    problems += [f"{name} logged a line of {n} characters (bound {MAX_LOG_LINE})"
                 for name, n in longest.items() if n > MAX_LOG_LINE]
    run.verdict(crash_restarts_allowed=False, extra_problems=problems)
