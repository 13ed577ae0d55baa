"""Errors that point at the cause, as a user meets them: a store that is not there, a bucket
that does not exist, a Triton address where no Triton answers. Each is said with the setting to
fix in `controlplane status`, in the deploy's refusal (HTTP and CLI), in /readyz and the log;
and the daemon recovers by itself once the cause is gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.launcher import free_ports
from tests.conftest import TritonFactory
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.fault_proxy import FaultProxy
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import aws_env, s3_client, upload_release_dir
from tests.support.s3_fixtures import fault_proxy, moto_endpoint  # noqa: F401

pytestmark = pytest.mark.triton

NO_FLEET = {"CONTROLPLANE_FLEET__ENABLED": "false"}


def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env["CONTROLPLANE_URL"] = daemon.url
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def refusal(daemon: Daemon, model: str, release: str = "r1") -> httpx.Response | None:
    """The deploy's answer once the daemon answers writes (None while it starts up)."""
    try:
        response = daemon.deploy(model, release, wait=False)
    except httpx.TransportError:
        return None
    if response.status_code == 503 and response.json()["error"]["code"] == "not_ready":
        return None
    return response


def refused(daemon: Daemon, model: str) -> httpx.Response:
    answers: list[httpx.Response] = []

    def answered() -> bool:
        found = refusal(daemon, model)
        if found is not None:
            answers.append(found)
        return found is not None

    eventually(answered, 60, "the daemon answering a deploy", every=0.2)
    return answers[-1]


@pytest.mark.parametrize("fleet", [True, False], ids=["fleet", "no-fleet"])
def test_a_store_dir_that_does_not_exist_is_said_in_status_and_on_deploy(
    daemons: DaemonFactory, tmp_path: Path, model_name: str, fleet: bool
) -> None:
    missing = tmp_path / "no-such-store"
    says = f"the store {missing.as_uri()} does not exist (store.uri): create it or fix the setting"
    daemon = daemons(missing, wait_ready=False, extra_env={} if fleet else NO_FLEET)

    answer = refused(daemon, model_name)
    status = cli(daemon, "status")
    deploy = cli(daemon, "deploy", model_name, "r1")

    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "store_unavailable"
    assert says in answer.json()["error"]["message"]
    assert deploy.returncode == 1
    assert f"error: store_unavailable: {says}" in deploy.stderr
    assert status.returncode == 0, status.stderr
    assert f"store: store_unavailable: {says}" in status.stdout
    assert (
        daemon.get("/v1/models")
        .json()["store_error"]
        .endswith("create it or fix the setting (or mount the share it is on)")
    )
    assert says in daemon.log()
    # Once it is there, it is a store like any other.
    write_scale_release(missing, model_name, "r1", k=1.0)
    eventually(
        lambda: daemon.deploy(model_name, "r1").status_code == 200, 60, "a deploy from the store"
    )


def test_a_bucket_that_does_not_exist_is_said_in_status_and_on_deploy(
    daemons: DaemonFactory,
    tmp_path: Path,
    model_name: str,
    moto_endpoint: str,  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
) -> None:
    bucket = f"absent-{os.getpid()}-{model_name[-6:]}"
    says = (
        f"bucket {bucket!r} does not exist at {fault_proxy.endpoint} (store.uri): create it or "
        "fix the setting"
    )
    daemon = daemons(
        tmp_path,
        store_uri=f"s3://{bucket}/prod",
        wait_ready=False,
        extra_env=aws_env(fault_proxy.endpoint),
    )

    answer = refused(daemon, model_name)
    beats_before = fault_proxy.puts("_controlplane/members/")
    status = cli(daemon, "status")
    deploy = cli(daemon, "deploy", model_name, "r1")
    beats = fault_proxy.puts("_controlplane/members/") - beats_before

    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "store_error"
    assert says in answer.json()["error"]["message"]
    assert deploy.returncode == 1
    assert f"error: store_error: {says}" in deploy.stderr
    assert f"store: store_error: {says}" in status.stdout
    # The refused heartbeat is tried again about once a second, not in a busy loop (it was
    # tens of PUTs a second).
    assert beats <= 10, beats
    # Once the bucket is there, the store serves.
    publisher = s3_client(moto_endpoint)
    try:
        publisher.create_bucket(Bucket=bucket)
        release = write_scale_release(tmp_path / "to-publish", model_name, "r1", k=1.0)
        upload_release_dir(publisher, bucket, "prod", release)
    finally:
        publisher.close()
    eventually(lambda: daemon.deploy(model_name, "r1").status_code == 200, 60, "a deploy from S3")


def _ready(daemon: Daemon) -> dict[str, Any] | None:
    try:
        response = daemon.get("/readyz")
    except httpx.TransportError:
        return None
    body: dict[str, Any] = response.json()
    return body


