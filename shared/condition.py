"""Conditions of DAG steps: a safe expression language (docs/reference/semantics.md#dags). Never `eval`.

Grammar (lowest precedence first):

    expr       := and_expr ("or" and_expr)*
    and_expr   := not_expr ("and" not_expr)*
    not_expr   := "not" not_expr | comparison
    comparison := operand (("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not in") operand)?
    operand    := literal | path | "(" expr ")"
    literal    := number | "string" | 'string' | true | false | null | "[" literal, ... "]"
    path       := <upstream job_id> "." ("result" ("." key | "[" integer "]")* | "status")
                | <root> ("." key | "[" integer "]")*          (an expression over roots)

Example: `extract.result.rows > 0 and not validate.result.warnings`
         `extract.status == "COMPLETED" and "eu" in extract.result.regions`

A path names an upstream job (one of `depends_on`; job ids may contain dots: the longest
upstream id that prefixes the path wins) and then its `result` or its final `status`.
Evaluation is total: a missing key is null, and a comparison between values of
different types (e.g. "a" < 1) is false rather than an error. The value of the whole
condition is its truthiness, as in JSON-minded languages: null, false, 0, "" and [] are
false.

The same language, parsed with `parse_expression(text, roots)`, names values by a root
instead of an upstream job (a flow-control key, `params.customer`: decision 0056); there its
value is what counts (`Condition.value`), not only its truthiness.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["RECORD_FIELDS", "Condition", "ConditionError", "parse_condition", "parse_expression",
           "parse_filter"]

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<number>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
    | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
    | (?P<name>[A-Za-z_][A-Za-z0-9_.\-]*(?:\[\d+\][A-Za-z0-9_.\-\[\]]*)*)
    )""", re.VERBOSE)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
# Limits that keep parsing and evaluation bounded whatever a record holds (a condition of
# 300 nested parentheses once crashed every scheduler with RecursionError).
MAX_TOKENS = 256
MAX_DEPTH = 32
_COMPARISONS = {"==", "!=", "<", "<=", ">", ">=", "in", "not in"}


class ConditionError(ValueError):
    """The condition does not parse; the message says where."""


@dataclass(frozen=True, slots=True)
class Path:
    job_id: str  # an upstream job, or a root (parse_expression)
    field: str | None  # "result" or "status"; None: the root itself
    keys: tuple[str | int, ...]


Node = tuple[Any, ...]


