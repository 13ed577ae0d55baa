"""``GET /metrics`` as Prometheus reads it: parsed with prometheus_client's own parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from controlplane.adapters.triton.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory, serving_r2
from tests.integration.test_alert_webhook import notification
from tests.support.daemon import Daemon
from tests.support.gpu_exporter import GpuExporter
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

TOKEN = "metrics-test-token"


def scrape(daemon: Daemon) -> dict[str, tuple[str, list[Sample]]]:
    """Family name -> (type, samples)."""
    response = daemon.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        family.name: (family.type, list(family.samples))
        for family in text_string_to_metric_families(response.text)
    }


def value(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and labels.items() <= s.labels.items()]
    assert found, f"no {name} with {labels} in {samples}"
    return sum(found)


def test_metrics_name_what_the_daemon_did_and_what_serves(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    with GpuExporter() as exporter:
        exporter.set(gpu0=0.40)
        config = (
            f"rollback:\n  metrics_url: {exporter.url}\n"
            f"models:\n  {model_name}:\n    retire_after_seconds: 600\n"
        )
        daemon = serving_r2(daemons, store, model_name, config=config, token=TOKEN)
        reload = daemon.http.post(
            "/api/v1/model/reload", params={"target": "fallback", "model": model_name}
        )
        assert reload.status_code == 200, reload.text
        daemon.post("/v1/alerts", notification(model="not-served-here"))
        daemon.post("/v1/alerts", notification(model="not-served-here"))
        eventually(lambda: _verdict(daemon) == "healthy", 15, "the watcher's first healthy verdict")
        families = scrape(daemon)

    types = {name: kind for name, (kind, _) in families.items()}
    assert types["controlplane_operations"] == "counter"
    assert types["controlplane_operation_duration_seconds"] == "histogram"
    assert types["controlplane_step_duration_seconds"] == "histogram"
    assert types["controlplane_downloaded_bytes"] == "counter"
    assert types["controlplane_active_release_info"] == "gauge"  # an info metric, as text
    assert types["controlplane_slot_state"] == "gauge"
    assert types["controlplane_rollbacks"] == "counter"
    assert types["controlplane_alerts_received"] == "counter"
    assert types["controlplane_overload_verdict"] == "gauge"
    assert types["controlplane_triton_up"] == "gauge"

    operations = families["controlplane_operations"][1]
    ops = "controlplane_operations_total"
    assert value(operations, ops, kind="deploy", outcome="succeeded", trigger="api") == 2
    assert value(operations, ops, kind="rollback", outcome="succeeded", trigger="api") == 1
    steps = {s.labels["step"] for s in families["controlplane_step_duration_seconds"][1]}
    assert {"fetch", "verify", "place", "load", "preflight", "switch", "record"} <= steps
    load_count = value(
        families["controlplane_step_duration_seconds"][1],
        "controlplane_step_duration_seconds_count",
        step="load",
    )
    assert load_count == 2
    assert (
        value(families["controlplane_downloaded_bytes"][1], "controlplane_downloaded_bytes_total")
        > 0
    )

    info = families["controlplane_active_release_info"][1]
    assert [(s.labels["model"], s.labels["release"]) for s in info] == [(model_name, "r1")]
    slots = {
        (s.labels["slot"], s.labels["state"])
        for s in families["controlplane_slot_state"][1]
        if s.labels["model"] == model_name and s.value == 1
    }
    assert slots == {(f"{model_name}__blue", "ACTIVE"), (f"{model_name}__green", "RETIRING")}

    rollbacks = families["controlplane_rollbacks"][1]
    assert (
        value(
            rollbacks,
            "controlplane_rollbacks_total",
            model=model_name,
            trigger="api",
            outcome="fallback",
            reason="manual",
        )
        == 1
    )
    alerts = families["controlplane_alerts_received"][1]
    assert value(alerts, "controlplane_alerts_received_total", receipt="new") == 1
    assert value(alerts, "controlplane_alerts_received_total", receipt="duplicate") == 1
    verdicts = families["controlplane_overload_verdict"][1]
    assert value(verdicts, "controlplane_overload_verdict", verdict="healthy") == 1
    assert value(verdicts, "controlplane_overload_verdict", verdict="breach") == 0
    assert value(families["controlplane_gpu_utilization"][1], "controlplane_gpu_utilization") == 0.4
    assert value(families["controlplane_triton_up"][1], "controlplane_triton_up") == 1


def _verdict(daemon: Daemon) -> str:
    samples = scrape(daemon)["controlplane_overload_verdict"][1]
    return next((s.labels["verdict"] for s in samples if s.value == 1), "none")
