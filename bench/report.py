"""docs/benchmarks.md from the latest figures in bench/results/ (`make bench` ends with it).

    python -m bench.report            # writes docs/benchmarks.md

The README and the decision records quote this table, not prose from memory: a figure
there is one a command produced, on the machine and at the commit the table names.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench.ceiling import (
    CEILING_FRACTION,
    CEILING_LAG_SECONDS,
    CEILING_P99_SECONDS,
    SHOWN_AFTER_SECONDS,
    ceiling_of,
    shortfalls,
)
from bench.harness import RESULTS

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True, cwd=DOCS.parent)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, cwd=DOCS.parent).stdout
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _earlier_machines(previous: str, now: str) -> list[str]:
    """The machines of the sections carried from earlier runs (when any differs from this
    run's): the figures of a carried section were measured there, not here."""
    found = [line for line in previous.splitlines()
             if line.startswith(("- machine: ", "- earlier machine: "))]
    earlier = {line.split(": ", 1)[1].split(" (", 1)[0] for line in found} - {now}
    return [f"- earlier machine: {m} (sections carried from earlier runs were measured there)"
            for m in sorted(earlier)]


def _machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        memory = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal"))
        ram = f"{memory / 1024 / 1024:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        ram = "unknown memory"
    return f"{os.cpu_count()} × {model}, {ram}, {platform.system()} {platform.release()}, " \
           f"Python {platform.python_version()}"


def _n(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and math.isnan(value):
        return "–"
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else str(value)


def _lag(f: dict[str, Any]) -> str:
    """The projection's lag in seconds behind the present, p50 / max / at the window's end
    (– for a run measured before it was sampled)."""
    lag = (f.get("projection_lag") or {}).get("seconds")
    if not lag or lag.get("max") is None:
        return "–"
    return " / ".join(_n(lag[k], 1) for k in ("p50", "max", "at_end"))


def _partitions(f: dict[str, Any]) -> str:
    held = f.get("broker_partitions")
    return f"{_n(held['total'])} ({_n(held['this_run'])})" if held else "–"


def _verdict(f: dict[str, Any]) -> str:
    missed = shortfalls(f)
    return "holds" if not missed else "; ".join(missed)


def _run_row(label: str, f: dict[str, Any]) -> str:
    lag = f["start_lag_ms"]
    if f.get("projection_behind_events", {}).get("caught_up_after") is False:
        label += " (the projection had not caught up 5 min after: completions undercounted)"
    return (f"| {label} | {_n(f['offered_per_second'])} | {_n(f.get('shown_per_second'))} | "
            f"{_n(f['completed_per_second'])} | {_lag(f)} | {_n(lag['p50'])} | {_n(lag['p99'])} | "
            f"{_n(f['cpu_us_per_execution']['total'])} | {_n(f['kafka_transactions_per_second'])} | "
            f"{_partitions(f)} | {_verdict(f)} |")


RUN_HEAD = ("| run | offered/s | completed/s shown | completed/s executed | projection lag s "
            "p50 / max / end | start lag p50 ms | start lag p99 ms | CPU µs/execution (machine) | "
            "Kafka transactions/s | broker partitions (this run's) | by the ceiling's rule |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")

# What the columns mean, under the first table of the section.
COLUMNS = (
    "Completions are counted by `completed_at` inside the window, twice: **shown** is what "
    f"PostgreSQL (the dashboard) held {SHOWN_AFTER_SECONDS:.0f} s after the window with the load "
    "still on; **executed** is the same count once the projection caught up (the fires "
    "stopped). **Projection lag**: seconds behind the present — the age of the oldest "
    "execution event not yet in PostgreSQL, sampled every second of the window "
    "(`bench/lag.py`) — its median, maximum and last sample. **Broker partitions**: every "
    "partition the broker held as the window opened, this run's own in brackets (idle "
    "partitions cost the broker CPU). The last column applies the ceiling's rule "
    "(`bench/ceiling.py`) to every run: a run measured before the lag was sampled does "
    "not hold by it.")


def _ceiling_lag(ceiling: dict[str, Any] | None) -> str:
    if ceiling is None:
        return ""
    lag = ceiling["projection_lag"]["seconds"]
    return (f", the projection at most {_n(lag['max'], 1)} s behind the present "
            f"(p50 {_n(lag['p50'], 1)} s)")


def _flow(flow: list[dict[str, Any]] | None, at: str | None) -> list[str]:
    """Pooled against unpooled (bench/e2e_throughput.py's flow part)."""
    if not flow:
        return []
    out = ["## Flow control: every job in one pool against none (`BENCH_PARTS=flow python -m "
           f"bench.e2e_throughput`, `--concurrency` 64, measured {at})", "",
           "The pool has 100,000 slots: it admits every run and never binds, so the rows "
           "differ by what admission costs: the dispatcher's decision and its state "
           "(decision 0056; both commit their fires ahead, decision 0027). Issue 57 asks CPU per "
           "execution of pooled jobs within 15 % of unpooled ones at 3,000/s.", "", RUN_HEAD]
    for cell in flow:
        out += [_run_row("unpooled", cell["unpooled"]), _run_row("pooled", cell["pooled"])]
    out += [""] + [f"At {_n(c['offered_per_second'])}/s{_repeat(c)} pooled costs "
                   f"{_n(100 * (c['cpu_pooled_over_unpooled'] - 1), 1)} % more CPU per execution "
                   f"than unpooled (the dispatcher's share {_n(_cpu(c['pooled'], 'dispatcher'))} "
                   f"against {_n(_cpu(c['unpooled'], 'dispatcher'))} µs)."
                   for c in flow if c.get("cpu_pooled_over_unpooled")]
    for rate in sorted({c["offered_per_second"] for c in flow}):
        pairs = [c for c in flow if c["offered_per_second"] == rate and c.get("cpu_pooled_over_unpooled")]
        if len(pairs) > 1:
            plain = statistics.median(_cpu(c["unpooled"], "total") for c in pairs)
            pooled = statistics.median(_cpu(c["pooled"], "total") for c in pairs)
            out.append(f"At {_n(rate)}/s over the {len(pairs)} pairs, medians: pooled {_n(pooled)} "
                       f"against unpooled {_n(plain)} µs per execution, "
                       f"{_n(100 * (pooled / plain - 1), 1)} % more.")
    return [*out, ""]


def _repeat(cell: dict[str, Any]) -> str:
    return f" (pair {cell['repeat']})" if cell.get("repeat") else ""


def _cpu(run: dict[str, Any], service: str) -> float:
    return float(run["cpu_us_per_execution"].get(service) or 0.0)


def _triggers(result: dict[str, Any]) -> list[str]:
    """Event triggers end to end (bench/triggers.py)."""
    out = [f"## Event triggers (`python -m bench.triggers`, measured {result.get('at')})", "",
           "One EVENT job on a topic of 6 partitions (broker timestamps), records written at a "
           "steady rate through a warm-up and the window; scheduler, dispatcher, monitor and two "
           "workers of 64 slots. Trigger lag: a record written → its run's JobDue visible to a "
           "read_committed consumer. Issue 56 asks 10,000 records/s carried and trigger lag p99 "
           "≤ 250 ms at 1,000/s with `max_events: 1`.", "",
           "| records/s offered | max_events | written/s | carried/s | trigger lag p50 / p99 / max "
           "(ms) | p99 of the last 5 s | runs (warm-up and window) | missing / in two runs "
           "| all runs completed after | CPU µs per record (scheduler / all) | machine CPU |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        lag, late, cpu = c["trigger_lag_ms"], c["trigger_lag_last_5s_ms"], c["cpu_us_per_record"]
        out.append(
            f"| {_n(c['offered_per_second'])} | {c['max_events']} | {_n(c['written_per_second'])} "
            f"| {_n(c['carried_per_second'])} | {_n(lag['p50'])} / {_n(lag['p99'])} / {_n(lag['max'])} "
            f"| {_n(late['p99'])} | {_n(c['runs'])} | {c['missing']} / {c['in_two_runs']} "
            f"| {_n(c['all_runs_completed_after_last_record_s'], 1)} s "
            f"| {_n(cpu['scheduler'], 1)} / {_n(cpu['total'], 1)} "
            f"| {_n(100 * c['machine_cpu_utilisation'])} % |")
    return [*out, ""]


def _earlier_part(earlier: list[str], heading: str) -> list[str]:
    """A part (`### heading`) of the end-to-end section as the file held it, for a run of
    the programme that left it out (`BENCH_PARTS`): it stays, with the date it was measured."""
    part = _carried("\n".join(earlier), heading)
    if not part:
        return []
    when = next((line.split("measured ", 1)[1].rstrip(")") for line in earlier[:1]
                 if "measured " in line), "?")
    note = f"Measured {when}, in an earlier run of the programme (not re-run with the rest of this section)."
    return part if len(part) > 2 and part[2].startswith("Measured ") else [part[0], "", note, *part[1:]]


def _e2e(e2e: dict[str, Any], earlier: list[str]) -> list[str]:
    """The end-to-end section; the parts this result lacks are carried from `earlier` (the
    section as the file held it)."""
    out = [f"## End to end (`bench/e2e_throughput.py`, measured {e2e.get('at', '?')})", "",
           "Two workers, everything on this machine: Kafka, PostgreSQL, all services. Each run "
           "is a fresh system; completions counted by `completed_at` inside the window; CPU of "
           "every process (services with their handler processes, the broker, PostgreSQL) "
           "over the window, per execution completed in it.", "", COLUMNS, ""]
    if e2e.get("matrix"):
        out += ["### The matrix: `--concurrency` × offered rate (no-op handler, 30 s windows)", "",
                RUN_HEAD]
        out += [_run_row(f"--concurrency {f['worker_concurrency']}", f) for f in e2e["matrix"]]
        out.append("")
    else:
        out += _earlier_part(earlier, "### The matrix")
    sleeper = e2e.get("sleeper_20ms_default_concurrency")
    if sleeper:
        limit = _n(sleeper["physical_limit_per_second"])
        reached = _n(100 * sleeper["fraction_of_physical_limit"], 1)
        out += ["### A handler that sleeps 20 ms, at the default concurrency", "", RUN_HEAD,
                _run_row("bench.sleep20, --concurrency 8", sleeper), "",
                f"Physical limit: 2 workers × 8 slots / 20 ms = {limit}/s; reached {reached} %.", ""]
    else:
        out += _earlier_part(earlier, "### A handler that sleeps")
    if "search" in e2e:
        ceiling = ceiling_of(e2e["search"])
        out += ["### The ceiling (`--concurrency` 64)", "",
                "**The rule** (`bench/ceiling.py`, decision 0026): the ceiling is the highest "
                "offered rate, in steps of 1,000/s with 30 s windows, at which two workers of "
                f"`--concurrency 64` complete at least {100 * CEILING_FRACTION:.0f} % of what is "
                f"offered as PostgreSQL shows it {SHOWN_AFTER_SECONDS:.0f} s after the window, "
                f"with start lag p99 at most {CEILING_P99_SECONDS:.0f} s, and with the projection "
                f"within {CEILING_LAG_SECONDS:.0f} s of the present at every sample of the window: "
                "a rate the dashboard cannot show is not held. It is then sustained for 60 s, and "
                "twice it is offered: completions executed must stay at least 90 % of the "
                "ceiling's.", "",
                f"**Ceiling: {_n(ceiling['offered_per_second']) + '/s' if ceiling else 'none held'}"
                f"{_ceiling_lag(ceiling)}.**", "", RUN_HEAD]
        out += [_run_row("search", f) for f in e2e["search"]]
        for key, label in (("ceiling_sustained", "sustained (60 s)"), ("overload_2x", "twice the ceiling")):
            if e2e.get(key):
                out.append(_run_row(label, e2e[key]))
        if ceiling is None and e2e.get("ceiling"):
            out += ["", f"The search's own verdict, by the rule it ran under, was "
                        f"{_n(e2e['ceiling']['offered_per_second'])}/s; the rule above does not "
                        "hold it."]
        if e2e.get("overload_2x"):
            kept = _n(100 * e2e["overload_2x"]["completions_vs_ceiling"], 1)
            out += ["", f"Twice the ceiling completes {kept} % of the ceiling's rate (executed)."]
        out.append("")
    else:
        out += _earlier_part(earlier, "### The ceiling")
    logs = e2e.get("logs_1000")
    if logs:
        chatty = logs["ten_lines"].get("log_lines") or {}
        delay = chatty.get("print_to_readable_ms") or {}
        out += ["### Execution logs (pool handlers, 1,000/s, `--concurrency` 64)", "", RUN_HEAD,
                _run_row("printing nothing", logs["quiet"]),
                _run_row("printing ten lines each", logs["ten_lines"]), "",
                f"CPU per line (machine, the difference ÷ 10): {_n(logs['cpu_us_per_line'], 1)} µs; "
                f"{_n(chatty.get('per_second'))} lines/s; delay from `print` to readable "
                f"(`cronstream logs -f`) p50 {_n(delay.get('p50'))} ms, p99 {_n(delay.get('p99'))} ms.", ""]
    else:
        out += _earlier_part(earlier, "### Execution logs")
    if e2e.get("tracing_on_3000"):
        out += ["### Tracing (3,000/s, `--concurrency` 64)", "", RUN_HEAD,
                _run_row("no exporter (default)", e2e["tracing_off_3000"]),
                _run_row("every span exported", e2e["tracing_on_3000"]), ""]
    else:
        out += _earlier_part(earlier, "### Tracing")
    if e2e.get("runs"):
        out += ["### Runs asked for by BENCH_RATES", "", RUN_HEAD]
        out += [_run_row(f"{f['handler']}, --concurrency {f['worker_concurrency']}", f) for f in e2e["runs"]]
        out.append("")
    return out


def _side_by_side(pairs: dict[str, Any]) -> list[str]:
    """The tree before a change against this one, cell by cell (`bench/side_by_side.py`)."""
    out = [f"## Side by side: {pairs['before_commit']} (before) and {pairs['after_commit']} "
           f"(`bench/side_by_side.py`, measured {pairs.get('at', '?')})", "",
           *([pairs["note"], ""] if pairs.get("note") else []),
           f"The same cells run in both trees, alternating, on the same servers "
           f"({pairs['window_seconds']} s windows; no-op handlers inline, bench.echo in the "
           "process pool).", "",
           "| cell | tree | completed/s shown | completed/s executed | projection lag s p50 / max / "
           "end | start lag p50 ms | start lag p99 ms | CPU µs/execution (machine) | "
           "Kafka transactions/s | broker partitions (this run's) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for cell in pairs["cells"]:
        label = _cell_label(cell)
        for tree in ("before", "after"):
            f = cell[tree]
            lag = f["start_lag_ms"]
            out.append(f"| {label} | {tree} | {_n(f.get('shown_per_second'), 1)} | "
                       f"{_n(f['completed_per_second'], 1)} | {_lag(f)} | {_n(lag['p50'])} | "
                       f"{_n(lag['p99'])} | {_n(f['cpu_us_per_execution']['total'], 1)} | "
                       f"{_n(f['kafka_transactions_per_second'])} | {_partitions(f)} |")
    out += ["", "Where the CPU per execution differs (after − before, µs, by process, "
            "largest first):", ""]
    for cell in pairs["cells"]:
        out.append(f"- {_cell_label(cell)}: {_cpu_difference(cell['before'], cell['after'])}")
    out.append("")
    return out


def _cell_label(cell: dict[str, Any]) -> str:
    return f"{cell['handler']}, --concurrency {cell['concurrency']}, {_n(cell['offered_per_second'])}/s"


def _cpu_difference(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The change in CPU per execution, in total and by process, largest first."""
    b, a = before["cpu_us_per_execution"], after["cpu_us_per_execution"]
    total = a["total"] - b["total"]
    parts = sorted(((name, a[name] - b.get(name, 0.0)) for name in a if name != "total"),
                   key=lambda item: -abs(item[1]))
    return (f"{total:+,.1f} ({100 * total / b['total']:+.1f} %); "
            + ", ".join(f"{name} {diff:+,.1f}" for name, diff in parts))


# The single-leader clock of an independent benchmark (issue 55), before the shards: 1M
# definitions of the same mix, two processes (leader + cold standby), 6 s session timeout.
SINGLE_LEADER_1M = {"every_shard_led_after_seconds": 71.7, "rss_total_mb": 3319 + 60,
                    "rss_bytes_per_definition": 3300, "sigkill_p99_ms": 24_400}


def _earlier_rows(previous: str, heading: str, runs: list[dict[str, Any]]) -> list[str]:
    """The rows of a table of runs as the file held them, but the first (the fixed
    baseline) and those of the runs read now: earlier runs whose result files are gone
    (another checkout, another machine) stay beside the new ones."""
    section = _carried(previous, heading)
    table = [line for line in section if line.startswith("| ") and not line.startswith("|---")]
    now = {str(r.get("at")) for r in runs}
    return [row for row in table[2:] if not any(at in row for at in now)]


def _shards(runs: list[dict[str, Any]], earlier: list[str] | None = None) -> list[str]:
    """The clock in shards (`bench/shards.py`): each run beside its bounds, the single
    leader of before at 1M, and the rows of earlier runs the file held."""
    out = ["## The clock in shards (`bench/shards.py`)", "",
           "N definitions (70 % daily cron, 20 % long intervals, 10 % one-time up to ten years "
           "ahead) and 256 probes firing every second, over S shards on P scheduler processes "
           "with one warm standby per shard, the broker on the same machine. Bounds: SIGKILL → "
           "fires again within the session timeout + 2 s, SIGTERM ≤ 1 s, the burst within 2 s.", "",
           "| definitions | shards / processes | measured | every shard led after s | RSS total MB "
           "(per process) | bytes per definition | steady fire lag p99 ms | SIGKILL → fires again "
           "p99 ms (bound) | SIGTERM latest fire ms | 100k burst all committed ms | missed / "
           "doubled |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    b = SINGLE_LEADER_1M
    out.append(f"| 1,000,000 | 1 / 2 (single leader, before) | issue 55 | "
               f"{b['every_shard_led_after_seconds']} | {_n(b['rss_total_mb'])} | "
               f"{_n(b['rss_bytes_per_definition'])} | – | "
               f"{_n(b['sigkill_p99_ms'])} | – | – | 0 / 0 |")
    for r in runs:
        p = r["params"]
        kill = r.get("sigkill", {})
        rss = " / ".join(_n(v) for v in r.get("rss_mb", {}).values())
        when = ", ".join(str(x) for x in (r.get("at", "?"), r.get("tree"), r.get("note")) if x)
        out.append(f"| {_n(p['definitions'])} | {p['shards']} / {p['processes']} | {when} | "
                   f"{r.get('every_shard_led_after_seconds')} | {_n(r.get('rss_total_mb'))} ({rss}) | "
                   f"{_n(r.get('rss_bytes_per_definition'))} | "
                   f"{_n(r.get('steady_fire_lag_ms', {}).get('p99'))} | "
                   f"{_n(kill.get('fires_again_after_ms', {}).get('p99'))} ({_n(kill.get('bound_ms'))}) | "
                   f"{_n(r.get('sigterm', {}).get('latest_fire_ms'))} | "
                   f"{_n(r.get('burst', {}).get('all_committed_after_ms'))} | "
                   f"{_n(r.get('missed'))}{_after_cold_start(r)} / {_n(r.get('doubled'))} |")
    out += earlier or []
    out.append("")
    return out


def _after_cold_start(r: dict[str, Any]) -> str:
    """How many of the missed instants fell after the cold start (the rest: FIRE_ONCE's
    policy while the first leaders computed every job's first fire)."""
    after = r.get("missed_after_cold_start")
    return "" if after is None else f" ({_n(after)} after the cold start)"


def _carried(previous: str, heading: str) -> list[str]:
    """A section of the file as it stood (from `heading` to the next heading of its level):
    the figures of a benchmark not re-run this time stay, with the date they were measured."""
    lines = previous.splitlines()
    level = heading.split(" ", maxsplit=1)[0] + " "
    for i, line in enumerate(lines):
        if line.startswith(heading):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(level)
                        or (level == "### " and lines[j].startswith("## "))), len(lines))
            return [*lines[i:end]] + ([""] if lines[end - 1:end] != [""] else [])
    return []


def _carried_all(previous: str, heading: str) -> list[list[str]]:
    """Every section of the file whose heading starts with `heading`, as it stood."""
    out: list[list[str]] = []
    rest = previous
    while (part := _carried(rest, heading)):
        out.append(part)
        rest = rest.split(part[0], 1)[1]
    return out


def _pairs(previous: str) -> list[str]:
    """A section per pair of trees side by side: those with a result now, and those the
    file held for other pairs (measured earlier, their results gone)."""
    pairs = sorted((json.loads(p.read_text()) for p in RESULTS.glob("side_by_side*.json")),
                   key=lambda r: str(r.get("at")))
    out = [line for pair in pairs for line in _side_by_side(pair)]
    now = {f"## Side by side: {r['before_commit']} (before) and {r['after_commit']} " for r in pairs}
    for section in _carried_all(previous, "## Side by side"):
        if not any(section[0].startswith(head) for head in now):
            out += section
    return out


def _flat(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [item for k, v in value.items() if k not in ("machine", "benchmark", "at")
                for item in _flat(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [(prefix, value)]
    return []


def _others(previous: str) -> list[str]:
    out = ["## The other benchmarks (`make bench`; each file in bench/results/)", ""]
    present = {path.stem for path in RESULTS.glob("*.json")}
    before = previous.partition(out[0])[2]
    for line in before.splitlines():
        stem = line.removeprefix("### ").split(" ", maxsplit=1)[0]
        if line.startswith("### ") and stem not in present:
            out += _carried(before, f"### {stem} ")
    for path in sorted(RESULTS.glob("*.json")):
        if path.stem in ("e2e_throughput", "e2e_flow", "triggers") \
                or path.stem.startswith(("shards_", "side_by_side")):
            continue
        data = json.loads(path.read_text())
        figures = _flat(data)[:24]
        tree = f", {data['tree']}" if data.get("tree") else ""
        out += [f"### {path.stem} (measured {data.get('at', '?')}{tree})", ""]
        out += [f"- `{key}`: {_n(value, 0 if isinstance(value, int) else 2)}" for key, value in figures]
        out.append("")
    return out


def render() -> str:
    lines = ["# Benchmarks", "",
             "Generated by `make bench` (`python -m bench.report`) from `bench/results/`: do not "
             "edit by hand. The README and docs/decisions quote this file.", "",
             f"- commit: {_commit()}", f"- machine: {_machine()}"]
    previous = DOCS.read_text() if DOCS.exists() else ""
    lines += [*_earlier_machines(previous, _machine()), ""]
    e2e = _load("e2e_throughput")
    earlier_e2e = _carried(previous, "## End to end")
    lines += _e2e(e2e, earlier_e2e) if e2e else earlier_e2e
    lines += _pairs(previous)
    flow = _load("e2e_flow")
    lines += _flow(flow.get("flow"), flow.get("at")) if flow else _carried(previous, "## Flow control")
    triggers = _load("triggers")
    lines += _triggers(triggers) if triggers else _carried(previous, "## Event triggers")
    shards = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("shards_*.json"))]
    if shards:
        lines += _shards(sorted(shards, key=lambda r: r["params"]["definitions"]),
                         _earlier_rows(previous, "## The clock in shards", shards))
    else:
        lines += _carried(previous, "## The clock in shards")
    lines += _others(previous)
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    DOCS.write_text(render())
    print(f"wrote {DOCS}")


if __name__ == "__main__":
    main()
