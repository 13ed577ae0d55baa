"""deploy/monitoring: the dashboard and the alert rules name only metrics that exist.

A renamed metric does not break a dashboard loudly: its panels just go blank, and an alert on it
never fires again. So every PromQL expression in ``grafana-dashboard.json`` and ``rules.yml`` is
checked against the names the daemon exports (read from its own registry, so a rename in
``adapters/telemetry.py`` fails here) plus Triton's own ``nv_gpu_*`` metrics.

Pure Python: nothing here starts Prometheus or runs promtool. ``make monitoring-check`` runs
``promtool check rules`` and ``promtool test rules`` (what each alert does over time), before
pytest in ``make test``; a copy here would either skip where promtool is missing, or make every
plain ``pytest`` run need it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.adapters.telemetry import PrometheusTelemetry

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"

EXPORTED_BY_CONTROLPLANE = frozenset(
    {
        "controlplane_build_info",
        "controlplane_operations_total",
        "controlplane_operation_duration_seconds_bucket",
        "controlplane_operation_duration_seconds_sum",
        "controlplane_operation_duration_seconds_count",
        "controlplane_step_duration_seconds_bucket",
        "controlplane_step_duration_seconds_sum",
        "controlplane_step_duration_seconds_count",
        "controlplane_downloaded_bytes_total",
        "controlplane_active_release_info",
        "controlplane_slot_state",
        "controlplane_model_serving_desired_release",
        "controlplane_model_cpu_only",
        "controlplane_release_degraded",
        "controlplane_model_out_of_rotation",
        "controlplane_rollbacks_total",
        "controlplane_rollback_triggers_suppressed_total",
        "controlplane_overload_verdict",
        "controlplane_gpu_utilization_ratio",
        "controlplane_alerts_received_total",
        "controlplane_triton_up",
        "controlplane_triton_memory_growth_bytes",
        "controlplane_triton_resident_memory_bytes",
        "controlplane_host_memory_total_bytes",
        "controlplane_residue_findings_total",
        "controlplane_job_restarts_total",
        "controlplane_fleet_stale",
        "controlplane_fleet_member_name_conflict",
        "controlplane_fleet_members",
        "controlplane_fleet_model_converged",
        "controlplane_fleet_model_generation",
        "controlplane_fleet_rollout_paused",
    }
)
# Triton's own, from its metrics endpoint (port 8002).
EXPORTED_BY_TRITON = frozenset(
    {"nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes"}
)
# Prometheus's own, one per scrape target.
EXPORTED_BY_PROMETHEUS = frozenset({"up"})
ALLOWED = EXPORTED_BY_CONTROLPLANE | EXPORTED_BY_TRITON | EXPORTED_BY_PROMETHEUS

ALERTS = frozenset(
    {
        "GpuOverload",
        "ControlplaneDown",
        "ControlplaneAbsent",
        "ControlplaneJobRestarting",
        "ControlplaneDeployFailed",
        "ControlplaneModelNotServingDesiredRelease",
        "ControlplaneModelOnCpuOnly",
        "ControlplaneMemoryNotReturned",
        "ControlplaneFleetNotConverged",
        "ControlplaneRolloutPaused",
        "ControlplaneFleetMemberStale",
        "ControlplaneFleetMemberNameConflict",
        "ControlplaneTritonMemoryGrowth",
        "ControlplaneTritonHighMemory",
        "ControlplaneRollbackFailed",
        "ControlplaneTritonDown",
        "ControlplaneResidueAfterUnload",
    }
)
# Every selector of every panel matches the daemons (and the Tritons beside them) on the hosts
# the instance variable picked: the variable's values are hosts, the instance label host:port.
INSTANCE_MATCHER = 'instance=~"${instance}:[0-9]+"'
# The fleet row: members alive or stale, convergence and generation per model, name conflicts.
FLEET_ROW_METRICS = frozenset(
    {
        "controlplane_fleet_members",
        "controlplane_fleet_stale",
        "controlplane_fleet_model_converged",
        "controlplane_fleet_model_generation",
        "controlplane_fleet_member_name_conflict",
        "controlplane_model_serving_desired_release",
    }
)

# --- metric names in PromQL ------------------------------------------------------------------

# Removed before looking for names, in this order: string literals (label values, regexes),
# Grafana variables, label matchers {...}, ranges [...], label lists of by/without/on/ignoring/
# group_left/group_right, then numbers and durations (1e9, 0.95, 10m).
_STRIPPED = [
    re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'),
    re.compile(r"\$\{[^}]*\}|\$\w+"),
    re.compile(r"\{[^}]*\}"),
    re.compile(r"\[[^\]]*\]"),
    re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"),
    re.compile(r"\b\d[\w.]*"),
]
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
# Words that are not metric names even when no "(" follows them.
_KEYWORDS = frozenset(
    {
        "by", "without", "on", "ignoring", "group_left", "group_right",
        "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan",
        "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar",
        "topk", "bottomk", "quantile", "count_values",
    }
)  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects; a name followed by "(" is a function."""
    text = expr
    for pattern in _STRIPPED:
        text = pattern.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        if text[match.end() :].lstrip().startswith("("):
            continue
        if match.group().lower() not in _KEYWORDS:
            names.add(match.group())
    return names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        (
            'histogram_quantile(0.99, sum by (le, step) (rate(a_bucket{step="load"}[5m])))',
            {"a_bucket"},
        ),
        ("sum by (kind) (increase(a_total[$__rate_interval]))", {"a_total"}),
        ("a_bytes / b_bytes > 0.7", {"a_bytes", "b_bytes"}),
        ('x{o="failed"} > 0 unless x{o="failed"} offset 10m', {"x"}),
        ('count(y{m=~"$model", state=~"A|B"} == 1) or vector(0)', {"y"}),
        ("avg_over_time(nv_gpu_utilization[10s]) > 0.95", {"nv_gpu_utilization"}),
        ("a * on (instance) group_left (model) b", {"a", "b"}),
        ("sum without (gpu_uuid) (c) > 1e9", {"c"}),
    ],
)
def test_metric_names_skip_functions_keywords_labels_and_numbers(
    expr: str, names: set[str]
) -> None:
    assert metric_names(expr) == names


