"""The Grafana dashboard (deploy/grafana/longroute-gateway.json): its shape, and that every
metric its queries name is in the ``/metrics`` of a running gateway.

The gateway runs in process over loopback with fake backends (``tests/test_gateway.py``):
one that answers and scrapes as vLLM, one that answers 503 so that failovers are
counted, and a few streamed, non-streamed and failing requests, so that every
labelled series exists. Renaming a metric in ``gateway/metrics.py`` fails this test
until the dashboard follows.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from test_gateway import FakeBackend, Knobs, async_test, eventually, running_fleet
from test_gateway_ops import VLLM_METRICS

DASHBOARD_PATH = (
    Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "longroute-gateway.json"
)
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ROWS = ["Traffic", "Latency", "Tokens", "Load", "Health", "Router"]
# a metric name in PromQL: an identifier not glued to a longer one
METRIC_NAME = re.compile(r"(?<![A-Za-z0-9_:])longroute_[A-Za-z0-9_:]*")
BY_CLAUSE = re.compile(r"\bby\s*\(([^)]*)\)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# what the issue asks the dashboard to show, by the names its queries use
REQUIRED = {
    "longroute_requests_total",
    "longroute_errors_total",
    "longroute_failovers_total",
    "longroute_ttft_seconds_bucket",
    "longroute_e2e_seconds_bucket",
    "longroute_prompt_tokens_total",
    "longroute_cached_prompt_tokens_total",
    "longroute_completion_tokens_total",
    "longroute_queue_depth",
    "longroute_backend_inflight_requests",
    "longroute_backend_inflight_tokens",
    "longroute_engine_num_waiting",
    "longroute_engine_num_running",
    "longroute_engine_kv_usage",
    "longroute_backend_healthy",
    "longroute_backend_rtt_ms",
    "longroute_routing_decision_seconds_bucket",
    "longroute_prefix_index_blocks",
}


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD_PATH.read_text())


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel: the top level's and those nested in (collapsed) rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query template variable."""
    found = [
        (f"panel {panel['title']!r} target {target.get('refId')}", target.get("expr", ""))
        for panel in all_panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        found.append((f"variable {variable['name']!r}", text))
        if variable.get("definition"):
            found.append((f"variable {variable['name']!r} definition", variable["definition"]))
    return found


def queried_metrics(dashboard: dict[str, Any]) -> dict[str, list[str]]:
    """Each metric name the queries use, with where."""
    names: dict[str, list[str]] = {}
    for where, expr in queries(dashboard):
        for name in METRIC_NAME.findall(expr):
            names.setdefault(name, []).append(where)
    return names


def exposition_problem(name: str, samples: set[str], types: dict[str, str]) -> str | None:
    """Why ``name`` (as a query uses it) is not a series the exposition has, or None:
    a histogram's ``_bucket``/``_sum``/``_count``, a counter's ``_total``, else a gauge,
    each a sample name of a family of that type."""
    if name not in samples:
        return "no such sample in /metrics"
    for suffix, kind in [*((s, "histogram") for s in HISTOGRAM_SUFFIXES), ("_total", "counter")]:
        family = name.removesuffix(suffix)
        if family != name and types.get(family) == kind:
            return None
    if types.get(name) in ("gauge", "untyped", "unknown"):
        return None
    return f"a sample of a family of type {types.get(name)!r}, not a gauge, counter or histogram"


def balanced(expr: str) -> bool:
    """Whether the brackets of ``expr`` pair up outside its quoted strings."""
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for part in re.split(r'"(?:[^"\\]|\\.)*"', expr):
        for char in part:
            if char in "([{":
                stack.append(char)
            elif char in closing and (not stack or stack.pop() != closing[char]):
                return False
    return not stack


# ---- shape ----------------------------------------------------------------------------------


def test_dashboard_is_a_grafana_dashboard_model() -> None:
    dashboard = load_dashboard()
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] == "longroute-gateway" and dashboard["title"]
    panels = list(all_panels(dashboard))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        title = panel.get("title")
        assert isinstance(title, str) and title.strip(), panel
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h")), title
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, title
        if panel["type"] == "row":
            assert not panel.get("targets"), title
            continue
        assert panel["datasource"] == DATASOURCE, title
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        targets = panel["targets"]
        assert targets, f"{title}: no queries"
        ref_ids = [target["refId"] for target in targets]
        assert len(ref_ids) == len(set(ref_ids)), title
        for target in targets:
            assert target["datasource"] == DATASOURCE, title
            expr = target["expr"]
            assert expr.strip(), f"{title}: empty expr"
            assert balanced(expr), f"{title}: unbalanced brackets in {expr}"
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == ROWS
    for row in (p for p in dashboard["panels"] if p["type"] == "row" and p["collapsed"]):
        assert row["panels"], f"collapsed row {row['title']!r} holds no panels"


