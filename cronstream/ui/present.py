"""How values look on a page: times in UTC and in a job's zone, durations, ages,
truncated text. Registered as Jinja filters; pure functions, unit-tested."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

STATUS_CLASSES = {
    "QUEUED", "RUNNING", "COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED", "PERMANENTLY_FAILED",
    "SKIPPED", "AWAITING_APPROVAL", "PROGRESS", "REQUEUED", "PENDING", "WAITING",
}


def known(t: datetime | None) -> datetime | None:
    """`t`, or None for PostgreSQL's ±infinity (the driver's datetime.min and .max): a job
    whose next run is being re-planned after its calendar changed has `-infinity` until
    the monitor computes it, and converting that to a zone fails."""
    if t is None or t.year <= 1 or t.year >= 9999:
        return None
    return t


def utc(t: datetime | None) -> str:
    """`2026-05-01 02:30:00Z` (milliseconds when there are any)."""
    t = known(t)
    if t is None:
        return "-"
    t = t.astimezone(UTC)
    text = t.strftime("%Y-%m-%d %H:%M:%S")
    if t.microsecond:
        text += f".{t.microsecond // 1000:03d}"
    return text + "Z"


def local(t: datetime | None, zone: str | None) -> str:
    """The same instant on the wall clock of `zone`, with its abbreviation."""
    t = known(t)
    if t is None or not zone or zone == "UTC":
        return ""
    try:
        there = t.astimezone(ZoneInfo(zone))
    except (ZoneInfoNotFoundError, ValueError):
        return ""
    return f"{there.strftime('%Y-%m-%d %H:%M:%S')} {there.tzname()} ({zone})"


def duration(seconds: float | None) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    if seconds < 0:
        seconds = 0.0
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"


def between(start: datetime | None, end: datetime | None) -> str:
    if start is None or end is None:
        return "-"
    return duration((end - start).total_seconds())


def ago(t: datetime | None, now: datetime | None = None) -> str:
    """`12 s ago`, `in 3m 00s`."""
    t = known(t)
    if t is None:
        return "-"
    delta = ((now or datetime.now(UTC)) - t).total_seconds()
    if delta >= 0:
        return f"{duration(delta)} ago"
    return f"in {duration(-delta)}"


def clip(text: Any, limit: int = 200) -> str:
    """At most `limit` characters, with an ellipsis when cut (the page escapes it)."""
    if text is None:
        return ""
    value = str(text)
    return value if len(value) <= limit else value[: limit - 1] + "…"


def pretty_json(raw: str | None, limit: int = 4000) -> str:
    """Indented JSON for a `<pre>`, truncated; text that is not JSON is shown as is."""
    if raw is None:
        return ""
    try:
        text = json.dumps(json.loads(raw), indent=2, ensure_ascii=False, sort_keys=True)
    except ValueError:
        text = raw
    return clip(text, limit)


def diff_class(line: str) -> str:
    """A CSS class for a line of a unified diff."""
    if line.startswith(("---", "+++")):
        return "diff-file"
    if line.startswith("@@"):
        return "diff-hunk"
    return {"+": "diff-add", "-": "diff-del"}.get(line[:1], "diff-same")


def status_class(status: str | None) -> str:
    """A CSS class for a status; anything unexpected gets the neutral one."""
    if status in STATUS_CLASSES:
        return "st-" + status.lower().replace("_", "-")  # type: ignore[union-attr]
    return "st-unknown"


def rate(succeeded: int | None, finished: int | None) -> str:
    if not finished:
        return "-"
    return f"{100 * (succeeded or 0) / finished:.0f}%"


def schedule_text(row: Any) -> str:
    """What makes a job fire, in one line."""
    kind = row["type"]
    if kind == "CRON":
        return str(row["schedule"])
    if kind == "INTERVAL":
        return f"every {duration(float(row['interval_seconds']))}"
    if kind == "ONE_TIME":
        return f"once at {utc(row['run_at'])}"
    if kind == "EVENT":
        return "on records of its topic"
    return "after " + ", ".join(row["depends_on"] or [])


def spark(statuses: list[str] | None, durations: list[float | None] | None) -> list[dict[str, Any]]:
    """Bars of a sparkline, oldest first: colour by status, height by duration."""
    statuses = statuses or []
    durations = durations or [None] * len(statuses)
    known = [d for d in durations if d is not None]
    longest = max(known, default=0.0)
    bars = []
    for i, (status, took) in enumerate(zip(statuses, durations, strict=False)):
        height = 4 + 12 * took / longest if took is not None and longest > 0 else 8.0
        bars.append({"x": i * 5, "h": round(height, 1), "status": status,
                     "title": status + (f" · {duration(took)}" if took is not None else "")})
    return bars


FILTERS = {
    "utc": utc, "local": local, "duration": duration, "between": between, "ago": ago,
    "clip": clip, "pretty_json": pretty_json, "status_class": status_class, "rate": rate,
    "schedule_text": schedule_text, "spark": spark, "diff_class": diff_class,
}
