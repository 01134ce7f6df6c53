"""The ceiling's rule: when a run of `bench/e2e_throughput.py` holds its offered rate.

One rule, for the search, the report and anyone who quotes a ceiling (decision 0026 keeps
its history). A run holds when, over its window:

1. completions **shown** — COMPLETED in PostgreSQL with `completed_at` inside the window,
   counted SHOWN_AFTER_SECONDS after it, the load still on — are at least 95 % of offered;
2. start lag p99 (due → RUNNING) is at most 1 s;
3. the projection stays within 5 s of the present at every sample of the window (one a
   second, bench/lag.py: the age of the oldest execution event not yet in PostgreSQL).

Why 5 s. A projection that keeps up still runs behind by its own cadence: under load the
monitor writes a batch a second (`BUSY_BATCH_GAP_SECONDS`), after a fetch that waits up to
250 ms, and the batch takes a few hundred milliseconds to write; a worker's event waits
for its turn's commit first (up to 100 ms). Its samples sit between 0 and about 2.5 s.
Five seconds leaves room for a checkpoint or a full collection without admitting a
projection that falls behind: one that projects a fraction f less than the log receives
gains f seconds of lag a second, so from settled (about 1 s) through the 10 s warm-up and
a 30 s window it passes 5 s once f exceeds ~10 % (the 3,000 of 18,000 events/s issue 54
measured at 6,000/s offered: ~17 %). And a projection within 5 s has shown every
completion of the window by the time the shown count is read, 10 s after it, so criterion
1 then measures the executions, not the projection a second time.

Runs measured before the lag was sampled (no `projection_lag`) do not hold: their rate
may be one the dashboard could not show.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CEILING_FRACTION = 0.95
CEILING_P99_SECONDS = 1.0
CEILING_LAG_SECONDS = 5.0
# When completions are counted as a user sees them (the rule's criterion 1).
SHOWN_AFTER_SECONDS = 10.0


def shortfalls(figures: dict[str, Any]) -> list[str]:
    """Why a run does not hold its offered rate by the rule (empty: it holds)."""
    out = []
    shown = figures.get("shown_fraction_of_offered")
    if shown is None:
        out.append("completions shown not counted")
    elif shown < CEILING_FRACTION:
        out.append(f"shown {100 * shown:.1f} % of offered < {100 * CEILING_FRACTION:.0f} %")
    p99 = figures["start_lag_ms"]["p99"]
    if not p99 <= CEILING_P99_SECONDS * 1000:  # NaN (nothing started) does not hold
        out.append(f"start lag p99 {p99:,.0f} ms > {CEILING_P99_SECONDS:.0f} s")
    lag = (figures.get("projection_lag") or {}).get("seconds", {}).get("max")
    if lag is None:
        out.append("projection lag not sampled")
    elif lag > CEILING_LAG_SECONDS:
        out.append(f"projection {lag:,.1f} s behind > {CEILING_LAG_SECONDS:.0f} s")
    return out


def holds(figures: dict[str, Any]) -> bool:
    return not shortfalls(figures)


def ceiling_of(search: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The run of the highest rate that holds, of a search in rising steps that stops at
    the first step that does not: the last of its first steps that hold (None: none held).
    Applied to a search measured under an earlier rule, the same: a step past the first
    one that fails now was never measured under this rule's conditions."""
    ceiling = None
    for figures in search:
        if not holds(figures):
            break
        ceiling = figures
    return ceiling
