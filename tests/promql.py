"""PromQL helpers for the tests of deploy/: the expressions of the dashboards and rules,
the metric names they use, and promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from deploy.grafana import generate

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "cronstream-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "cronstream-rules.test.yaml"
# What Grafana substitutes before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "6h"}

_STRINGS = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
             "group_left", "group_right", "inf", "nan", "e"}


def find_promtool() -> str | None:
    """The promtool `make promtool` put in the virtualenv, else one on PATH."""
    found = ROOT / ".venv" / "bin" / "promtool"
    return str(found) if found.exists() else shutil.which("promtool")


def promtool() -> str:
    path = find_promtool()
    assert path, "promtool is missing: `make promtool` fetches it"
    return path


def grafana_expanded(expr: str) -> str:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not functions, labels or keywords)."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return {m for m in _IDENT.findall(text) if m.lower() not in _KEYWORDS}


def rule_exprs() -> list[tuple[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [(f"rule {r['alert']}", r["expr"]) for g in groups for r in g["rules"]]


def all_exprs() -> list[tuple[str, str]]:
    return [(where, grafana_expanded(e)) for where, e in generate.prom_exprs()] + rule_exprs()


def check_parses(exprs: list[tuple[str, str]], workdir: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on a rules file holding each expression as a recording rule:
    promtool parses every expression and names the one that does not."""
    rules = [{"record": f"cronstream:check_{i}", "expr": expr} for i, (_, expr) in enumerate(exprs)]
    path = workdir / "expressions.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "expressions", "rules": rules}]}))
    return subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
