"""End to end with the real Prometheus and the real Alertmanager (Debian packages).

exporter (nv_gpu_utilization) -> Prometheus (1 s scrape and evaluation, the overload rule for
a ratio) -> Alertmanager (webhook with a bearer token) -> the daemon -> the real Triton.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import (
    DaemonFactory,
    last_rollback,
    rollback_operations,
    serving_r2,
)
from tests.support.daemon import Daemon
from tests.support.gpu_exporter import GpuExporter
from tests.support.inference import infer_once
from tests.support.monitoring import Alertmanager, Prometheus, overload_rule
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

TOKEN = "alertmanager-e2e-token"
# The rule needs a full 10 s average above 0.95, then `for: 10s`, then delivery: about 21 s.
ALERT_DEADLINE = 45.0


def _config(model: str, source: str, prometheus_url: str | None = None) -> str:
    lines = ["rollback:", f"  source: {source}"]
    if prometheus_url is not None:
        lines += [f"  prometheus_url: {prometheus_url}", "  query: max(nv_gpu_utilization)"]
    lines += [f"models:\n  {model}:\n    retire_after_seconds: 600\n    drain_timeout_seconds: 5"]
    return "\n".join(lines) + "\n"


def _stored_alerts(daemon: Daemon) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = daemon.get("/v1/alerts").json()["alerts"]
    return found


def test_an_alert_through_prometheus_and_alertmanager_rolls_back_once(
    daemons: DaemonFactory,
    store: Path,
    model_name: str,
    triton: RunningTriton,
    tmp_path: Path,
) -> None:
    daemon = serving_r2(daemons, store, model_name, config=_config(model_name, "none"), token=TOKEN)
    with (
        GpuExporter() as exporter,
        Alertmanager(
            tmp_path, webhook_url=f"{daemon.url}/v1/alerts", bearer_token=TOKEN
        ) as alertmanager,
        Prometheus(
            tmp_path,
            scrape_url=exporter.url,
            alertmanager_url=alertmanager.url,
            rules=overload_rule(labels={"model": model_name}),
        ) as prometheus,
    ):
        exporter.set(gpu0=0.30)
        prometheus.wait_for_scrape()
        exporter.set(gpu0=0.99)

        eventually(
            lambda: infer_once(triton.grpc_url, model_name) == 1.0,
            ALERT_DEADLINE,
            "the fallback r1 serving after the alert",
            every=0.2,
        )
        # Alertmanager goes on sending the firing alert; the daemon counts, never acts again.
        eventually(
            lambda: any(a["receipts"] >= 3 for a in _stored_alerts(daemon)),
            20,
            "three receipts of the firing alert",
            every=0.2,
        )
        assert rollback_operations(daemon, model_name) == [("alert", "succeeded")]

        exporter.set(gpu0=0.10)
        eventually(
            lambda: [a["status"] for a in _stored_alerts(daemon)] == ["resolved"],
            20,
            "the resolved notification stored",
            every=0.2,
        )

    [alert] = _stored_alerts(daemon)
    assert alert["labels"]["alertname"] == "GpuOverload"
    assert alert["labels"]["model"] == model_name
    assert rollback_operations(daemon, model_name) == [("alert", "succeeded")]
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert (model["active_release"], model["rollback"]["last"]["trigger"]) == ("r1", "alert")
    assert [d["release"] for d in model["rollback"]["degraded"]] == ["r2"]
    assert infer_once(triton.grpc_url, model_name) == 1.0


def test_the_watcher_reading_a_prometheus_query_rolls_back(
    daemons: DaemonFactory,
    store: Path,
    model_name: str,
    triton: RunningTriton,
    tmp_path: Path,
) -> None:
    with (
        GpuExporter() as exporter,
        Prometheus(tmp_path, scrape_url=exporter.url, alertmanager_url=None) as prometheus,
    ):
        exporter.set(gpu0=0.30, gpu1=0.20)
        prometheus.wait_for_scrape()
        config = _config(model_name, "prometheus", prometheus.url)
        daemon = serving_r2(daemons, store, model_name, config=config, token=TOKEN)
        eventually(
            lambda: (
                (daemon.get(f"/v1/models/{model_name}").json()["overload"] or {}).get("verdict")
                == "healthy"
            ),
            20,
            "a healthy verdict from the query",
        )
        exporter.set(gpu0=0.99, gpu1=0.20)  # one hot GPU is enough with max()

        eventually(
            lambda: infer_once(triton.grpc_url, model_name) == 1.0,
            30,
            "the fallback r1 serving",
            every=0.2,
        )

    last = last_rollback(daemon, model_name)
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert model["overload"]["source"] == "prometheus"
    assert (last["trigger"], last["outcome"], last["to_release"]) == ("watcher", "fallback", "r1")
