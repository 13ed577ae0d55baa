"""The CLI as a CI job runs it: exit codes, one line per finished step, readable status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.adapters.triton.launcher import RunningTriton, free_port
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release

pytestmark = pytest.mark.triton


def cli(daemon_url: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env["CONTROLPLANE_URL"] = daemon_url
    if token is not None:
        env["CONTROLPLANE_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "controlplane", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_deploy_wait_prints_each_step_and_exits_0(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    write_scale_release(store, model_name, "r2", k=2.0)
    daemon: Daemon = daemons(store, token="cli-token")

    result = cli(daemon.url, "deploy", model_name, "r1", "--wait", token="cli-token")

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    steps = [line.split()[1] for line in lines if line.startswith("  ok ")]
    assert steps == [  # blue-green, the default strategy
        "resolve",
        "fetch",
        "verify",
        "check",
        "headroom",
        "place",
        "load",
        "preflight",
        "switch",
        "record",
        "publish",  # the fleet (on by default) records what serves now
    ]
    assert all(line.split()[2].replace(".", "").isdigit() for line in lines if "  ok " in line)
    assert lines[-1].startswith("succeeded in ")
    assert infer_once(triton.grpc_url, model_name) == 1.0
    operation = daemon.get("/v1/operations?limit=1").json()["operations"][0]
    assert operation["trigger"] == "cli"

    result = cli(daemon.url, "deploy", model_name, "r2", "--wait", token="cli-token")
    assert result.returncode == 0, result.stderr
    status = cli(daemon.url, "status", model_name)
    assert status.returncode == 0
    assert "active:    r2" in status.stdout
    assert "previous:  r1" in status.stdout
    assert "READY" in status.stdout

    rollback = cli(daemon.url, "rollback", model_name, "--wait", token="cli-token")
    assert rollback.returncode == 0, rollback.stderr
    assert infer_once(triton.grpc_url, model_name) == 1.0


def test_a_failed_deploy_exits_1_with_the_error_code(
    daemons: DaemonFactory, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0, fail_init=True)
    daemon = daemons(store)

    result = cli(daemon.url, "deploy", model_name, "r1", "--wait")

    assert result.returncode == 1
    assert "FAILED load" in result.stdout
    assert "triton_load_failed" in result.stderr
    missing = cli(daemon.url, "deploy", model_name, "nope", "--wait")
    assert missing.returncode == 1
    assert "release_not_found" in missing.stderr


def test_without_a_token_the_cli_is_refused_and_says_why(
    daemons: DaemonFactory, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = daemons(store, token="needed")

    result = cli(daemon.url, "deploy", model_name, "r1")

    assert result.returncode == 1
    assert "unauthorized" in result.stderr


def test_an_unreachable_daemon_exits_3() -> None:
    result = cli(f"http://127.0.0.1:{free_port()}", "status")
    assert result.returncode == 3
    assert "cannot reach the control plane" in result.stderr
