"""Wrong tokens cost time: at most `limit` failed attempts per client address and window.

The dashboard's token (and the scrape token of /metrics) is a shared password anyone
who reaches the login form may try. After `limit` wrong ones within `window` seconds
from one address, that address is refused — without its token even being compared —
until the oldest failure leaves the window (429 with Retry-After). A right token clears
the address's record. Behind a trusted proxy the address is the client's
(`X-Forwarded-For`, `CRONSTREAM_UI_TRUSTED_PROXIES`), so one noisy user does not lock
out everyone behind the same Ingress.

Memory is bounded: the failures of at most `max_clients` addresses are kept, the
stalest forgotten first (an attacker with that many addresses gains `limit` guesses
per address, which a 16-character token makes worthless).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable

LIMIT = 10
WINDOW_SECONDS = 300.0
MAX_CLIENTS = 10_000


class Throttle:
    def __init__(self, limit: int = LIMIT, window: float = WINDOW_SECONDS,
                 max_clients: int = MAX_CLIENTS, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        self.clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, client: str) -> float:
        """Seconds until `client` may try a token again (0: now)."""
        failures = self._failures.get(client)
        if failures is None:
            return 0.0
        now = self.clock()
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return 0.0
        return max(0.0, failures[0] + self.window - now) if len(failures) >= self.limit else 0.0

    def failed(self, client: str) -> None:
        failures = self._failures.pop(client, None) or deque(maxlen=self.limit)
        failures.append(self.clock())
        self._failures[client] = failures  # most recent last
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        self._failures.pop(client, None)