def test_template_variables_select_datasource_model_and_endpoint() -> None:
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert {"datasource", "model", "endpoint"} <= variables.keys()
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for label in ("model", "endpoint"):
        variable = variables[label]
        assert variable["type"] == "query" and variable["datasource"] == DATASOURCE
        assert re.fullmatch(
            rf"label_values\(longroute_\w+(\{{[^}}]*\}})?, {label}\)", variable["definition"]
        )
        assert variable["query"]["query"] == variable["definition"]
        # "All" must also match series whose label is empty (unknown model, no backend)
        assert variable["includeAll"] and variable["multi"] and variable["allValue"] == ".*"


def test_latency_panels_split_by_model_and_endpoint() -> None:
    latency = [
        panel
        for panel in all_panels(load_dashboard())
        if any(
            m in target["expr"]
            for target in panel.get("targets", [])
            for m in ("longroute_ttft_seconds", "longroute_e2e_seconds")
        )
    ]
    assert len(latency) >= 3  # TTFT and E2E quantiles, their means
    quantiles: dict[str, set[str]] = {}
    for panel in latency:
        assert panel["fieldConfig"]["defaults"]["unit"] == "s"
        for target in panel["targets"]:
            expr = target["expr"]
            assert '{model=~"$model", endpoint=~"$endpoint"}' in expr, expr
            clauses = [set(map(str.strip, c.split(","))) for c in BY_CLAUSE.findall(expr)]
            assert clauses and all({"model", "endpoint"} <= c for c in clauses), expr
            if match := re.match(r"histogram_quantile\((0\.\d+),", expr):
                assert all("le" in c for c in clauses) and "_bucket{" in expr, expr
                metric = METRIC_NAME.findall(expr)[0]
                quantiles.setdefault(metric, set()).add(match.group(1))
    assert quantiles == {
        "longroute_ttft_seconds_bucket": {"0.5", "0.95", "0.99"},
        "longroute_e2e_seconds_bucket": {"0.5", "0.95", "0.99"},
    }


def test_dashboard_shows_what_the_issue_asks() -> None:
    missing = REQUIRED - queried_metrics(load_dashboard()).keys()
    assert not missing, f"the dashboard queries none of {sorted(missing)}"


def test_query_helpers() -> None:
    expr = (
        'histogram_quantile(0.5, sum by (le) (rate(longroute_e2e_seconds_bucket{x="a"}[5m])))'
        " / on() group_left sum(notlongroute_x) + longroute_queue_depth"
    )
    assert METRIC_NAME.findall(expr) == ["longroute_e2e_seconds_bucket", "longroute_queue_depth"]
    assert balanced(expr) and balanced('x{a=")"}') and not balanced("sum(rate(x[5m])")
    samples = {"longroute_e2e_seconds_bucket", "longroute_requests_total", "longroute_queue_depth"}
    types = {
        "longroute_e2e_seconds": "histogram",
        "longroute_requests": "counter",
        "longroute_queue_depth": "gauge",
    }
    assert [exposition_problem(n, samples, types) for n in sorted(samples)] == [None] * 3
    assert exposition_problem("longroute_e2e_seconds", samples, types) is not None
    assert exposition_problem("longroute_requests", samples, types) is not None


# ---- against a running gateway ----------------------------------------------------------------


@async_test
async def test_every_queried_metric_is_in_a_running_gateways_metrics() -> None:
    a = FakeBackend("a", Knobs(metrics_text=VLLM_METRICS))
    b = FakeBackend("b", Knobs(status=503))  # healthy to its checks; its answers fail over
    async with running_fleet(a, b, scrape_interval_s=0.05, rtt_probe_interval_s=0.05) as fleet:
        view = fleet.gateway.fleet
        await eventually(lambda: view.state("a").engine_num_waiting is not None)
        for stream in (False, True, False, True):  # round robin: a, b (fails over to a), ...
            status, _, _ = await fleet.chat(stream=stream)
            assert status == 200
        status, _, _ = await fleet.chat(model="nope")
        assert status == 404
        failovers = await fleet.metric("longroute_failovers_total", reason="backend_5xx")
        async with fleet.http.get(fleet.url + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
    assert failovers >= 1
    families = list(text_string_to_metric_families(text))
    samples = {sample.name for family in families for sample in family.samples}
    types = {family.name: family.type for family in families}
    queried = queried_metrics(load_dashboard())
    assert queried
    problems = {
        name: f"{problem} (used in {', '.join(where)})"
        for name, where in sorted(queried.items())
        if (problem := exposition_problem(name, samples, types)) is not None
    }
    exported = sorted(n for n in samples if n.startswith("longroute_"))
    assert not problems, f"{json.dumps(problems, indent=1)}\n/metrics has: {exported}"
