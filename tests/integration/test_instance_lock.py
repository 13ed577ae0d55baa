"""One daemon per state: a second `controlplane serve` on a repository or database that a
running daemon manages is refused, names that daemon, and leaves its work alone.

Real daemon processes against the session Triton. The refused daemon must exit before it
reconciles anything, so the first one's deploy, caught in the middle of a slow load, ends as
if nothing had happened.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from controlplane.adapters.instance_lock import LOCK_NAME
from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually

pytestmark = pytest.mark.triton

EXIT_USAGE = 2


def assert_refused(second: Daemon, first: Daemon, what: str, lock_file: Path) -> None:
    """The second daemon exited 2, naming the holder, the lock file and what to do."""
    log = second.log()
    assert second.process.returncode == EXIT_USAGE, log
    assert f"{what} is in use by another controlplane daemon:" in log
    assert f"pid {first.process.pid} on host {socket.gethostname()}, started " in log
    assert f"API {first.url}" in log
    assert f"lock file: {lock_file}" in log
    assert "Stop that daemon first" in log
    assert "Traceback" not in log
    assert "reconcile" not in log  # refused before it touched anything


def load_running(daemon: Daemon, operation_id: str) -> bool:
    operation = daemon.get(f"/v1/operations/{operation_id}").json()["operation"]
    return any(s["name"] == "load" and s["status"] == "running" for s in operation["steps"])


def test_a_second_daemon_on_the_same_state_is_refused_and_the_first_deploy_goes_on(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, tmp_path: Path
) -> None:
    write_scale_release(store, model_name, "r1", k=3.0, init_sleep=3)
    workdir = tmp_path / "shared"
    workdir.mkdir()
    first = daemons(store, workdir=workdir)
    started = first.deploy(model_name, "r1", wait=False)
    assert started.status_code == 202, started.text
    operation_id = started.json()["operation"]["id"]
    eventually(lambda: load_running(first, operation_id), 30, "the first daemon's load started")

    second = daemons(store, workdir=workdir, log_name="second.log", expect_exit=True)

    assert_refused(
        second, first, f"the repository {triton.repository}", triton.repository / LOCK_NAME
    )
    assert first.wait_operation(operation_id)["status"] == "succeeded"
    assert infer_once(triton.grpc_url, model_name) == 3.0
    assert first.get("/readyz").status_code == 200


def test_a_second_daemon_on_the_same_database_with_another_repository_is_refused(
    daemons: DaemonFactory, store: Path, tmp_path: Path
) -> None:
    first = daemons(store)

    second = daemons(
        store,
        repository=tmp_path / "another-repository",
        database=first.database,
        expect_exit=True,
    )

    lock_file = first.database.with_name(first.database.name + ".lock")
    assert_refused(second, first, f"the database {first.database}", lock_file)
    assert "database.path of its own" in second.log()
    assert first.get("/readyz").status_code == 200


def test_a_second_daemon_on_the_same_repository_with_another_database_is_refused(
    daemons: DaemonFactory, store: Path, triton: RunningTriton
) -> None:
    first = daemons(store)

    second = daemons(store, expect_exit=True)  # its own workdir: its own database and staging

    assert second.database != first.database
    assert_refused(
        second, first, f"the repository {triton.repository}", triton.repository / LOCK_NAME
    )
    assert "repository.path of its own" in second.log()
    assert first.get("/readyz").status_code == 200


def test_after_sigkill_of_the_holder_a_new_daemon_starts_without_clean_up(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton, tmp_path: Path
) -> None:
    write_scale_release(store, model_name, "r1", k=2.0)
    workdir = tmp_path / "state"
    workdir.mkdir()
    first = daemons(store, workdir=workdir)
    assert first.deploy(model_name, "r1").status_code == 200
    first.kill()

    restarted = daemons(store, workdir=workdir, log_name="restarted.log")

    holder = json.loads((triton.repository / LOCK_NAME).read_text(encoding="utf-8"))
    assert holder["pid"] == restarted.process.pid
    assert holder["api"] == restarted.url
    model = restarted.get(f"/v1/models/{model_name}").json()
    assert model["active_release"] == "r1"
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_a_daemon_whose_api_port_is_taken_is_refused_before_it_starts(
    daemons: DaemonFactory, store: Path
) -> None:
    """A tester's daemon ran start-up reconcile against Triton and only then exited 3 on
    'address already in use'; it must refuse at once, saying which address and what to do."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]

        refused = daemons(store, extra_env={"CONTROLPLANE_API__PORT": str(port)}, expect_exit=True)

    log = refused.log()
    assert refused.process.returncode == EXIT_USAGE, log
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in log
    assert "set api.port / CONTROLPLANE_API__PORT" in log
    assert "reconcile" not in log
    assert "Traceback" not in log