def selectors(expr: str) -> list[tuple[str, str]]:
    """Each place a metric is selected: its name and its matchers ("" when it has none)."""
    found = []
    for name in sorted(metric_names(expr)):
        # Matchers run to the first "}" that does not close a Grafana ${variable}.
        selection = rf'(?<![\w"]){re.escape(name)}(?![\w(])(\{{(?:\$\{{[^}}]*\}}|[^}}])*\}})?'
        for match in re.finditer(selection, expr):
            found.append((name, (match.group(1) or "")[1:-1]))
    return found


def test_selectors_give_each_selection_with_its_matchers() -> None:
    assert selectors('sum(rate(a_total{x="1", i=~"${v}:1"}[5m])) / b + a_total') == [
        ("a_total", 'x="1", i=~"${v}:1"'),
        ("a_total", ""),
        ("b", ""),
    ]


# --- what the daemon exports -----------------------------------------------------------------


def exported_names(telemetry: PrometheusTelemetry) -> set[str]:
    """Sample names as Prometheus sees them, whether or not a labelled child exists yet."""
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "info": ("_info",),
        "gauge": ("",),
    }
    return {
        family.name + suffix
        for family in telemetry.registry.collect()
        for suffix in suffixes.get(family.type, ("",))
    }


@pytest.fixture
def telemetry() -> PrometheusTelemetry:
    return PrometheusTelemetry()


def test_the_allowed_controlplane_metrics_are_the_ones_the_daemon_exports(
    telemetry: PrometheusTelemetry,
) -> None:
    exported = exported_names(telemetry)
    missing = EXPORTED_BY_CONTROLPLANE - exported
    assert not missing, (
        f"deploy/monitoring uses {sorted(missing)}, which the daemon no longer exports: "
        "update the dashboard, the rules and this list together"
    )


