"""Alert episodes: one FIRING when a condition starts to hold, one RESOLVED when it stops.

An episode is named by (kind, subject) — a job_id, or a queue — and gets a deterministic
`alert_id` from its kind, subject and opening instant; every record of the episode
carries it. The open episodes are rebuilt at start from the `alerts` topic itself
(`restore`), which is what makes a restart mid-window raise no second FIRING: the topic
is this state's changelog (docs/decisions/0020).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from uuid import UUID, uuid5

from cronstream.shared.ids import NAMESPACE
from cronstream.shared.records import Alert, AlertKind

ANALYTICS_KINDS: frozenset[str] = frozenset(
    {"SUCCESS_RATE_LOW", "DURATION_REGRESSION", "QUEUE_GROWING", "FIRE_LATE", "WAITING_TOO_LONG"})


@dataclass(frozen=True, slots=True)
class Episode:
    alert_id: UUID
    kind: AlertKind
    subject: str
    opened_ms: int


@dataclass(frozen=True, slots=True)
class Transition:
    state: Literal["FIRING", "RESOLVED"]
    episode: Episode


def episode_id(kind: str, subject: str, opened_ms: int) -> UUID:
    return uuid5(NAMESPACE, f"alert|{kind}|{subject}|{opened_ms}")


def queue_subject(priority: str, queue: str) -> str:
    return f"queue:{priority}.{queue}"


def subject_of(alert: Alert) -> str | None:
    if alert.kind == "QUEUE_GROWING":
        priority = alert.evidence.get("priority")
        return queue_subject(str(priority), alert.queue) if alert.queue and priority else None
    return alert.job_id


class Episodes:
    def __init__(self) -> None:
        self.open: dict[tuple[str, str], Episode] = {}

    def restore(self, alert: Alert) -> None:
        """Replay one record of the `alerts` topic (oldest first)."""
        subject = subject_of(alert)
        if alert.kind not in ANALYTICS_KINDS or subject is None:
            return
        key = (alert.kind, subject)
        if alert.state == "FIRING":
            opened = int(alert.occurred_at.timestamp() * 1000)
            self.open[key] = Episode(alert.alert_id, alert.kind, subject, opened)
        elif key in self.open and self.open[key].alert_id == alert.alert_id:
            del self.open[key]

    def evaluate(self, kind: AlertKind, subject: str, opening: bool, holding: bool,
                 now_ms: int) -> Transition | None:
        """`opening`: the condition to open an episode holds; `holding`: the condition to
        keep an open one holds (hysteresis; often the same)."""
        key = (kind, subject)
        current = self.open.get(key)
        if current is None and opening:
            episode = Episode(episode_id(kind, subject, now_ms), kind, subject, now_ms)
            return Transition("FIRING", episode)
        if current is not None and not holding:
            return Transition("RESOLVED", current)
        return None

    def commit(self, transition: Transition) -> None:
        """The transition's record is on the topic: make it the known state."""
        key = (transition.episode.kind, transition.episode.subject)
        if transition.state == "FIRING":
            self.open[key] = transition.episode
        else:
            self.open.pop(key, None)

    def subjects(self, kind: str) -> list[str]:
        return [s for k, s in self.open if k == kind]
