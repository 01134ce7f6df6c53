"""Print the chaos runs recorded in bench/results/chaos/*.jsonl: per fault, how many runs
passed and the recovery times (fault end → first completion of a fire scheduled after it).

    python -m tests.chaos.summary [--since 2026-11-30T04:00:00]
"""

from __future__ import annotations

import argparse
import json

from tests.chaos.harness import RESULTS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", default="", help="only runs recorded at or after (UTC, ISO)")
    args = parser.parse_args()
    print(f"{'fault':32} {'runs':>4} {'pass':>4}  recovery s: first completion / all jobs moving / all jobs' new fire started (target), per run")
    for path in sorted(RESULTS.glob("*.jsonl")):
        runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        runs = [r for r in runs if r["at"][:19] >= args.since[:19]]
        if not runs:
            continue
        passed = sum(1 for r in runs if r["passed"])
        figures = []
        for r in runs:
            figures.append(" ".join(
                f"{_s(x['first'])}/{_s(x.get('all_jobs_moving'))}/"
                f"{_s(x.get('all_jobs_started', x.get('all_jobs')))}"
                f"({x['target_seconds']:.0f})"
                for x in r["recovery"]) + ("" if r["passed"] else " FAIL"))
        print(f"{path.stem:32} {len(runs):>4} {passed:>4}  " + " | ".join(figures))


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    main()
