"""The Alertmanager webhook and the runbook route, against the real Triton and daemon.

Payloads follow Alertmanager's version 4 webhook, as a real Alertmanager 0.25 sends it (the
end-to-end test with the real Alertmanager is in test_alertmanager_e2e.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory, rollback_operations, serving_r2
from tests.integration.test_cli import cli
from tests.support.inference import infer_once
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

TOKEN = "webhook-test-token"


def _config(model: str) -> str:
    # No watcher: only alerts and the runbook route act here.
    return (
        "rollback:\n  source: none\n"
        f"models:\n  {model}:\n    retire_after_seconds: 600\n    drain_timeout_seconds: 5\n"
    )


def notification(
    *, status: str = "firing", fingerprint: str = "6f1c2b3a4d5e6f70", **labels: str
) -> dict[str, Any]:
    alert = {
        "status": status,
        "labels": {"alertname": "GpuOverload", **labels},
        "annotations": {"summary": "GPU utilisation above 95 % for 10 s"},
        "startsAt": "2026-11-29T10:00:00.000Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": "http://prometheus:9090/graph",
        "fingerprint": fingerprint,
    }
    return {
        "version": "4",
        "groupKey": '{}:{alertname="GpuOverload"}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "controlplane",
        "groupLabels": {"alertname": "GpuOverload"},
        "commonLabels": alert["labels"],
        "commonAnnotations": alert["annotations"],
        "externalURL": "http://alertmanager:9093",
        "alerts": [alert],
    }


def test_a_firing_alert_rolls_back_once_and_resolved_changes_nothing(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    daemon = serving_r2(daemons, store, model_name, config=_config(model_name), token=TOKEN)

    first = daemon.post("/v1/alerts", notification(model=model_name))

    assert first.status_code == 200, first.text
    assert first.json()["alerts"][0]["receipt"] == "new"
    assert first.json()["alerts"][0]["action"] == f"rolling back {model_name}"
    eventually(lambda: infer_once(triton.grpc_url, model_name) == 1.0, 10, "r1 serving")
    eventually(
        lambda: daemon.get(f"/v1/models/{model_name}").json()["rollback"]["last"] is not None,
        10,
        "the rollback recorded",
    )

    # Alertmanager repeats the firing alert, then resolves it: neither acts.
    repeat = daemon.post("/v1/alerts", notification(model=model_name))
    resolved = daemon.post("/v1/alerts", notification(status="resolved", model=model_name))

    assert repeat.json()["alerts"][0]["receipt"] == "duplicate"
    assert resolved.json()["alerts"][0]["receipt"] == "resolved"
    stored = daemon.get("/v1/alerts").json()["alerts"]
    assert [(a["fingerprint"], a["status"], a["receipts"]) for a in stored] == [
        ("6f1c2b3a4d5e6f70", "resolved", 3)
    ]
    assert rollback_operations(daemon, model_name) == [("alert", "succeeded")]
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert model["active_release"] == "r1"
    last = model["rollback"]["last"]
    assert (last["trigger"], last["outcome"], last["to_release"]) == ("alert", "fallback", "r1")
    assert last["reason"] == "GpuOverload: GPU utilisation above 95 % for 10 s"
    assert infer_once(triton.grpc_url, model_name) == 1.0
    status = cli(daemon.url, "status", model_name).stdout
    assert "rollback:  fallback r2 -> r1 by alert" in status
    assert "degraded:  r2 (not re-promoted automatically)" in status

    # A new alert without a model label acts on every model with a fallback: none is left,
    # since r2 is latched degraded.
    unlabelled = daemon.post("/v1/alerts", notification(fingerprint="0a0b0c0d0e0f1011"))
    assert unlabelled.json()["alerts"][0]["action"] == (
        "no model here has a fallback; nothing done"
    )


def test_bad_webhook_input_is_refused_and_changes_nothing(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    daemon = serving_r2(daemons, store, model_name, config=_config(model_name), token=TOKEN)
    good = notification(model=model_name)
    missing = json.loads(json.dumps(good))
    del missing["alerts"][0]["fingerprint"]
    del missing["alerts"][0]["startsAt"]
    cases: list[tuple[str, dict[str, str], bytes, int, str]] = [
        ("wrong token", {"authorization": "Bearer nope"}, json.dumps(good).encode(), 401, ""),
        ("no token", {"authorization": ""}, json.dumps(good).encode(), 401, ""),
        ("malformed JSON", {}, b'{"version": "4", "alerts": [', 400, "JSON"),
        ("missing fields", {}, json.dumps(missing).encode(), 400, "fingerprint"),
        ("version 3", {}, json.dumps({**good, "version": "3"}).encode(), 400, "version"),
        ("10 MB body", {}, b'{"pad": "' + b"x" * (10 * 1024 * 1024) + b'"}', 413, ""),
    ]
    for name, headers, body, status, mentions in cases:
        response = daemon.http.post(
            "/v1/alerts",
            content=body,
            headers={"content-type": "application/json", **headers},
        )
        assert response.status_code == status, (name, response.text[:300])
        assert response.json()["error"]["code"], name
        assert mentions in response.json()["error"]["message"], (name, response.text[:300])

    assert daemon.get("/v1/alerts").json()["alerts"] == []
    assert rollback_operations(daemon, model_name) == []
    log = daemon.log()
    assert TOKEN not in log
    assert "Bearer nope" not in log
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert (model["active_release"], model["rollback"]["last"]) == ("r2", None)
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_the_runbook_route_serves_the_fallback_now(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    daemon = serving_r2(daemons, store, model_name, config=_config(model_name), token=TOKEN)

    wrong = daemon.http.post("/api/v1/model/reload", params={"target": "previous"})
    assert wrong.status_code == 400
    assert "target=fallback" in wrong.json()["error"]["message"]

    response = daemon.http.post(
        "/api/v1/model/reload", params={"target": "fallback", "model": model_name}
    )

    assert response.status_code == 200, response.text
    [result] = response.json()["rollbacks"]
    assert result["acted"] is True
    assert (result["rollback"]["outcome"], result["rollback"]["to_release"]) == (
        "fallback",
        "r1",
    )
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert rollback_operations(daemon, model_name) == [("api", "succeeded")]

    # Nothing left to fall back to (r2 is degraded): without a model name, a clear 409.
    none_left = daemon.http.post("/api/v1/model/reload", params={"target": "fallback"})
    assert none_left.status_code == 409
    assert none_left.json()["error"]["code"] == "no_fallback"
    unauthenticated = httpx.post(
        f"{daemon.url}/api/v1/model/reload", params={"target": "fallback"}, timeout=10
    )
    assert unauthenticated.status_code == 401
