"""Deploying from a local store into the real Triton: the paths a CI job takes every day."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon, start_daemon
from tests.support.inference import LoadGenerator, infer_once, transitions
from tests.support.models import (
    SHA256SUMS,
    corrupt_file,
    write_broken_config_release,
    write_scale_release,
)
from tests.support.polling import eventually
from tests.support.tree import snapshot

pytestmark = pytest.mark.triton
# These tests are about the inplace strategy; blue-green has its own in test_blue_green.py.
INPLACE = "model_defaults:\n  strategy: inplace\n"


def test_deploy_serves_the_release_and_swaps_without_a_failed_request(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    daemon = daemons(store, config=INPLACE)

    first = daemon.deploy(model_name, "r1")
    assert first.status_code == 200, first.text
    assert first.json()["operation"]["status"] == "succeeded"
    assert infer_once(triton.grpc_url, model_name) == 1.0

    with LoadGenerator(triton.grpc_url, model_name, clients=4) as load:
        load.wait_for_answers(20)
        second = daemon.deploy(model_name, "r2")
        load.wait_for_answers(20)
    assert second.status_code == 200, second.text

    errors = [e for log in load.logs for e in log.errors]
    assert errors == []
    for log in load.logs:
        # Each client saw r1's answer, then r2's, and nothing else or in between.
        assert transitions(log.answers) == [1.0, 2.0]
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert model["active_release"] == "r2"
    assert model["previous_release"] == "r1"
    assert model["triton"]["state"] == "READY"
    assert [s["state"] for s in model["slots"]] == ["ACTIVE"]
    assert daemon.staging_leftovers() == []


@dataclass
class Serving:
    daemon: Daemon
    store: Path
    model: str
    triton: RunningTriton


@pytest.fixture(scope="class")
def serving(triton: RunningTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    """One model serving r2 (after r1), shared by the refusal tests of one class.

    Class-scoped, so its daemon stops before the next test starts a daemon of its own on the
    session Triton's repository, which only one daemon at a time may hold.
    """
    workdir = tmp_path_factory.mktemp("serving")
    store = workdir / "store"
    model = f"refusals-{time.monotonic_ns()}"
    write_scale_release(store, model, "r1", k=1.0)
    write_scale_release(store, model, "r2", k=2.0)
    daemon = start_daemon(triton=triton, store=store, workdir=workdir, config=INPLACE)
    try:
        assert daemon.deploy(model, "r1").status_code == 200
        assert daemon.deploy(model, "r2").status_code == 200
        yield Serving(daemon, store, model, triton)
    finally:
        daemon.stop()


def _mismatch(store: Path, model: str) -> str:
    corrupt_file(write_scale_release(store, model, "bad-sum", k=7.0))
    return "bad-sum"


def _broken_config(store: Path, model: str) -> str:
    write_broken_config_release(store, model, "bad-config")
    return "bad-config"


def _fails_initialize(store: Path, model: str) -> str:
    write_scale_release(store, model, "bad-init", k=7.0, fail_init=True)
    return "bad-init"


def _syntax_error(store: Path, model: str) -> str:
    write_scale_release(store, model, "bad-syntax", k=7.0, syntax_error=True)
    return "bad-syntax"


REFUSED_BEFORE_WORK = ("release_not_found", "release_incomplete")


def _manifest_not_utf8(store: Path, model: str) -> str:
    release = write_scale_release(store, model, "latin1-sums", k=7.0)
    (release / "1" / "caf\u00e9.bin").write_bytes(b"named in Latin-1 below")
    sums = release / SHA256SUMS
    line = f"{hashlib.sha256(b'named in Latin-1 below').hexdigest()}  1/caf\u00e9.bin\n"
    sums.write_bytes(sums.read_bytes() + line.encode("latin-1"))
    return "latin1-sums"


def _missing(store: Path, model: str) -> str:
    return "does-not-exist"


def _no_checksums(store: Path, model: str) -> str:
    write_scale_release(store, model, "unpublished", k=7.0, checksums=False)
    return "unpublished"


class TestBadReleases:
    """Refusals that share one serving model (the `serving` fixture)."""

    @pytest.mark.parametrize(
        ("make_release", "status", "code", "says"),
        [
            (_mismatch, 422, "checksum_mismatch", "1/model.py"),
            (_broken_config, 422, "invalid_model_config", "config.pbtxt"),
            (_fails_initialize, 422, "triton_load_failed", "initialize failed on purpose"),
            (_manifest_not_utf8, 422, "invalid_release", "is not UTF-8 text"),
            (_syntax_error, 422, "invalid_release", "1/model.py line "),
            (_missing, 404, "release_not_found", "does-not-exist"),
            (_no_checksums, 409, "release_incomplete", "SHA256SUMS"),
        ],
        ids=[
            "checksum-mismatch",
            "broken-config",
            "fails-initialize",
            "manifest-not-utf8",
            "syntax-error",
            "missing",
            "no-checksums",
        ],
    )
    def test_a_bad_release_is_refused_and_the_serving_release_keeps_serving(
        self,
        serving: Serving,
        make_release: Callable[[Path, str], str],
        status: int,
        code: str,
        says: str,
    ) -> None:
        release = make_release(serving.store, serving.model)
        model_dir = serving.daemon.repository / serving.model
        before = snapshot(model_dir)

        response = serving.daemon.deploy(serving.model, release)

        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code
        assert says in error["message"]
        assert snapshot(model_dir) == before
        assert serving.daemon.staging_leftovers() == []
        assert infer_once(serving.triton.grpc_url, serving.model) == 2.0
        model = serving.daemon.get(f"/v1/models/{serving.model}").json()
        assert model["active_release"] == "r2"
        assert model["triton"]["state"] == "READY"
        operations = serving.daemon.get(f"/v1/operations?model={serving.model}&limit=50").json()
        tried = [op for op in operations["operations"] if op["release"] == release]
        if code in REFUSED_BEFORE_WORK:  # a refusal before any work is an answer, not an operation
            assert tried == []
            assert "operation_id" not in response.json()
        else:
            assert [op["error"]["code"] for op in tried] == [code]


def test_a_failed_first_deploy_leaves_no_model_behind(
    daemons: DaemonFactory, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0, fail_init=True)
    daemon = daemons(store, config=INPLACE)

    response = daemon.deploy(model_name, "r1")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "triton_load_failed"
    assert not (daemon.repository / model_name).exists()
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert model["active_release"] is None
    assert model["triton"]["state"] != "READY"


def test_a_second_deploy_of_the_same_model_is_refused_while_one_runs(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0, init_sleep=3.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    daemon = daemons(store, config=INPLACE)

    first = daemon.deploy(model_name, "r1", wait=False)
    second = daemon.deploy(model_name, "r2", wait=False)

    assert first.status_code == 202
    running = first.json()["operation"]["id"]
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "operation_in_progress"
    assert second.json()["operation_id"] == running
    assert running in second.json()["error"]["message"]
    assert daemon.wait_operation(running)["status"] == "succeeded"
    assert infer_once(triton.grpc_url, model_name) == 1.0
    # Once the first has finished, the model takes deploys again.
    assert daemon.deploy(model_name, "r2").status_code == 200


def test_rollback_serves_the_previous_release_and_is_recorded(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    daemon = daemons(store, config=INPLACE)
    refused = daemon.post(f"/v1/models/{model_name}/rollback", {"wait": True})
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "model_not_found"
    assert daemon.deploy(model_name, "r1").status_code == 200
    no_previous = daemon.post(f"/v1/models/{model_name}/rollback", {"wait": True})
    assert no_previous.status_code == 409
    assert no_previous.json()["error"]["code"] == "no_previous_release"
    assert daemon.deploy(model_name, "r2").status_code == 200

    response = daemon.post(f"/v1/models/{model_name}/rollback", {"wait": True})

    assert response.status_code == 200, response.text
    operation = response.json()["operation"]
    assert operation["kind"] == "rollback"
    assert operation["release"] == "r1"
    assert operation["from_release"] == "r2"
    assert infer_once(triton.grpc_url, model_name) == 1.0
    recorded = daemon.get(f"/v1/operations/{operation['id']}").json()["operation"]
    assert recorded["status"] == "succeeded"
    assert [step["name"] for step in recorded["steps"]] == [
        "resolve",
        "fetch",
        "verify",
        "headroom",
        "place",
        "load",
        "record",
        "publish",  # the fleet's desired state (a fleet of one here) moves last
    ]
    assert all(step["duration_seconds"] is not None for step in recorded["steps"])
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert (model["active_release"], model["previous_release"]) == ("r1", "r2")
    # Rolling back again swaps them back: the previous release is always one step away.
    again = daemon.post(f"/v1/models/{model_name}/rollback", {"to": "previous", "wait": True})
    assert again.json()["operation"]["release"] == "r2"
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_unload_takes_the_model_out_of_triton_and_the_repository(
    daemons: DaemonFactory, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = daemons(store, config=INPLACE)
    assert daemon.deploy(model_name, "r1").status_code == 200

    response = daemon.post(f"/v1/models/{model_name}/unload", {"wait": True})

    assert response.status_code == 200, response.text
    assert not (daemon.repository / model_name).exists()
    model = daemon.get(f"/v1/models/{model_name}").json()
    assert model["triton"]["state"] == "UNAVAILABLE"
    assert model["active_release"] is None
    assert model["previous_release"] == "r1"


def test_a_release_published_into_a_local_store_is_deployed_by_its_event_alone(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    """With polls and full scans an hour apart, only the store's event can bring r2 in: the
    beat it wakes lists the one model that changed."""
    write_scale_release(store, model_name, "r1", k=1.0)
    config = (
        f"{INPLACE}store:\n  poll_interval_seconds: 3600\n  full_scan_seconds: 3600\n"
        f"models:\n  {model_name}:\n    auto_deploy: true\n"
    )
    daemon = daemons(store, config=config)
    eventually(lambda: _answers(triton, model_name) == 1.0, 60, "r1 auto-deployed")
    eventually(lambda: "a beat lists only" in daemon.log(), 30, "the store's watch is set up")
    staged = write_scale_release(store.parent / "publishing", model_name, "r2", k=2.0)

    staged.rename(store / model_name / "r2")  # a finished release moved into the store

    eventually(lambda: _answers(triton, model_name) == 2.0, 60, "r2 deployed by its event")
    operation = daemon.get(f"/v1/operations?model={model_name}&limit=1").json()["operations"][0]
    assert (operation["release"], operation["trigger"]) == ("r2", "watcher")


def _answers(triton: RunningTriton, model: str) -> float | None:
    try:
        return infer_once(triton.grpc_url, model)
    except Exception:  # not served (yet): what the poll waits out
        return None