@dataclass(frozen=True)
class Condition:
    source: str
    tree: Node
    upstreams: frozenset[str]

    def evaluate(self, upstream: Mapping[str, Mapping[str, Any]]) -> bool:
        """`upstream[job_id]` holds that job's `status` and `result` in the run."""
        return _truthy(_eval(self.tree, upstream))

    def matches(self, record: Mapping[str, Any]) -> bool:
        """An event trigger's filter (`parse_filter`) over one Kafka record: `record` holds
        its RECORD_FIELDS (`value` parsed as JSON when it parses, else its text)."""
        return _truthy(_eval(self.tree, {"": record}))

    def value(self, scope: Mapping[str, Any]) -> Any:
        """The expression's value with each root of `parse_expression` bound in `scope`."""
        return _eval(self.tree, scope)

    def operands(self, upstream: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, Any]]:
        """Each path the condition reads and its value in `upstream` (to show why it held)."""
        found: list[tuple[str, Any]] = []

        def walk(node: Node) -> None:
            if node[0] == "path":
                path: Path = node[1]
                text = ".".join([path.job_id, *([path.field] if path.field else []),
                                 *(str(k) for k in path.keys)])
                if all(text != seen for seen, _ in found):
                    found.append((text, _eval(node, upstream)))
            elif node[0] != "lit":
                for child in node[1:]:
                    if isinstance(child, tuple):
                        walk(child)

        walk(self.tree)
        return found


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out: list[tuple[str, str, int]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ConditionError(f"unexpected character {text[pos:].lstrip()[:1]!r} at "
                                 f"position {pos + len(text[pos:]) - len(text[pos:].lstrip())}")
        kind = match.lastgroup or ""
        value, start = match.group(kind), match.start(kind)
        if kind == "name" and value in _KEYWORDS:
            kind = "keyword"
        out.append((kind, value, start))
        if len(out) > MAX_TOKENS:
            raise ConditionError(f"more than {MAX_TOKENS} tokens; split the logic into "
                                 "upstream results instead")
        pos = match.end()
    return out


class _Parser:
    def __init__(self, text: str, upstreams: Sequence[str], record: bool = False,
                 roots: Sequence[str] = ()) -> None:
        self.text = text
        self.record = record
        self.roots = tuple(roots)
        self.tokens = _tokens(text)
        self.i = 0
        self.upstreams = sorted(upstreams, key=len, reverse=True)
        self.used: set[str] = set()
        self.depth = 0

    def deeper(self, position: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ConditionError(f"nests deeper than {MAX_DEPTH} levels at position {position}")

    def peek(self, offset: int = 0) -> tuple[str, str, int] | None:
        j = self.i + offset
        return self.tokens[j] if j < len(self.tokens) else None

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        token = self.peek()
        if token is None:
            raise ConditionError(f"unexpected end of condition{f', expected {value!r}' if value else ''}")
        if value is not None and token[1] != value:
            raise ConditionError(f"expected {value!r} at position {token[2]}, found {token[1]!r}")
        self.i += 1
        return token

    def parse(self) -> Node:
        if not self.tokens:
            raise ConditionError("empty condition")
        tree = self.expr()
        if self.peek() is not None:
            token = self.peek()
            assert token is not None
            raise ConditionError(f"unexpected {token[1]!r} at position {token[2]}")
        return tree

    def expr(self) -> Node:
        node = self.and_expr()
        while (t := self.peek()) and t[1] == "or":
            self.take()
            node = ("or", node, self.and_expr())
        return node

    def and_expr(self) -> Node:
        node = self.not_expr()
        while (t := self.peek()) and t[1] == "and":
            self.take()
            node = ("and", node, self.not_expr())
        return node

    def not_expr(self) -> Node:
        t = self.peek()
        if t and t[1] == "not" and not (self.peek(1) and self.peek(1)[1] == "in"):  # type: ignore[index]
            self.take()
            self.deeper(t[2])
            node = ("not", self.not_expr())
            self.depth -= 1
            return node
        return self.comparison()

    def comparison(self) -> Node:
        left = self.operand()
        t = self.peek()
        if t is None:
            return left
        op = t[1]
        if op == "not" and self.peek(1) and self.peek(1)[1] == "in":  # type: ignore[index]
            self.take()
            self.take()
            return ("cmp", "not in", left, self.operand())
        if op in _COMPARISONS:
            self.take()
            return ("cmp", op, left, self.operand())
        return left

    def operand(self) -> Node:
        kind, value, position = self.take()
        if value == "(":
            self.deeper(position)
            node = self.expr()
            self.take(")")
            self.depth -= 1
            return node
        if value == "[":
            items: list[Any] = []
            if self.peek() and self.peek()[1] != "]":  # type: ignore[index]
                items.append(self.literal())
                while self.peek() and self.peek()[1] == ",":  # type: ignore[index]
                    self.take()
                    items.append(self.literal())
            self.take("]")
            return ("lit", items)
        if kind in ("number", "string") or (kind == "keyword" and value in ("true", "false", "null")):
            self.i -= 1
            return ("lit", self.literal())
        if kind == "name":
            return ("path", self.path(value, position))
        raise ConditionError(f"unexpected {value!r} at position {position}")

    def literal(self) -> Any:
        kind, value, position = self.take()
        if kind == "number":
            return float(value) if any(c in value for c in ".eE") else int(value)
        if kind == "string":
            return bytes(value[1:-1], "utf-8").decode("unicode_escape")
        if value == "true":
            return True
        if value == "false":
            return False
        if value == "null":
            return None
        raise ConditionError(f"expected a literal at position {position}, found {value!r}")

    def path(self, text: str, position: int) -> Path:
        if self.record:
            return self.record_path(text, position)
        if self.roots:
            return self.rooted(text, position)
        for job_id in self.upstreams:
            if text.startswith(job_id + "."):
                rest = text[len(job_id) + 1:]
                break
        else:
            known = ", ".join(sorted(self.upstreams)) or "none"
            raise ConditionError(f"{text!r} at position {position} does not start with an upstream "
                                 f"job id followed by .result or .status (upstreams: {known})")
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", rest)
        if not parts or parts[0] not in ("result", "status"):
            raise ConditionError(f"{text!r} at position {position}: after {job_id!r} comes "
                                 f".result or .status")
        if parts[0] == "status" and len(parts) > 1:
            raise ConditionError(f"{text!r} at position {position}: status has no fields")
        keys: tuple[str | int, ...] = tuple(
            int(p[1:-1]) if p.startswith("[") else p for p in parts[1:])
        self.used.add(job_id)
        return Path(job_id, parts[0], keys)

    def record_path(self, text: str, position: int) -> Path:
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", text)
        root = parts[0] if parts else text
        if root not in RECORD_FIELDS:
            raise ConditionError(f"{text!r} at position {position}: a filter reads "
                                 f"{', '.join(RECORD_FIELDS)} of the record")
        if len(parts) > 1 and root not in ("value", "headers"):
            raise ConditionError(f"{text!r} at position {position}: {root} has no fields")
        keys: tuple[str | int, ...] = tuple(
            int(p[1:-1]) if p.startswith("[") else p for p in parts[1:])
        return Path("", root, keys)

    def rooted(self, text: str, position: int) -> Path:
        root = next((r for r in self.roots if text == r or text.startswith((r + ".", r + "["))), None)
        if root is None:
            raise ConditionError(f"{text!r} at position {position} does not start with "
                                 + " or ".join(repr(r) for r in self.roots))
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", text[len(root):])
        keys: tuple[str | int, ...] = tuple(
            int(p[1:-1]) if p.startswith("[") else p for p in parts)
        self.used.add(root)
        return Path(root, None, keys)


# What an event trigger's filter reads of a Kafka record (docs/reference/semantics.md#event-triggers):
# `timestamp` is epoch milliseconds, `headers` an object of text values.
RECORD_FIELDS = ("key", "value", "headers", "topic", "partition", "offset", "timestamp")


def parse_filter(text: str) -> Condition:
    """An event trigger's filter: the same language, whose paths start at a field of the
    record (`value.status == "COMPLETED"`, `headers.source == "billing"`, `partition < 3`)
    instead of an upstream job; evaluated with `Condition.matches`."""
    parser = _Parser(text, (), record=True)
    return Condition(text, parser.parse(), frozenset())


def parse_condition(text: str, upstreams: Sequence[str]) -> Condition:
    parser = _Parser(text, upstreams)
    tree = parser.parse()
    return Condition(text, tree, frozenset(parser.used))


def parse_expression(text: str, roots: Sequence[str]) -> Condition:
    """An expression whose paths start with one of `roots` (`params.customer`,
    `params.tier == "gold"`), evaluated by `Condition.value`."""
    parser = _Parser(text, (), roots=roots)
    tree = parser.parse()
    return Condition(text, tree, frozenset(parser.used))


def _eval(node: Node, upstream: Mapping[str, Any]) -> Any:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "path":
        path: Path = node[1]
        value: Any = upstream.get(path.job_id)
        if path.field is not None:
            value = (value or {}).get(path.field)
        for key in path.keys:
            if isinstance(key, int) and isinstance(value, list) and -len(value) <= key < len(value):
                value = value[key]
            elif isinstance(key, str) and isinstance(value, dict):
                value = value.get(key)
            else:
                return None
        return value
    if kind == "not":
        return not _truthy(_eval(node[1], upstream))
    if kind == "and":
        return _truthy(_eval(node[1], upstream)) and _truthy(_eval(node[2], upstream))
    if kind == "or":
        return _truthy(_eval(node[1], upstream)) or _truthy(_eval(node[2], upstream))
    _, op, left_node, right_node = node
    left, right = _eval(left_node, upstream), _eval(right_node, upstream)
    return _compare(op, left, right)


def _compare(op: str, left: Any, right: Any) -> bool:
    if op in ("in", "not in"):
        try:
            found = left in right if isinstance(right, list | str | dict) else False
        except TypeError:
            found = False
        return found if op == "in" else not found
    if op == "==":
        return bool(_same_kind(left, right) and left == right)
    if op == "!=":
        return not (_same_kind(left, right) and left == right)
    if not _same_kind(left, right) or left is None:
        return False
    try:
        return bool({"<": left < right, "<=": left <= right, ">": left > right,
                     ">=": left >= right}[op])
    except TypeError:
        return False


def _same_kind(a: Any, b: Any) -> bool:
    numbers = (int, float)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return True
    return type(a) is type(b)


def _truthy(value: Any) -> bool:
    return bool(value)
