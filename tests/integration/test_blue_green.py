"""Blue-green against the real Triton: slots behind an ensemble alias, switched under load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory, serving_r2
from tests.support.daemon import Daemon
from tests.support.inference import LoadGenerator, infer_once, transitions
from tests.support.models import SYNTAX_ERROR, write_scale_release, write_sha256sums
from tests.support.polling import eventually

pytestmark = pytest.mark.triton


def _config(model: str, retire_after: float) -> str:
    return (
        f"models:\n  {model}:\n    strategy: blue-green\n"
        f"    retire_after_seconds: {retire_after}\n    drain_timeout_seconds: 5\n"
    )


def _index(triton: RunningTriton) -> dict[str, str]:
    rows = httpx.post(f"{triton.http_url}/v2/repository/index", timeout=10).json()
    return {row["name"]: row["state"] for row in rows}


def _with_smoke(release_dir: Path, expected: float) -> None:
    sample = {
        "inputs": {"INPUT0": {"datatype": "FP32", "shape": [1], "data": [1.0]}},
        "expected": {"OUTPUT0": [expected]},
    }
    (release_dir / "smoke.json").write_text(json.dumps(sample), encoding="utf-8")
    (release_dir / "SHA256SUMS").unlink()
    write_sha256sums(release_dir)


def test_switch_under_load_flips_once_and_retires_the_old_slot(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    _with_smoke(write_scale_release(store, model_name, "r2", k=2.0), expected=2.0)
    daemon = daemons(store, config=_config(model_name, retire_after=3))
    blue, green = f"{model_name}__blue", f"{model_name}__green"
    assert daemon.deploy(model_name, "r1").status_code == 200
    assert infer_once(triton.grpc_url, model_name) == 1.0

    with LoadGenerator(triton.grpc_url, model_name, clients=4) as load:
        load.wait_for_answers(20)
        switched = daemon.deploy(model_name, "r2")
        load.wait_for_answers(20)

    assert switched.status_code == 200, switched.text
    assert [e for log in load.logs for e in log.errors] == []
    for log in load.logs:
        assert transitions(log.answers) == [1.0, 2.0]
    steps = [s["name"] for s in switched.json()["operation"]["steps"]]
    assert steps[-4:] == ["preflight", "switch", "record", "publish"]
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert model["alias_target"] == green
    roles = {s["name"]: (s["role"], s["triton_state"]) for s in model["slots"]}
    assert roles == {blue: ("retiring", "READY"), green: ("active", "READY")}

    # After the retire window the old slot is unloaded and its dir is gone. (Once its dir is
    # gone, Triton's index stops listing it at all.)
    eventually(lambda: not (daemon.repository / blue).exists(), 60, "blue's dir removed")
    eventually(  # then the residue audit, and the retire ends
        lambda: daemon.get(f"/v1/models/{model_name}").json()["running_operation"] is None,
        30,
        "the retire operation finished",
    )
    assert _index(triton).get(blue, "UNAVAILABLE") == "UNAVAILABLE"
    slots = {s["name"]: s["state"] for s in daemon.get(f"/v1/models/{model_name}").json()["slots"]}
    assert slots[blue] == "ABSENT"  # unloaded, and its dir removed
    retire = daemon.get(f"/v1/operations?model={model_name}&limit=1").json()["operations"][0]
    assert (retire["kind"], retire["trigger"], retire["status"]) == (
        "retire",
        "schedule",
        "succeeded",
    )
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_rollback_inside_the_retire_window_is_a_re_point(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    daemon = serving_r2(daemons, store, model_name, config=_config(model_name, retire_after=600))

    response = daemon.post(f"/v1/models/{model_name}/rollback", {"wait": True})

    assert response.status_code == 200, response.text
    operation = response.json()["operation"]
    assert [s["name"] for s in operation["steps"]] == ["switch", "record", "publish"]
    switch = operation["steps"][0]
    assert switch["duration_seconds"] is not None
    assert switch["detail"]["repoint_ms"] >= 0
    assert switch["detail"]["target"] == f"{model_name}__blue"
    assert infer_once(triton.grpc_url, model_name) == 1.0
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert (model["active_release"], model["previous_release"]) == ("r1", "r2")
    # r2 was just rejected by a person: it is no fallback, and the watcher will not push it.
    assert model["rollback"]["fallback"] is None
    assert [d["release"] for d in model["rollback"]["degraded"]] == ["r2"]


@pytest.mark.parametrize("ask", ["rollback", "unload"])
def test_a_rollback_or_unload_during_the_daemons_own_retire_waits_for_it_not_refused(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, ask: str
) -> None:
    """Found from outside: a person's rollback in the moment right after a deploy, while the
    daemon frees the old slot, was refused 409 operation_in_progress naming the retire."""
    write_scale_release(store, model_name, "r1", k=1.0, finalize_sleep=4.0)  # a slow unload
    write_scale_release(store, model_name, "r2", k=2.0)
    daemon = daemons(store, config=_config(model_name, retire_after=0.5))
    for release in ("r1", "r2"):
        assert daemon.deploy(model_name, release).status_code == 200
    eventually(lambda: _running(daemon, model_name) == "retire", 15, "the retire of r1's slot")

    answer = daemon.post(f"/v1/models/{model_name}/{ask}", {"wait": True})

    assert answer.status_code == 200, answer.text
    assert answer.json()["operation"]["status"] == "succeeded"
    retire = daemon.get(f"/v1/operations?model={model_name}&limit=5").json()["operations"]
    assert [op["status"] for op in retire if op["kind"] == "retire"][:1] == ["succeeded"]
    if ask == "rollback":
        assert infer_once(triton.grpc_url, model_name) == 1.0
    else:
        assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] is None


def _running(daemon: Daemon, model: str) -> str | None:
    [last] = daemon.get(f"/v1/operations?model={model}&limit=1").json()["operations"]
    return str(last["kind"]) if last["status"] == "running" else None


def test_a_slot_edited_by_hand_is_placed_again_from_the_store_and_never_served_as_the_release(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    """Found from outside: a model.py edited in the serving slot went unnoticed, and a later
    rollback to that slot served the edited files as r1."""
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    daemon = daemons(store, config=_config(model_name, retire_after=600))
    assert daemon.deploy(model_name, "r1").status_code == 200
    edited = daemon.repository / f"{model_name}__blue" / "1" / "model.py"
    edited.write_text(edited.read_text().replace("K = 1.0", "K = 99.0"))

    eventually(
        lambda: _slots(daemon, model_name).get(f"{model_name}__green") == ("ACTIVE", "r1"),
        60,
        "r1 placed again from the store, in the other slot",
    )
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert "K = 99.0" not in (daemon.repository / f"{model_name}__green/1/model.py").read_text()
    assert daemon.deploy(model_name, "r2").status_code == 200
    # The warm slot (r1, kept for a rollback) edited, and a rollback asked at once: before any
    # reconcile pass, so the rollback itself must see it (it re-pointed to the edited files).
    warm = daemon.repository / f"{model_name}__green" / "1" / "model.py"
    warm.write_text(warm.read_text().replace("K = 1.0", "K = 44.0"))
    back = daemon.post(f"/v1/models/{model_name}/rollback", {"wait": True})
    assert back.status_code == 200, back.text
    assert "load" in [s["name"] for s in back.json()["operation"]["steps"]]  # placed again
    assert infer_once(triton.grpc_url, model_name) == 1.0  # r1's bytes, not the edited ones


def _slots(daemon: Daemon, model: str) -> dict[str, tuple[str, str | None]]:
    view = daemon.get(f"/v1/models/{model}").json()
    return {s["name"]: (s["state"], s["release"]) for s in view["slots"]}


def test_deploying_the_serving_release_again_changes_nothing_and_keeps_the_warm_slot(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    daemon = serving_r2(daemons, store, model_name, config=_config(model_name, retire_after=600))
    before = daemon.get(f"/v1/models/{model_name}").json()

    again = daemon.deploy(model_name, "r2")

    assert again.status_code == 200, again.text
    assert again.json()["unchanged"] is True
    assert "serves r2 already" in again.json()["message"]
    after = daemon.get(f"/v1/models/{model_name}").json()
    assert after["slots"] == before["slots"]  # r1's slot is still warm for a rollback
    assert after["last_operation"]["id"] == before["last_operation"]["id"]
    assert infer_once(triton.grpc_url, model_name) == 2.0
    forced = daemon.post(f"/v1/models/{model_name}/deploy", {"release": "r2", "force": True})
    assert forced.status_code == 202, forced.text


def _broken_r2(store: Path, model: str, failure: str) -> tuple[str, str]:
    """Write the failing r2; return the error code and what its message must say."""
    if failure == "wrong-answer":
        _with_smoke(write_scale_release(store, model, "r2", k=2.0), expected=5.0)
        return "preflight_failed", "expected [5.0]"
    if failure == "fails-to-load":
        write_scale_release(store, model, "r2", k=2.0, fail_init=True)
        return "triton_load_failed", "initialize failed on purpose"
    if failure == "renamed-output":  # config.pbtxt says OUTPUTX, model.py returns OUTPUT0
        write_scale_release(store, model, "r2", k=2.0, declared_output="OUTPUTX")
        return "preflight_failed", "no output 'OUTPUTX', which config.pbtxt declares"
    if failure == "syntax-error":  # refused before anything is placed
        release = write_scale_release(store, model, "r2", k=2.0, syntax_error=True)
        lines = (release / "1" / "model.py").read_text().splitlines()
        return "invalid_release", f"1/model.py line {lines.index(SYNTAX_ERROR) + 1}: "
    dims = (1,) if failure == "empty-fixed-output" else (-1,)
    write_scale_release(store, model, "r2", k=2.0, empty_output=True, output_dims=dims)
    return "preflight_failed", "output 'OUTPUT0' is empty (shape [0]) although config.pbtxt"


@pytest.mark.parametrize(
    "failure",
    [
        "wrong-answer",
        "fails-to-load",
        "renamed-output",
        "empty-output",
        "empty-fixed-output",
        "syntax-error",
    ],
)
def test_a_release_that_fails_preflight_never_takes_traffic(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, failure: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    code, says = _broken_r2(store, model_name, failure)
    daemon = daemons(store, config=_config(model_name, retire_after=600))
    assert daemon.deploy(model_name, "r1").status_code == 200

    with LoadGenerator(triton.grpc_url, model_name, clients=4) as load:
        load.wait_for_answers(10)
        response = daemon.deploy(model_name, "r2")
        load.wait_for_answers(10)

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert says in error["message"]
    assert [e for log in load.logs for e in log.errors] == []
    assert all(set(log.answers) == {1.0} for log in load.logs)
    green = f"{model_name}__green"
    assert _index(triton).get(green, "UNAVAILABLE") == "UNAVAILABLE"
    assert not (daemon.repository / green).exists()
    assert daemon.staging_leftovers() == []
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert model["alias_target"] == f"{model_name}__blue"
    assert model["active_release"] == "r1"
    assert infer_once(triton.grpc_url, model_name) == 1.0


def test_after_triton_and_daemon_restart_the_alias_serves_the_active_release(
    store: Path, model_name: str, tmp_path: Path, own_triton: Any, daemons: DaemonFactory
) -> None:
    root = tmp_path / "root"
    (root / "repository").mkdir(parents=True)
    first = own_triton(root / "repository")
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    workdir = root / "state"
    workdir.mkdir()
    config = _config(model_name, retire_after=600)
    daemon: Daemon = daemons(store, triton=first, workdir=workdir, config=config)
    assert daemon.deploy(model_name, "r1").status_code == 200
    assert daemon.deploy(model_name, "r2").status_code == 200
    daemon.stop()
    ports = first.ports
    first.stop()

    second = own_triton(root / "repository", ports=ports)  # the alias override is gone
    restarted = daemons(
        store, triton=second, workdir=workdir, config=config, log_name="daemon-restarted.log"
    )

    assert infer_once(second.grpc_url, model_name) == 2.0
    model = restarted.get(f"/v1/models/{model_name}").json()
    assert model["alias_target"] == f"{model_name}__green"
