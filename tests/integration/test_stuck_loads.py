"""Loads that do not end, against the real Triton: a Python ``initialize()`` that sleeps
forever, and a rollback whose fallback load runs past its budget.

Triton cannot stop either from outside (the daemon kills nothing it did not start): the
daemon answers within its timeout or budget, puts its records and the repository back, and
the next deploy of a good release succeeds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import TritonFactory
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually

pytestmark = pytest.mark.triton
FOREVER = 100_000.0
QUICK_EXIT = ["--exit-timeout-secs=1"]  # stopped at teardown with a load still running


def test_a_load_that_never_ends_is_answered_within_its_timeout_and_the_next_deploy_works(
    store: Path, model_name: str, tmp_path: Path, own_triton: TritonFactory, daemons: DaemonFactory
) -> None:
    (tmp_path / "repository").mkdir()
    # Its own: the stuck stub lives until it stops, which then waits out Triton's exit timeout
    # (10 s) for a load that never ends; 1 s is as good for that.
    triton = own_triton(tmp_path / "repository", extra_args=QUICK_EXIT)
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0, init_sleep=FOREVER)
    write_scale_release(store, model_name, "r3", k=3.0)
    config = "triton:\n  load_timeout_seconds: 20\n"
    daemon = daemons(store, triton=triton, config=config)
    assert daemon.deploy(model_name, "r1").status_code == 200

    started = time.monotonic()
    hung = daemon.deploy(model_name, "r2")
    waited = time.monotonic() - started

    assert hung.status_code == 504, hung.text
    assert hung.json()["error"]["code"] == "triton_timeout"
    assert "within 20 s" in hung.json()["error"]["message"]
    assert waited < 25.0, waited
    assert infer_once(triton.grpc_url, model_name) == 1.0  # r1 never stopped serving

    good = daemon.deploy(model_name, "r3")

    assert good.status_code == 200, good.text
    assert infer_once(triton.grpc_url, model_name) == 3.0
    status = daemon.get(f"/v1/models/{model_name}").json()
    assert status["active_release"] == "r3"
    slots = {s["name"]: s["state"] for s in status["slots"]}
    assert slots[f"{model_name}__green-2"] == "ACTIVE"  # a spare: Triton still holds green
    assert slots[f"{model_name}__green"] == "FAILED"


def test_an_inplace_rollback_cut_by_its_budget_leaves_a_consistent_deployable_model(
    store: Path, model_name: str, tmp_path: Path, own_triton: TritonFactory, daemons: DaemonFactory
) -> None:
    (tmp_path / "repository").mkdir()
    triton = own_triton(tmp_path / "repository", extra_args=QUICK_EXIT)  # the cut load, too
    write_scale_release(store, model_name, "r1", k=1.0, init_sleep=8.0)  # a slow fallback
    write_scale_release(store, model_name, "r2", k=2.0)
    write_scale_release(store, model_name, "r3", k=3.0)
    fallback_budget, cpu_budget = 2.0, 1.0
    config = (
        "model_defaults:\n  strategy: inplace\n"
        "rollback:\n  source: none\n"
        f"  cold_fallback_budget_seconds: {fallback_budget}\n"
        f"  cpu_budget_seconds: {cpu_budget}\n"
    )
    daemon = daemons(store, triton=triton, config=config)
    assert daemon.deploy(model_name, "r1").status_code == 200
    assert daemon.deploy(model_name, "r2").status_code == 200

    started = time.monotonic()
    answer = daemon.post(f"/api/v1/model/reload?target=fallback&model={model_name}", {})
    waited = time.monotonic() - started

    assert waited <= fallback_budget + cpu_budget + 1.0, waited
    [rollback] = answer.json()["rollbacks"]
    record = rollback["rollback"]
    assert record["detail"]["fallback_budget"]["kind"] == "cold"
    assert "cut short" in record["detail"]["fallback"]
    cut = daemon.get(f"/v1/operations/{record['operations'][0]}").json()["operation"]
    assert (cut["status"], cut["error"]["code"]) == ("interrupted", "budget_exceeded")

    # Consistent: what the daemon records is what the repository holds, and the model serves
    # it once Triton is done with the cut load (the reconcile loop reloads it from disk).
    status = daemon.get(f"/v1/models/{model_name}").json()
    assert status["active_release"] == "r2"
    marker = (tmp_path / "repository" / model_name / ".controlplane-release.json").read_text()
    assert '"release": "r2"' in marker
    eventually(lambda: _serves(triton.grpc_url, model_name) == 2.0, 60, "r2 serves again from disk")
    # The slot is STALE, and the reconcile loop's repair reloads it, for seconds: a deploy then
    # is refused with 409 operation_in_progress, as during any operation (seen once in a full
    # run). Deployable means once that repair has ended.
    eventually(lambda: _repaired(daemon, model_name), 60, "the repair of the STALE slot ending")
    # Deployable: the next deploy works.
    deployed = daemon.deploy(model_name, "r3")
    assert deployed.status_code == 200, deployed.text
    assert infer_once(triton.grpc_url, model_name) == 3.0


def _repaired(daemon: Daemon, model: str) -> bool:
    view = daemon.get(f"/v1/models/{model}").json()
    slots = {s["name"]: (s["state"], s["release"]) for s in view["slots"]}
    return view["running_operation"] is None and slots.get(model) == ("ACTIVE", "r2")


def _serves(url: str, model: str) -> float | None:
    try:
        return infer_once(url, model)
    except Exception:  # mid-reload: the poll waits it out
        return None
