"""The shipped alert rules (deploy/monitoring/rules.yml), loaded into the real Prometheus that
scrapes a real daemon as job ``controlplane``: quiet while all is well, and a failed deploy
fires ``ControlplaneDeployFailed`` for that model with the labels the daemon really exports.

promtool's tests (rules_test.yml) pin each alert's timing on synthetic series; this pins that
the expressions select what the daemon serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.models import write_scale_release
from tests.support.monitoring import Prometheus
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

RULES = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "rules.yml"


def _alerts(prometheus: Prometheus, state: str) -> list[dict[str, Any]]:
    return [found["metric"] for found in prometheus.query(f'ALERTS{{alertstate="{state}"}}')]


def test_the_shipped_rules_stay_quiet_on_a_healthy_daemon_and_fire_on_a_failed_deploy(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, tmp_path: Path
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "bad", k=3.0, fail_init=True)
    daemon = daemons(store)
    assert daemon.deploy(model_name, "r1").status_code == 200
    with Prometheus(
        tmp_path / "prometheus",
        scrape_url=f"{daemon.url}/metrics",
        alertmanager_url=None,
        rules=RULES.read_text(),
        job="controlplane",
    ) as prometheus:
        prometheus.wait_for_scrape()
        # Scraped and evaluated a few times over: nothing fires, nothing is even pending.
        eventually(
            lambda: prometheus.query("count_over_time(controlplane_build_info[10s]) >= 3") != [],
            30,
            "a few scrapes of the daemon",
        )
        assert prometheus.query('up{job="controlplane"}')[0]["value"][1] == "1"
        assert prometheus.query(
            f'controlplane_model_serving_desired_release{{model="{model_name}"}}'
        )
        assert _alerts(prometheus, "firing") == []
        assert _alerts(prometheus, "pending") == []

        refused = daemon.deploy(model_name, "bad")
        assert refused.status_code != 200, refused.text
        assert refused.json()["error"]["code"] == "triton_load_failed", refused.text

        eventually(lambda: _alerts(prometheus, "firing") != [], 30, "an alert firing", every=0.5)
        [alert] = _alerts(prometheus, "firing")
        assert alert["alertname"] == "ControlplaneDeployFailed"
        assert alert["severity"] == "warning"
        assert (alert["job"], alert["model"], alert["trigger"]) == (
            "controlplane",
            model_name,
            "api",
        )
        # What served goes on serving: nothing else fires or is about to.
        assert _alerts(prometheus, "pending") == []
        assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "r1"
