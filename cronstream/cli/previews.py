"""What `cronstream preview` shows of one definition: its fires and the instants its
calendar excludes, from the scheduler's own code (`shared/schedule.py`).

The JSON form is the contract of the product spec (§15): one object per definition,
`{"job_id", "fires": [{"utc", "local"}], "excluded": [{"utc", "reason"}]}`, `fires` being
the instants it will fire at, jitter included (at most `max_runs` of them, counted from
none fired), `excluded` the instants of its own schedule its calendar excludes up to its
last fire shown, at most as many as `--count`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import click

from cronstream.shared.calendars import ResolvedCalendar
from cronstream.shared.records import JobDefinition
from cronstream.shared.schedule import Excluded, Fire, excluded_instants, first_fire, planned

# How far after the start excluded instants are looked for when a job has no fire left.
_EXCLUDED_HORIZON = timedelta(days=366)


def utc_text(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class Preview:
    definition: JobDefinition
    fires: list[Fire] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    note: str | None = None

    def reason(self, e: Excluded) -> str:
        return f"calendar {self.definition.calendar} excludes {e.day.isoformat()}: {e.reason}"

    def as_json(self) -> dict[str, Any]:
        zone = self.definition.zone
        return {"job_id": self.definition.job_id,
                "fires": [{"utc": utc_text(f.at), "local": f.at.astimezone(zone).isoformat(
                    timespec="milliseconds")} for f in self.fires],
                "excluded": [{"utc": utc_text(e.at), "reason": self.reason(e)} for e in self.excluded]}

    def header(self) -> str:
        d = self.definition
        details = [d.type, d.timezone]
        if d.calendar is not None:
            details.append(f"calendar {d.calendar}: {d.on_excluded}")
        if d.jitter_seconds:
            details.append(f"jitter < {d.jitter_seconds}s")
        if d.max_runs is not None:
            details.append(f"stops after {d.max_runs} run{'s' if d.max_runs > 1 else ''}")
        return f"{d.job_id} ({', '.join(details)}):"

    def lines(self) -> list[str]:
        zone = self.definition.zone
        out = [self.header()]
        if self.note:
            out.append(f"  {self.note}")
        rows: list[tuple[datetime, str]] = []
        for f in self.fires:
            local = f.at.astimezone(zone)
            text = f"  {utc_text(f.at)}  {local.isoformat(timespec='seconds')} {local.tzname()}"
            if f.jitter_ms:
                text += f"  jitter +{f.jitter_ms / 1000:.3f}s"
            if f.moved_from is not None:
                moved = f.moved_from.astimezone(zone)
                text += f"  moved from {moved.strftime('%a %Y-%m-%d %H:%M')} ({f.moved_because})"
            rows.append((f.at, text))
        for e in self.excluded:
            local = e.at.astimezone(zone)
            rows.append((e.at, f"  {utc_text(e.at)}  {local.isoformat(timespec='seconds')} "
                               f"{local.tzname()}  excluded: {self.reason(e)}"))
        out += [text for _, text in sorted(rows, key=lambda r: r[0])]
        if not self.fires and not self.note:
            out.append("  no fires")
        elif self.definition.max_runs is not None and len(self.fires) == self.definition.max_runs:
            out.append(f"  (then no more: max_runs {self.definition.max_runs})")
        return out


def preview_of(definition: JobDefinition, after: datetime, count: int,
               calendars: dict[str, ResolvedCalendar]) -> Preview:
    """The preview of `definition` from `after` (`calendars`: those it may name)."""
    p = Preview(definition)
    if definition.type == "DEPENDENT":
        p.note = "runs when its upstreams finish: " + ", ".join(definition.depends_on)
        return p
    calendar = None if definition.calendar is None else calendars[definition.calendar]
    try:
        if definition.type == "ONE_TIME":
            first = first_fire(definition, after, None)
            p.fires = [] if first is None else [Fire(first, _nominal_of_one_time(definition))]
        else:
            p.fires = planned(definition, after, count, calendar=calendar, fired=0)
        # Up to the last fire shown (after it, what is excluded is not this preview's).
        until = p.fires[-1].nominal if p.fires else after + _EXCLUDED_HORIZON
        p.excluded = excluded_instants(definition, after, until, calendar, count)
    except ValueError as exc:
        raise click.ClickException(f"{definition.job_id}: {exc}") from None
    return p


def _nominal_of_one_time(definition: JobDefinition) -> datetime:
    assert definition.run_at is not None
    return definition.run_at.replace(microsecond=definition.run_at.microsecond // 1000 * 1000)
