"""Queue growth: a work queue whose depth rose in each of the last N windows. Pure logic.

Depth is the workers group's lag on a work topic (records written, not yet taken),
sampled once per window by the service. A queue opens an episode when each of the last
`windows` samples is higher than the one before (a queue with no workers, or fewer than
its load needs); the episode stays open until the depth falls or reaches zero. A flat,
non-zero backlog is not growth: the workers keep up with the arrivals.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Trend:
    depths: tuple[int, ...]

    @property
    def latest(self) -> int:
        return self.depths[-1]

    def growing(self, windows: int) -> bool:
        """Risen in each of the last `windows` windows."""
        if len(self.depths) < windows + 1:
            return False
        tail = self.depths[-(windows + 1):]
        return all(b > a for a, b in itertools.pairwise(tail))

    def relieved(self) -> bool:
        """Fell in the last window, or empty."""
        return self.latest == 0 or (len(self.depths) >= 2 and self.depths[-1] < self.depths[-2])


class QueueTrends:
    def __init__(self, windows: int) -> None:
        self.windows = windows
        self._samples: dict[tuple[str, str], deque[int]] = {}

    def sample(self, priority: str, queue: str, depth: int) -> Trend:
        samples = self._samples.setdefault((priority, queue), deque(maxlen=self.windows + 1))
        samples.append(depth)
        return Trend(tuple(samples))
