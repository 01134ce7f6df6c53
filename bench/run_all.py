"""`make bench`: run every benchmark; each prints its figures and writes bench/results/<name>.json."""

from __future__ import annotations

import importlib
import sys
import traceback

BENCHMARKS = ["bench.e2e_throughput", "bench.transactions", "bench.scheduler", "bench.worker",
              "bench.retries", "bench.monitor", "bench.records", "bench.hot_path", "bench.ui",
              "bench.dashboards", "bench.triggers", "bench.shards"]


def main() -> int:
    failed = []
    for name in BENCHMARKS:
        print(f"=== {name}", flush=True)
        try:
            importlib.import_module(name).main()
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
