"""deploy/grafana and deploy/prometheus: the dashboards are what the generator makes and
refer only to what is provisioned; every PromQL expression parses with promtool; the
alerting rules pass `promtool check rules` and their unit tests."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml

from deploy.grafana import generate
from tests import promql

GRAFANA = Path(generate.__file__).resolve().parent


def test_the_dashboard_files_are_what_the_generator_makes() -> None:
    for path, text in generate.files().items():
        assert path.read_text() == text, f"{path.name} is stale: run `make dashboards`"
    assert {p.name for p in (GRAFANA / "dashboards").glob("*.json")} == {p.name for p in generate.files()}


def test_dashboards_use_only_the_provisioned_datasources_and_their_own_variables() -> None:
    provisioned = yaml.safe_load((GRAFANA / "provisioning/datasources/cronstream.yaml").read_text())
    uids = {d["uid"]: d["type"] for d in provisioned["datasources"]}
    assert uids == {"cronstream-postgres": "grafana-postgresql-datasource",
                    "cronstream-prometheus": "prometheus"}
    seen_uids = set()
    for path in generate.files():
        board = json.loads(path.read_text())
        assert board["uid"] not in seen_uids
        seen_uids.add(board["uid"])
        defined = {v["name"] for v in board["templating"]["list"]}
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24
            for target in [panel, *panel["targets"]]:
                assert uids[target["datasource"]["uid"]] == target["datasource"]["type"]
            text = json.dumps(panel["targets"]) + panel["title"]
            used = set(re.findall(r"\$\{?(\w+)", text)) - {"__timeFilter", "__timeGroupAlias",
                                                            "__interval", "__rate_interval"}
            assert used <= defined, f"{board['uid']} / {panel['title']}: undefined {used - defined}"


def test_every_sql_panel_names_a_block_and_every_block_is_used() -> None:
    blocks = generate.sql_blocks()
    used = {p.query for _, p in generate.sql_panels()}
    used |= {v["query"] for d in generate.DASHBOARDS for v in d.variables}
    assert used == set(blocks)


def test_the_overview_covers_what_the_issue_lists() -> None:
    titles = " ".join(p.title.lower() for p in generate.OVERVIEW.panels)
    for topic in ("fires", "executions", "success rate", "p50", "start lag", "queue depth",
                  "consumer lag", "workers", "utilisation", "dead letters", "alerts firing"):
        assert topic in titles, topic


def test_metric_names_are_found_in_promql() -> None:
    expr = ('sum by (service, topic) (increase(cronstream_dead_letters_total{topic=~"a|b"}[5m])) > 0 '
            'and on (instance) group_left (service) up offset 5m / '
            'histogram_quantile(0.99, sum by (le) (rate(x_bucket[1m])))')
    assert promql.metric_names(expr) == {"cronstream_dead_letters_total", "up", "x_bucket"}


def test_every_promql_expression_parses(tmp_path: Path) -> None:
    exprs = promql.all_exprs()
    assert len(exprs) > 30
    result = promql.check_parses(exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = promql.check_parses([("broken", "sum(rate(cronstream_executions_total[5m])")], tmp_path)
    assert broken.returncode != 0  # promtool does reject what does not parse


def test_the_alerting_rules_pass_promtool_check_and_unit_tests() -> None:
    check = subprocess.run([promql.promtool(), "check", "rules", str(promql.RULES)],
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([promql.promtool(), "test", "rules", promql.RULE_TESTS.name],
                           cwd=promql.RULE_TESTS.parent, capture_output=True, text=True, timeout=120,
                           check=False)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "SUCCESS" in tests.stdout
