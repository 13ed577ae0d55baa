"""SIGKILL in the middle of a deploy, then a restart: the repository is never left half done."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.tree import snapshot

pytestmark = pytest.mark.triton
# These tests are about the inplace strategy; blue-green has its own in test_blue_green.py.
INPLACE = "model_defaults:\n  strategy: inplace\n"


def _wait_for_step(daemon: Daemon, operation_id: str, step: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        operation: dict[str, Any] = daemon.get(f"/v1/operations/{operation_id}").json()["operation"]
        running = [s["name"] for s in operation["steps"] if s["status"] == "running"]
        if running == [step]:
            return operation
        time.sleep(0.02)
    raise AssertionError(f"operation {operation_id} never reached step {step!r}")


def _is_complete_release(model_dir: Path, store: Path, model: str) -> str:
    """Which store release `model_dir` holds, checking that every file of it is there."""
    placed = snapshot(model_dir)
    for release_dir in (store / model).iterdir():
        original = snapshot(release_dir)
        if all(
            placed.get(path) == digest
            for path, digest in original.items()
            if path != "config.pbtxt"
        ):
            return release_dir.name
    raise AssertionError(f"{model_dir} holds no complete release: {sorted(placed)}")


def test_sigkill_during_a_load_then_restart_serves_a_complete_release(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, tmp_path: Path
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0, init_sleep=4.0)
    workdir = tmp_path / "state"
    workdir.mkdir()
    daemon = daemons(store, workdir=workdir, config=INPLACE)
    assert daemon.deploy(model_name, "r1").status_code == 200
    started = daemon.deploy(model_name, "r2", wait=False)
    operation_id = started.json()["operation"]["id"]
    _wait_for_step(daemon, operation_id, "load")

    daemon.kill()

    # Whatever the moment of death, the repository holds one complete release.
    model_dir = daemon.repository / model_name
    assert _is_complete_release(model_dir, store, model_name) in ("r1", "r2")

    restarted = daemons(store, workdir=workdir, log_name="daemon-restarted.log", config=INPLACE)

    assert restarted.staging_leftovers() == []
    operation = restarted.get(f"/v1/operations/{operation_id}").json()["operation"]
    assert operation["status"] == "interrupted"
    assert operation["error"]["code"] == "interrupted"
    # The desired release (the last that succeeded) serves again, complete.
    assert _is_complete_release(model_dir, store, model_name) == "r1"
    assert infer_once(triton.grpc_url, model_name) == 1.0
    model = restarted.get(f"/v1/models/{model_name}").json()
    assert model["active_release"] == "r1"
    assert model["triton"]["state"] == "READY"
    # And the daemon takes deploys again.
    assert restarted.deploy(model_name, "r2").status_code == 200
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_sigkill_during_a_first_deploy_leaves_no_unconfirmed_model(
    daemons: DaemonFactory, store: Path, model_name: str, tmp_path: Path
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0, init_sleep=3.0)
    workdir = tmp_path / "state"
    workdir.mkdir()
    daemon = daemons(store, workdir=workdir, config=INPLACE)
    started = daemon.deploy(model_name, "r1", wait=False)
    operation_id = started.json()["operation"]["id"]
    _wait_for_step(daemon, operation_id, "load")

    daemon.kill()
    restarted = daemons(store, workdir=workdir, log_name="daemon-restarted.log", config=INPLACE)

    assert restarted.staging_leftovers() == []
    assert not (restarted.repository / model_name).exists()
    operation = restarted.get(f"/v1/operations/{operation_id}").json()["operation"]
    assert operation["status"] == "interrupted"
    model = restarted.get(f"/v1/models/{model_name}").json()
    assert model["active_release"] is None
    assert model["triton"]["state"] != "READY"


def test_restarted_triton_gets_the_desired_release_back(
    store: Path, model_name: str, tmp_path: Path, own_triton: Any, daemons: DaemonFactory
) -> None:
    root = tmp_path / "root"
    (root / "repository").mkdir(parents=True)
    first = own_triton(root / "repository")
    write_scale_release(store, model_name, "r1", k=1.0)
    workdir = root / "state"
    workdir.mkdir()
    daemon = daemons(store, triton=first, workdir=workdir, config=INPLACE)
    assert daemon.deploy(model_name, "r1").status_code == 200
    daemon.stop()
    ports = first.ports
    first.stop()

    second = own_triton(root / "repository", ports=ports)  # EXPLICIT mode: loads nothing
    daemons(store, triton=second, workdir=workdir, log_name="daemon-restarted.log", config=INPLACE)

    assert infer_once(second.grpc_url, model_name) == 1.0


def test_sigkill_during_a_blue_green_load_leaves_the_alias_on_the_last_good_release(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, tmp_path: Path
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0, init_sleep=4.0)
    workdir = tmp_path / "state"
    workdir.mkdir()
    daemon = daemons(store, workdir=workdir)  # blue-green, the default
    assert daemon.deploy(model_name, "r1").status_code == 200
    started = daemon.deploy(model_name, "r2", wait=False)
    operation_id = started.json()["operation"]["id"]
    _wait_for_step(daemon, operation_id, "load")

    daemon.kill()
    restarted = daemons(store, workdir=workdir, log_name="daemon-restarted.log")

    assert restarted.staging_leftovers() == []
    operation = restarted.get(f"/v1/operations/{operation_id}").json()["operation"]
    assert operation["status"] == "interrupted"
    assert infer_once(triton.grpc_url, model_name) == 1.0
    model = restarted.get(f"/v1/models/{model_name}").json()
    assert model["active_release"] == "r1"
    assert model["alias_target"] == f"{model_name}__blue"
    green = restarted.repository / f"{model_name}__green"
    eventually(lambda: not green.exists(), 60, "the unconfirmed slot retired")
    # The retire goes on after the dir is gone (the residue audit), holding the model's lock.
    eventually(
        lambda: restarted.get(f"/v1/models/{model_name}").json()["running_operation"] is None,
        30,
        "the retire operation finished",
    )
    assert restarted.deploy(model_name, "r2").status_code == 200
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_an_auto_deploy_cut_short_by_sigkill_is_resumed_after_the_restart(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, tmp_path: Path
) -> None:
    """What is new is not remembered across a restart, so the watcher reads the journal: the
    newest release, whose deploy the kill left interrupted, is deployed after all."""
    auto = "store:\n  poll_interval_seconds: 0.5\nmodel_defaults:\n  auto_deploy: true\n"
    workdir = tmp_path / "state"
    workdir.mkdir()
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = daemons(store, workdir=workdir, config=auto)
    eventually(lambda: _answers(triton, model_name) == 1.0, 60, "r1 auto-deployed")
    write_scale_release(store, model_name, "r2", k=2.0, init_sleep=4.0)
    eventually(lambda: _deploy_of(daemon, model_name, "r2") is not None, 30, "r2's deploy")
    operation_id = _deploy_of(daemon, model_name, "r2")
    assert operation_id is not None
    _wait_for_step(daemon, operation_id, "load")

    daemon.kill()
    restarted = daemons(store, workdir=workdir, log_name="daemon-restarted.log", config=auto)

    eventually(lambda: _answers(triton, model_name) == 2.0, 60, "r2 served after the restart")
    assert restarted.get(f"/v1/models/{model_name}").json()["active_release"] == "r2"
    cut = restarted.get(f"/v1/operations/{operation_id}").json()["operation"]
    assert cut["status"] == "interrupted"
    resumed = _deploy_of(restarted, model_name, "r2")
    assert resumed != operation_id
    assert "resuming the auto-deploy" in restarted.log()


def _answers(triton: RunningTriton, model: str) -> float | None:
    try:
        return infer_once(triton.grpc_url, model)
    except Exception:  # not loaded (yet)
        return None


def _deploy_of(daemon: Daemon, model: str, release: str) -> str | None:
    """The id of the newest deploy of ``release``, if any."""
    operations = daemon.get(f"/v1/operations?model={model}").json()["operations"]
    ids = [o["id"] for o in operations if o["kind"] == "deploy" and o["release"] == release]
    return ids[0] if ids else None