def test_a_wrong_triton_url_is_said_with_the_url_until_triton_comes_up(
    daemons: DaemonFactory, own_triton: TritonFactory, tmp_path: Path, model_name: str
) -> None:
    ports = free_ports()  # nothing listens there yet: the connection is refused
    url = f"127.0.0.1:{ports.grpc}"
    repository = tmp_path / "root" / "repository"
    repository.mkdir(parents=True)
    store = tmp_path / "store"
    write_scale_release(store, model_name, "r1", k=1.0)
    says = (
        f"Triton at {url} cannot be reached (triton.grpc_url): the connection was refused: "
        "nothing listens on that port; check that Triton runs and serves gRPC at that address"
    )
    daemon = daemons(
        store,
        repository=repository,
        wait_ready=False,
        extra_env={
            "CONTROLPLANE_TRITON__GRPC_URL": url,
            "CONTROLPLANE_TRITON__METRICS_URL": f"http://127.0.0.1:{ports.metrics}/metrics",
        },
    )

    eventually(
        lambda: (body := _ready(daemon)) is not None and says in str(body), 30, "/readyz saying so"
    )
    ready = daemon.get("/readyz")
    answer = daemon.deploy(model_name, "r1", wait=False)
    status = cli(daemon, "status")
    deploy = cli(daemon, "deploy", model_name, "r1")

    assert ready.status_code == 503
    assert ready.json()["error"]["code"] == "not_ready"
    assert answer.status_code == 503
    assert says in answer.json()["error"]["message"]
    assert (
        "Start-up waits for Triton: retry once it can be reached"
        in answer.json()["error"]["message"]
    )
    assert f"triton: {says}" in status.stderr  # what is wrong with the daemon itself
    assert deploy.returncode == 1
    assert says in deploy.stderr
    assert says in daemon.log()
    assert daemon.log().count("cannot be reached (triton.grpc_url)") == 1  # said once, not per try

    # Triton comes up at that address: the daemon, which kept trying, is ready and deploys.
    own_triton(repository, ports=ports)
    eventually(lambda: daemon.get("/readyz").status_code == 200, 60, "readiness once Triton is up")
    assert daemon.deploy(model_name, "r1").status_code == 200
    assert f"Triton at {url} is live" in daemon.log()
    healthz = daemon.get("/healthz").json()["triton"]
    assert healthz == {"url": url, "live": True, "problem": None}


def test_a_triton_url_where_nothing_answers_is_said_within_the_call_timeout(
    daemons: DaemonFactory, tmp_path: Path
) -> None:
    # A server that accepts connections and never answers (a proxy that holds them, a service
    # that is not Triton): said as such within the call's timeout, not as "reconciling".
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        held: list[socket.socket] = []
        accepting = threading.Thread(target=_hold, args=(silent, held), daemon=True)
        accepting.start()
        url = f"127.0.0.1:{silent.getsockname()[1]}"
        daemon = daemons(
            tmp_path / "store",
            repository=tmp_path / "root" / "repository",
            wait_ready=False,
            extra_env={
                "CONTROLPLANE_TRITON__GRPC_URL": url,
                "CONTROLPLANE_TRITON__CALL_TIMEOUT_SECONDS": "4",
            },
        )
        says = f"Triton at {url} cannot be reached (triton.grpc_url): "
        eventually(lambda: says in str(_ready(daemon)), 30, "/readyz saying why", 0.2)
        problem = daemon.get("/healthz").json()["triton"]["problem"]
        daemon.stop()
    for sock in held:
        sock.close()
    assert problem.startswith(says)
    assert "no answer within 4 s (triton.call_timeout_seconds)" in problem or (
        "no gRPC answer comes" in problem
    ), problem


def _hold(server: socket.socket, held: list[socket.socket]) -> None:
    """Accept every connection and keep it open, saying nothing, until the server closes."""
    while True:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        held.append(connection)


def test_a_fleet_wait_on_a_daemon_of_no_fleet_says_to_leave_it_out(
    daemons: DaemonFactory, tmp_path: Path, model_name: str
) -> None:
    store = tmp_path / "store"
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = daemons(store, extra_env=NO_FLEET)

    answer = daemon.post(
        f"/v1/models/{model_name}/deploy", {"release": "r1", "wait": True, "fleet": True}
    )
    deploy = cli(daemon, "deploy", model_name, "r1", "--wait", "--fleet")

    assert answer.status_code == 400, answer.text
    assert "leave out 'fleet': true (the CLI's --fleet)" in answer.json()["error"]["message"]
    assert deploy.returncode == 1, deploy.stderr
    assert "to wait for this daemon alone" in deploy.stderr
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] is None  # none ran
