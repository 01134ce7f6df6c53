"""The shape rules of job DAGs (docs/reference/semantics.md#dags): no cycles, one scheduled root.

A DEPENDENT job runs in the runs of the scheduled (non-DEPENDENT) job its upstreams lead
to. Two roots would give it two kinds of runs it could never join, so that — and a
cycle — is refused: by the CLI and SDK before sending, by the scheduler (dead letter)
when published raw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# job_id -> (type, depends_on) of the definition, or None when unknown.
Lookup = Callable[[str], tuple[str, list[str]] | None]


def roots_and_cycle(job_id: str, lookup: Lookup) -> tuple[set[str], list[str] | None]:
    """The scheduled roots `job_id` leads to, and a cycle through it if there is one."""
    roots: set[str] = set()
    cycle: list[str] | None = None
    stack: list[tuple[str, list[str]]] = [(job_id, [job_id])]
    seen: set[str] = set()
    while stack:
        current, path = stack.pop()
        known = lookup(current)
        if known is None:
            continue  # an upstream not published yet: nothing to say about it
        kind, depends_on = known
        if kind != "DEPENDENT":
            roots.add(current)
            continue
        for upstream in depends_on:
            if upstream == job_id:
                cycle = cycle or [*path, upstream]
                continue
            if upstream in path:
                continue  # a cycle that does not pass through job_id: reported for its own jobs
            if upstream not in seen:
                seen.add(upstream)
                stack.append((upstream, [*path, upstream]))
    return roots, cycle


def dag_problem(job_id: str, lookup: Lookup, downstream: Callable[[str], Iterable[str]]) -> str | None:
    """Why `job_id` (as `lookup` now sees it) breaks the DAG rules, or None.
    Its downstream jobs are checked too: a change upstream can give them a second root."""
    for checked in [job_id, *_descendants(job_id, downstream)]:
        known = lookup(checked)
        if known is None or known[0] != "DEPENDENT":
            continue
        roots, cycle = roots_and_cycle(checked, lookup)
        if cycle:
            return f"depends_on: cycle {' -> '.join(cycle)}"
        if len(roots) > 1:
            where = "" if checked == job_id else f" (through downstream job {checked!r})"
            return (f"depends_on: upstreams lead to more than one scheduled root{where}: "
                    f"{', '.join(sorted(roots))}")
    return None


def _descendants(job_id: str, downstream: Callable[[str], Iterable[str]]) -> list[str]:
    found: list[str] = []
    stack = [job_id]
    while stack:
        for child in downstream(stack.pop()):
            if child not in found and child != job_id:
                found.append(child)
                stack.append(child)
    return found