# --- the dashboard ---------------------------------------------------------------------------


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return dashboard


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, the ones inside collapsed rows included."""
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels", []))


def dashboard_exprs() -> list[tuple[int, str]]:
    return [
        (panel["id"], target["expr"])
        for panel in all_panels(load_dashboard()["panels"])
        for target in panel.get("targets", [])
    ]


def test_every_panel_has_a_unique_id_a_place_and_a_query() -> None:
    panels = list(all_panels(load_dashboard()["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(ids)}"
    for panel in panels:
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys(), panel["id"]
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"panel {panel['id']} {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["expr"].strip(), f"panel {panel['id']} has an empty query"


@pytest.mark.parametrize(("panel_id", "expr"), dashboard_exprs())
def test_dashboard_queries_name_only_known_metrics(panel_id: int, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"panel {panel_id}: no metric found in {expr!r}"
    assert names <= ALLOWED, f"panel {panel_id}: unknown {sorted(names - ALLOWED)} in {expr!r}"


def test_the_dashboard_has_the_model_variable_and_no_fixed_datasource() -> None:
    dashboard = load_dashboard()
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    model = variables["model"]
    assert model["query"]["query"] == (
        f"label_values(controlplane_active_release_info{{{INSTANCE_MATCHER}}}, model)"
    )
    assert variables["datasource"]["type"] == "datasource"
    # A uid pasted from one Grafana would leave every panel empty in another.
    for panel in all_panels(dashboard["panels"]):
        for holder in [panel, *panel.get("targets", [])]:
            if "datasource" in holder:
                assert holder["datasource"]["uid"] == "${datasource}", panel["id"]


def test_the_instance_variable_lists_the_daemons_hosts_and_every_query_filters_on_it() -> None:
    dashboard = load_dashboard()
    names = [variable["name"] for variable in dashboard["templating"]["list"]]
    # Before the model variable, whose values it narrows.
    assert names.index("datasource") < names.index("instance") < names.index("model")
    instance = dashboard["templating"]["list"][names.index("instance")]
    assert instance["query"]["query"] == "label_values(controlplane_build_info, instance)"
    assert (instance["multi"], instance["includeAll"], instance["allValue"]) == (True, True, ".*")
    # Grafana keeps the regex's first group: the host of host:port.
    host = re.compile(instance["regex"].strip("/"))
    assert [host.sub(r"\1", i) for i in ("10.0.0.5:8080", "[::1]:8080")] == ["10.0.0.5", "[::1]"]
    for panel_id, expr in dashboard_exprs():
        for name, matchers in selectors(expr):
            assert INSTANCE_MATCHER in matchers, f"panel {panel_id}: {name} not on $instance"


def rows(dashboard: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each row's title and the panels below it, down to the next row."""
    found: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] = []
    for panel in sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        if panel["type"] == "row":
            current = found.setdefault(panel["title"], [])
            current.extend(panel.get("panels", []))  # a collapsed row holds its own
        else:
            current.append(panel)
    return found


def test_the_fleet_row_shows_members_convergence_generation_and_name_conflicts() -> None:
    fleet = rows(load_dashboard())["Fleet"]
    shown = {
        name
        for panel in fleet
        for target in panel["targets"]
        for name in metric_names(target["expr"])
    }
    assert shown >= FLEET_ROW_METRICS, f"the Fleet row lacks {sorted(FLEET_ROW_METRICS - shown)}"
    members = next(p for p in fleet if "controlplane_fleet_members" in json.dumps(p["targets"]))
    assert "by (state)" in members["targets"][0]["expr"]  # alive, stale, down apart
    assert all(600 < panel["id"] < 700 for panel in fleet)  # the row's ids: 600, 601, ...


def test_no_two_panels_overlap() -> None:
    taken: dict[tuple[int, int], int] = {}
    for panel in all_panels(load_dashboard()["panels"]):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["id"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = taken.setdefault((x, y), panel["id"])
                assert other == panel["id"], f"panels {other} and {panel['id']} overlap at {x},{y}"


# --- the rules -------------------------------------------------------------------------------


def load_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((MONITORING / "rules.yml").read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_rules_name_only_known_metrics() -> None:
    for rule in load_rules():
        names = metric_names(rule["expr"])
        label = rule.get("alert") or rule.get("record")
        assert names, f"{label}: no metric found in {rule['expr']!r}"
        assert names <= ALLOWED, f"{label}: unknown {sorted(names - ALLOWED)}"


def test_every_alert_says_how_bad_what_is_wrong_and_what_to_do() -> None:
    alerts = [rule for rule in load_rules() if "alert" in rule]
    assert {rule["alert"] for rule in alerts} == ALERTS
    for rule in alerts:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert "controlplane status" in rule["annotations"]["description"], rule["alert"]


def test_the_promtool_tests_cover_every_alert_with_known_series() -> None:
    document = yaml.safe_load((MONITORING / "rules_test.yml").read_text())
    assert document["rule_files"] == ["rules.yml"]
    tested = {case["alertname"] for group in document["tests"] for case in group["alert_rule_test"]}
    assert tested == ALERTS
    for group in document["tests"]:
        for series in group["input_series"]:
            assert metric_names(series["series"]) <= ALLOWED, series["series"]
