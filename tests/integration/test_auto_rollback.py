"""Automatic rollback against the real Triton, driven by GPU utilisation from a test exporter.

Triton here has no GPU, so the one fake is the exporter serving ``nv_gpu_utilization``; the
daemon scrapes it over HTTP exactly as it scrapes Triton's /metrics, and every switch, load and
reload is real.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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
from tests.support.inference import LoadGenerator, infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

WINDOW = 10.0
INTERVAL = 1.0
FALLBACK_BUDGET = 3.0
CPU_BUDGET = 10.0


@pytest.fixture
def exporter() -> Iterator[GpuExporter]:
    with GpuExporter() as running:
        running.set(gpu0=0.30)
        yield running


def _config(exporter: GpuExporter, model: str, *, fallback: str | None = None) -> str:
    lines = [
        "rollback:",
        f"  metrics_url: {exporter.url}",
        f"  window_seconds: {WINDOW}",
        f"  interval_seconds: {INTERVAL}",
        f"  fallback_budget_seconds: {FALLBACK_BUDGET}",
        # A Python-backend reload takes 1.3 to 2.3 s on a busy 2-core machine, about the CPU
        # step's 2 s default: these tests check the path taken, so they give it room.
        f"  cpu_budget_seconds: {CPU_BUDGET}",
        "models:",
        f"  {model}:",
        "    retire_after_seconds: 600",
        "    drain_timeout_seconds: 5",
    ]
    if fallback is not None:
        lines.append(f"    fallback_release: {fallback}")
    return "\n".join(lines) + "\n"


def _model(daemon: Daemon, model: str) -> dict[str, Any]:
    found: dict[str, Any] = daemon.get(f"/v1/models/{model}").json()
    return found


def _operations(daemon: Daemon, model: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = daemon.get(f"/v1/operations?model={model}&limit=50").json()[
        "operations"
    ]
    return found


def _wait_scrapes(exporter: GpuExporter, count: int) -> None:
    target = exporter.scrapes + count
    eventually(lambda: exporter.scrapes >= target, count * INTERVAL + 10, f"{count} scrapes")


def test_held_overload_brings_the_fallback_back_within_the_budget(
    daemons: DaemonFactory,
    store: Path,
    model_name: str,
    triton: RunningTriton,
    exporter: GpuExporter,
) -> None:
    daemon = serving_r2(daemons, store, model_name, config=_config(exporter, model_name))
    _wait_scrapes(exporter, 2)
    assert _model(daemon, model_name)["overload"]["verdict"] == "healthy"

    with LoadGenerator(triton.grpc_url, model_name, clients=2) as load:
        load.wait_for_answers(10)
        exporter.set(gpu0=0.99)
        began = time.monotonic()
        eventually(
            lambda: infer_once(triton.grpc_url, model_name) == 1.0,
            WINDOW + FALLBACK_BUDGET + INTERVAL,
            "the fallback r1 serving",
            every=0.1,
        )
        took = time.monotonic() - began
        load.wait_for_answers(10)

    assert [e for log in load.logs for e in log.errors] == []
    model = _model(daemon, model_name)
    assert (model["active_release"], model["previous_release"]) == ("r1", "r2")
    assert model["overload"]["verdict"] == "breach"
    assert model["overload"]["covered_seconds"] >= WINDOW - INTERVAL
    last = last_rollback(daemon, model_name)
    model = _model(daemon, model_name)
    assert (last["trigger"], last["outcome"], last["from_release"], last["to_release"]) == (
        "watcher",
        "fallback",
        "r2",
        "r1",
    )
    assert "GPU utilisation above 0.95" in last["reason"]
    assert [d["release"] for d in model["rollback"]["degraded"]] == ["r2"]
    assert model["rollback"]["cooldown_until"] is not None
    assert took >= WINDOW - INTERVAL  # it waited for the whole window, not one high sample

    # Still overloaded: the degraded r2 is never a fallback, so nothing more happens.
    _wait_scrapes(exporter, 3)
    assert rollback_operations(daemon, model_name) == [("watcher", "succeeded")]
    assert infer_once(triton.grpc_url, model_name) == 1.0


def test_a_one_sample_dip_in_the_window_is_no_breach(
    daemons: DaemonFactory,
    store: Path,
    model_name: str,
    triton: RunningTriton,
    exporter: GpuExporter,
) -> None:
    daemon = serving_r2(daemons, store, model_name, config=_config(exporter, model_name))

    # 0.99 for 7 scrapes, one scrape at 0.50, 0.99 for 8 more: never 10 s above the line.
    exporter.set(gpu0=0.99)
    _wait_scrapes(exporter, 7)
    exporter.dip(scrapes=1, gpu0=0.50)
    _wait_scrapes(exporter, 1)
    # What the daemon says while 8 more scrapes at 0.99 go by (each within a deadline).
    verdicts = set()
    last_scrape = exporter.scrapes + 8

    def eight_more_seen() -> bool:
        verdicts.add(_model(daemon, model_name)["overload"]["verdict"])
        return exporter.scrapes >= last_scrape

    eventually(eight_more_seen, 8 * INTERVAL + 10, "8 more scrapes", every=0.2)
    exporter.set(gpu0=0.30)
    _wait_scrapes(exporter, 2)

    assert "breach" not in verdicts
    assert "healthy" in verdicts
    model = _model(daemon, model_name)
    assert model["active_release"] == "r2"
    assert model["rollback"]["last"] is None
    assert model["rollback"]["degraded"] == []
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_a_fallback_that_fails_to_load_leads_to_the_cpu_only_reload(
    daemons: DaemonFactory,
    store: Path,
    model_name: str,
    triton: RunningTriton,
    exporter: GpuExporter,
) -> None:
    write_scale_release(store, model_name, "r0", k=0.5, fail_init=True)
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = daemons(store, config=_config(exporter, model_name, fallback="r0"))
    assert daemon.deploy(model_name, "r1").status_code == 200
    assert _model(daemon, model_name)["rollback"]["fallback"] == "r0"

    exporter.set(gpu0=0.99)
    eventually(
        lambda: (_model(daemon, model_name)["rollback"]["last"] or {}).get("outcome") is not None,
        WINDOW + FALLBACK_BUDGET + CPU_BUDGET + 3 * INTERVAL,
        "the rollback chain to finish",
        every=0.2,
    )

    model = _model(daemon, model_name)
    last = model["rollback"]["last"]
    assert last["outcome"] == "cpu", last
    assert last["to_release"] == "r1"
    assert last["detail"]["fallback"].startswith("triton_load_failed")
    assert last["detail"]["cpu"] == "succeeded"
    kinds = {op["id"]: (op["kind"], op["status"]) for op in _operations(daemon, model_name)}
    assert [kinds[i] for i in last["operations"]] == [
        ("rollback", "failed"),
        ("cpu-fallback", "succeeded"),
    ]
    assert model["active_release"] == "r1"
    assert infer_once(triton.grpc_url, model_name) == 1.0
    slot = model["alias_target"]
    served = httpx.get(f"{triton.http_url}/v2/models/{slot}/config", timeout=10).json()
    assert {group["kind"] for group in served["instance_group"]} == {"KIND_CPU"}
    assert [d["release"] for d in model["rollback"]["degraded"]] == ["r1"]
