"""This tree against another checkout (the tree before a change), cell by cell, alternating,
on the same machine and the same servers: what "within noise of before" rests on.

    git worktree add /work/before <commit> && (cd /work/before && make install)
    BENCH_BEFORE_TREE=/work/before python -m bench.side_by_side   # make bench-side-by-side

The tree after is this one, or BENCH_AFTER_TREE (another checkout with its .venv: a
commit between, to tell which change a difference comes from); a pair of trees is a
section of its own in docs/benchmarks.md (bench/results/side_by_side[_<after>].json), with
BENCH_NOTE (what the pair compares) under its heading.

Each cell runs `python -m bench.e2e_throughput` for one rate in each tree (before first,
then this one), each with its own virtualenv, 30 s windows (BENCH_SECONDS): each tree's
own benchmark, so a tree older than the projection's lag sampling (bench/lag.py) reports
none, and its cells show "–" there. Cells:
BENCH_CELLS, `CONCURRENCYxRATE[:HANDLER]` separated by commas. Writes
bench/results/side_by_side.json, which `bench.report` puts into docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness import write_result

HERE = Path(__file__).resolve().parent.parent
CELLS = "8x1000,64x3000,256x3000,64x3000:bench.echo,64x6000"


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                          text=True, check=False).stdout.strip() or "unknown"


def _run(tree: Path, concurrency: int, rate: int, handler: str, seconds: str) -> dict[str, Any]:
    env = os.environ | {"BENCH_RATES": str(rate), "BENCH_SECONDS": seconds,
                        "BENCH_CONCURRENCY": str(concurrency), "BENCH_HANDLER": handler}
    env.pop("BENCH_PARTS", None)
    # The tree's own end-to-end result (its `make bench`'s, which docs/benchmarks.md shows)
    # is put back afterwards: a cell's single run does not replace it.
    path = tree / "bench" / "results" / "e2e_throughput.json"
    kept = path.read_bytes() if path.exists() else None
    try:
        subprocess.run([str(tree / ".venv" / "bin" / "python"), "-m", "bench.e2e_throughput"], cwd=tree,
                       env=env, check=True, stdout=subprocess.DEVNULL, timeout=1200)
        result: dict[str, Any] = json.loads(path.read_text())
    finally:
        if kept is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(kept)
    return result["runs"][0]


def main() -> None:
    before_dir = os.environ.get("BENCH_BEFORE_TREE")
    if not before_dir or not (Path(before_dir) / ".venv" / "bin" / "python").exists():
        sys.exit("BENCH_BEFORE_TREE must name a checkout with its own .venv (see this module's doc)")
    before = Path(before_dir).resolve()
    after_dir = os.environ.get("BENCH_AFTER_TREE")
    if after_dir and not (Path(after_dir) / ".venv" / "bin" / "python").exists():
        sys.exit("BENCH_AFTER_TREE must name a checkout with its own .venv")
    after = Path(after_dir).resolve() if after_dir else HERE
    seconds = os.environ.get("BENCH_SECONDS", "30")
    cells = []
    for cell in os.environ.get("BENCH_CELLS", CELLS).split(","):
        shape, _, handler = cell.partition(":")
        concurrency, rate = (int(x) for x in shape.split("x"))
        handler = handler or "noop"
        pair = {"before": _run(before, concurrency, rate, handler, seconds),
                "after": _run(after, concurrency, rate, handler, seconds)}
        cells.append({"concurrency": concurrency, "offered_per_second": rate, "handler": handler, **pair})
        print(f"{cell}: " + "; ".join(
            f"{name} {r['completed_per_second']:.1f}/s (shown {r.get('shown_per_second', '–')}/s) "
            f"p99 {r['start_lag_ms']['p99']:.0f} ms, projection lag max "
            f"{(r.get('projection_lag') or {}).get('seconds', {}).get('max', '–')} s, "
            f"{r['cpu_us_per_execution']['total']:.1f} µs" for name, r in pair.items()), flush=True)
    name = "side_by_side" if after == HERE else f"side_by_side_{_commit(after)}"
    write_result(name, {"before_commit": _commit(before), "after_commit": _commit(after),
                        "window_seconds": int(seconds), "cells": cells,
                        "note": os.environ.get("BENCH_NOTE", "")})


if __name__ == "__main__":
    main()
