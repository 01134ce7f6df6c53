"""The picture of a DAG run: a layered left-to-right layout computed on the server.

Pure, no I/O. Each job sits in the column of its longest path from the root; within a
column, jobs are ordered by the mean position of their upstreams (one barycentre pass,
which untangles the common fan-out / fan-in shapes), then by job_id, so the same DAG is
always drawn the same way. Edges are cubic curves from an upstream's right side to a
downstream's left side. The template turns this into SVG.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

__all__ = ["Edge", "Layout", "Node", "layout"]

NODE_W, NODE_H = 180, 48
GAP_X, GAP_Y = 70, 24
PAD = 16


@dataclass(frozen=True)
class Node:
    job_id: str
    column: int
    row: int
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    upstream: str
    downstream: str
    path: str  # SVG path data


@dataclass(frozen=True)
class Layout:
    nodes: dict[str, Node]
    edges: list[Edge]
    width: int
    height: int


def _columns(jobs: list[str], upstreams: dict[str, list[str]]) -> dict[str, int]:
    """Longest path from a source; a cycle (refused elsewhere) cannot loop forever."""
    column: dict[str, int] = {}

    def depth(job: str, seen: frozenset[str]) -> int:
        if job in column:
            return column[job]
        ups = [u for u in upstreams.get(job, []) if u in upstreams and u not in seen]
        value = 0 if not ups else 1 + max(depth(u, seen | {job}) for u in ups)
        column[job] = value
        return value

    for job in sorted(jobs):
        depth(job, frozenset())
    return column


def layout(jobs: list[str], edges: list[tuple[str, str]]) -> Layout:
    """`edges` are (upstream, downstream) pairs among `jobs`."""
    known = set(jobs)
    upstreams: dict[str, list[str]] = {j: [] for j in jobs}
    for up, down in edges:
        if up in known and down in known and up != down:
            upstreams[down].append(up)
    column = _columns(jobs, upstreams)
    by_column: dict[int, list[str]] = defaultdict(list)
    for job in jobs:
        by_column[column[job]].append(job)
    position: dict[str, float] = {}
    for index in sorted(by_column):
        members = by_column[index]

        def key(job: str) -> tuple[float, str]:
            ups = [position[u] for u in upstreams[job] if u in position]
            return (sum(ups) / len(ups) if ups else 0.0, job)

        members.sort(key=key)
        for row, job in enumerate(members):
            position[job] = row
    nodes = {
        job: Node(job, column[job], int(position[job]),
                  PAD + column[job] * (NODE_W + GAP_X),
                  PAD + int(position[job]) * (NODE_H + GAP_Y))
        for job in jobs
    }
    drawn: list[Edge] = []
    for down in sorted(upstreams):
        for up in sorted(upstreams[down]):
            a, b = nodes[up], nodes[down]
            x1, y1 = a.x + NODE_W, a.y + NODE_H // 2
            x2, y2 = b.x, b.y + NODE_H // 2
            bend = max(30, (x2 - x1) // 2)
            drawn.append(Edge(up, down, f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"))
    columns = max(column.values(), default=0) + 1
    rows = max((len(m) for m in by_column.values()), default=1)
    width = 2 * PAD + columns * NODE_W + (columns - 1) * GAP_X
    height = 2 * PAD + rows * NODE_H + (rows - 1) * GAP_Y
    return Layout(nodes, drawn, width, height)
