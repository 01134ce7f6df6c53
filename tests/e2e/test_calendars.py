"""Calendars from the command line, with the real monitor: `calendar apply`, `calendars`
(the projection), `calendar preview`, `preview` reading a job's calendar from Kafka,
`calendar history` and `calendar delete`; a calendar record that does not validate is
dead-lettered by the monitor (docs/decisions/0055)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from cronstream.shared.inbound import DLQ_ERROR
from cronstream.shared.settings import Settings
from tests.conftest import Processes
from tests.support import cli, eventually, header, produce_json, read_all

CALENDAR = {"calendar_id": "us-business", "timezone": "America/New_York",
            "holidays": {"country": "US"}, "exclude_weekdays": ["SAT", "SUN"],
            "description": "NYSE-ish business days"}
JOB = {"job_id": "close-books", "type": "CRON", "schedule": "0 9 L * *", "timezone": "America/New_York",
       "handler": "noop", "calendar": "us-business", "on_excluded": "PREVIOUS_DAY", "jitter_seconds": 120}


def test_calendars_from_the_command_line(processes: Processes, topics: Settings, tmp_path: Path) -> None:
    processes.start("monitor").wait_for_log("action=partitions_assigned")
    calendar_file = tmp_path / "calendar.yaml"
    calendar_file.write_text(yaml.safe_dump(CALENDAR))
    jobs_file = tmp_path / "jobs.yaml"
    jobs_file.write_text(yaml.safe_dump(JOB))

    # A job naming a calendar nobody applied is refused, naming the field.
    refused = cli(topics, "apply", "-f", str(jobs_file))
    assert refused.returncode == 1 and "calendar: no calendar 'us-business'" in refused.stderr, refused.stderr

    done = cli(topics, "calendar", "apply", "-f", str(calendar_file))
    assert done.returncode == 0 and done.stdout.strip() == "applied calendar us-business", done.stderr
    assert cli(topics, "apply", "-f", str(jobs_file)).returncode == 0

    # `calendars` reads the projection: the calendar, its version, the job that names it.
    def listed() -> list[dict[str, object]] | None:
        out = cli(topics, "calendars", "-o", "json")
        rows = json.loads(out.stdout) if out.returncode == 0 else []
        return rows if rows and rows[0]["jobs"] == 1 else None

    rows = eventually(listed, message="the calendar and its job are projected")
    assert rows[0]["calendar_id"] == "us-business" and rows[0]["version"] == 1
    table = cli(topics, "calendars")
    assert "holidays US; SAT,SUN" in table.stdout, table.stdout

    days = cli(topics, "calendar", "preview", "us-business", "--from", "2026-12-24", "--to", "2026-12-28",
               "-o", "json")
    assert [(d["date"], d["reason"]) for d in json.loads(days.stdout)] == [
        ("2026-12-24", None), ("2026-12-25", "holiday: Christmas Day (US)"), ("2026-12-26", "weekend: SAT"),
        ("2026-12-27", "weekend: SUN"), ("2026-12-28", None)]

    # preview reads the job's calendar from Kafka. 2027-01-31 is a Sunday: Friday the 29th.
    shown = cli(topics, "preview", "-f", str(jobs_file), "--from", "2027-01-01T00:00:00Z", "--count", "2",
                "-o", "json")
    assert shown.returncode == 0, shown.stderr
    [preview] = json.loads(shown.stdout)
    assert [f["local"][:15] for f in preview["fires"]] == ["2027-01-29T09:0", "2027-02-26T09:0"]
    assert preview["excluded"] == [{"utc": "2027-01-31T14:00:00.000Z",
                                    "reason": "calendar us-business excludes 2027-01-31: weekend: SUN"}]

    # A calendar record that does not validate, from any producer: dead-lettered by the monitor.
    produce_json(topics, topics.topics.calendars, "broken", {"calendar_id": "broken",
                                                             "exclude_weekdays": ["FUN"]})
    dead = eventually(lambda: [m for m in read_all(topics, topics.topics.dead_letters)
                               if (m.key() or b"") == b"broken"] or None,
                      message="the invalid calendar is dead-lettered")
    assert "exclude_weekdays.0" in (header(dead[0], DLQ_ERROR) or "")

    # Deleting a calendar a live job names is refused unless forced; history keeps it.
    refused = cli(topics, "calendar", "delete", "us-business")
    assert refused.returncode == 1 and "named by 1 job(s): close-books" in refused.stderr
    assert cli(topics, "calendar", "delete", "us-business", "--force").returncode == 0

    def deleted() -> list[dict[str, object]] | None:
        out = cli(topics, "calendar", "history", "us-business", "-o", "json")
        rows = json.loads(out.stdout) if out.returncode == 0 else []
        return rows if len(rows) == 2 else None

    history = eventually(deleted, message="the delete is a version")
    assert [(v["version"], v["deleted"]) for v in history] == [(1, False), (2, True)]
    assert json.loads(cli(topics, "calendars", "-o", "json").stdout) == []
    assert len(json.loads(cli(topics, "calendars", "--deleted", "-o", "json").stdout)) == 1
