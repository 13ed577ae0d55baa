"""``GET /metrics`` as Prometheus reads it: parsed with prometheus_client's own parser, and
linted by ``promtool check metrics`` (Prometheus's own naming rules) and by ours
(tests/support/metric_conventions.py).

Against real daemons: what serves and whether it is what should (alone, and in a fleet of two
where one member cannot take the release), the CPU-only mode and the degraded latch after the
rollback chain's last step, in ``/metrics``, ``GET /v1/models/{name}`` and ``controlplane
status`` alike.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from controlplane import __version__
from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory, serving_r2
from tests.integration.test_alert_webhook import notification
from tests.integration.test_cli import cli
from tests.support.daemon import Daemon
from tests.support.fleet import Fleet, running_fleet
from tests.support.gpu_exporter import GpuExporter
from tests.support.metric_conventions import problems
from tests.support.models import write_scale_release, write_sha256sums
from tests.support.monitoring import PROMTOOL
from tests.support.polling import eventually
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton

TOKEN = "metrics-test-token"


def scrape(daemon: Daemon) -> dict[str, tuple[str, list[Sample]]]:
    """Family name -> (type, samples)."""
    return {family.name: (family.type, list(family.samples)) for family in parsed(daemon)}


def parsed(daemon: Daemon) -> list[Metric]:
    response = daemon.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return list(text_string_to_metric_families(response.text))


def gauge(daemon: Daemon, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` with ``labels``; None when there is none."""
    found = [
        s.value
        for family in parsed(daemon)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    assert len(found) <= 1, f"{len(found)} samples of {name} with {labels}"
    return found[0] if found else None


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
    utilization = families["controlplane_gpu_utilization_ratio"][1]
    assert value(utilization, "controlplane_gpu_utilization_ratio") == 0.4
    assert value(families["controlplane_triton_up"][1], "controlplane_triton_up") == 1
    build = families["controlplane_build_info"][1]
    assert [s.labels["version"] for s in build] == [__version__]
    # The rollback latched r2; r1 serves, from its files (not the CPU-only reload).
    degraded = families["controlplane_release_degraded"][1]
    assert [(s.labels["model"], s.labels["release"], s.value) for s in degraded] == [
        (model_name, "r2", 1)
    ]
    assert value(families["controlplane_model_cpu_only"][1], "controlplane_model_cpu_only") == 0
    jobs = {s.labels["name"]: s.value for s in families["controlplane_job_up"][1]}
    assert {"reconcile", "fleet-sync", "release-watcher", "overload-watcher"} <= jobs.keys()
    assert set(jobs.values()) == {1}
    # This daemon is the fleet's one member: it serves the fleet's release, r1 since the
    # rollback moved the fleet there.
    assert gauge(daemon, "controlplane_model_serving_desired_release", model=model_name) == 1
    assert gauge(daemon, "controlplane_fleet_model_converged", model=model_name) == 1
    assert gauge(daemon, "controlplane_fleet_members", state="alive") == 1
    assert gauge(daemon, "controlplane_fleet_members", state="down") == 0


def test_every_exported_name_passes_promtool_and_the_conventions(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = daemons(store)
    assert daemon.deploy(model_name, "r1").status_code == 200
    text = daemon.get("/metrics").text

    linted = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert problems(parsed(daemon)) == []


def test_the_cpu_only_mode_and_the_degraded_latch_show_in_metrics_the_model_and_status(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r0", k=0.5, fail_init=True)
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    config = (
        f"rollback:\n  cpu_budget_seconds: 30\nmodels:\n  {model_name}:\n    fallback_release: r0\n"
    )
    daemon = daemons(store, config=config, token=TOKEN)
    assert daemon.deploy(model_name, "r1").status_code == 200
    assert gauge(daemon, "controlplane_model_cpu_only", model=model_name) == 0

    # The fallback r0 cannot load: the chain's last step reloads r1 on CPU-only instances.
    reload = daemon.http.post(
        "/api/v1/model/reload", params={"target": "fallback", "model": model_name}
    )
    assert reload.status_code == 200, reload.text
    assert reload.json()["rollbacks"][0]["rollback"]["outcome"] == "cpu"

    assert gauge(daemon, "controlplane_model_cpu_only", model=model_name) == 1
    assert gauge(daemon, "controlplane_release_degraded", model=model_name, release="r1") == 1
    view = daemon.get(f"/v1/models/{model_name}").json()
    assert (view["active_release"], view["cpu_only"]) == ("r1", True)
    assert [d["release"] for d in view["rollback"]["degraded"]] == ["r1"]
    status = cli(daemon.url, "status", model_name, token=TOKEN)
    assert status.returncode == 0, status.stderr
    assert "cpu only:  yes" in status.stdout
    assert "degraded:  r1" in status.stdout

    # A deploy loads from the files: on the GPU (where there is one) again.
    assert daemon.deploy(model_name, "r2").status_code == 200
    assert gauge(daemon, "controlplane_model_cpu_only", model=model_name) == 0
    assert daemon.get(f"/v1/models/{model_name}").json()["cpu_only"] is False
    assert "cpu only" not in cli(daemon.url, "status", model_name, token=TOKEN).stdout
    # The latches in /metrics are the model view's, whatever the deploy did to them.
    latched = {
        d["release"] for d in daemon.get(f"/v1/models/{model_name}").json()["rollback"]["degraded"]
    }
    exported = {
        s.labels["release"]
        for s in scrape(daemon)["controlplane_release_degraded"][1]
        if s.labels["model"] == model_name
    }
    assert exported == latched


@pytest.fixture
def fleet(
    pooled_tritons: Callable[[Path], RunningTriton], store: Path, tmp_path: Path
) -> Iterator[Fleet]:
    model = unique_model("metricsmodel")
    with running_fleet(pooled_tritons, store, tmp_path / "fleet", model) as running:
        yield running


def test_a_member_that_cannot_serve_the_release_shows_in_both_members_metrics(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    release = write_scale_release(store, fleet.model, "r2", k=2.0)
    (release / "1" / "weights.bin").write_bytes(b"\0" * 64 * 1024)  # r2 is the larger one
    write_sha256sums(release)
    small = sum(p.stat().st_size for p in release.rglob("*") if p.is_file()) - 1
    first = fleet.add()
    tight = fleet.add(extra_env={"CONTROLPLANE_STORE__MAX_RELEASE_BYTES": str(small)})
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)
    for member in (first, tight):
        eventually(
            partial(shows, member.api, 1, "controlplane_fleet_model_converged", model=fleet.model),
            30,
            f"{member.name} seeing {fleet.model} converged",
        )
        assert gauge(member.api, "controlplane_fleet_model_generation", model=fleet.model) == 1
        assert gauge(member.api, "controlplane_fleet_members", state="alive") == 2
        assert (
            gauge(member.api, "controlplane_model_serving_desired_release", model=fleet.model) == 1
        )

    # r2 through the first member: it serves r2, the tight one cannot (and keeps r1).
    answer = first.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert answer.status_code == 502, answer.text
    eventually(
        lambda: (
            gauge(tight.api, "controlplane_model_serving_desired_release", model=fleet.model) == 0
        ),
        30,
        "the tight member saying it does not serve what it should",
    )
    assert gauge(first.api, "controlplane_model_serving_desired_release", model=fleet.model) == 1
    for member in (first, tight):
        eventually(
            partial(shows, member.api, 0, "controlplane_fleet_model_converged", model=fleet.model),
            30,
            f"{member.name} seeing {fleet.model} not converged",
        )
        assert gauge(member.api, "controlplane_fleet_model_generation", model=fleet.model) == 2
    failed = gauge(
        tight.api,
        "controlplane_operations_total",
        model=fleet.model,
        kind="deploy",
        outcome="failed",
        trigger="fleet",
    )
    assert (failed or 0) >= 1  # a member that fails to follow: not ControlplaneDeployFailed's

    # The first member stops: the other counts it down (and still not converged: it serves r1).
    assert first.daemon is not None
    first.daemon.stop()
    eventually(
        lambda: gauge(tight.api, "controlplane_fleet_members", state="down") == 1,
        30,
        "the first member seen as down",
    )
    assert gauge(tight.api, "controlplane_fleet_members", state="alive") == 1


def shows(daemon: Daemon, expected: float, name: str, **labels: str) -> bool:
    return gauge(daemon, name, **labels) == expected


def _verdict(daemon: Daemon) -> str:
    samples = scrape(daemon)["controlplane_overload_verdict"][1]
    return next((s.labels["verdict"] for s in samples if s.value == 1), "none")
