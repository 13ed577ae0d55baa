"""``controlplane config --effective --url``: the running daemon's settings, as a user asks.

The daemon is started with a setting that is not the default, both tokens and a URL that
carries a password; the command prints what the daemon runs with, and neither token nor the
password ever reaches the output. Its errors exit as other client commands' do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from devtools.launcher import RunningTriton, free_port
from tests.support.daemon import Daemon, start_daemon
from tests.support.models import write_scale_release

pytestmark = pytest.mark.triton
WRITE, READ, PASSWORD = "wr1te-token-for-config", "r3ad-token-for-config", "hunter2"
EXIT_FAILED, EXIT_UNREACHABLE = 1, 3


@pytest.fixture(scope="module")
def daemon(triton: RunningTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("config-remote")
    store = workdir / "store"
    write_scale_release(store, "configured", "r1", k=1.0)
    running = start_daemon(
        triton=triton,
        store=store,
        workdir=workdir,
        extra_env={
            "CONTROLPLANE_API__TOKEN": WRITE,
            "CONTROLPLANE_API__READ_TOKEN": READ,
            "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": "7",
            "CONTROLPLANE_ROLLBACK__PROMETHEUS_URL": f"http://admin:{PASSWORD}@prom:9090",
        },
    )
    try:
        yield running
    finally:
        running.stop()


def config(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    return subprocess.run(
        [sys.executable, "-m", "controlplane", "config", "--effective", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_running_daemons_settings_print_with_its_tokens_masked(daemon: Daemon) -> None:
    result = config("--url", daemon.url, "--token", READ)

    assert result.returncode == 0, result.stderr
    for secret in (WRITE, READ, PASSWORD):
        assert secret not in result.stdout
    effective = yaml.safe_load(result.stdout)
    assert effective["store"]["poll_interval_seconds"] == 7.0
    assert effective["api"]["token"] == "********"
    assert effective["api"]["read_token"] == "********"
    assert effective["rollback"]["prometheus_url"] == "http://admin:********@prom:9090"
    lines = result.stdout.splitlines()
    assert "  poll_interval_seconds: 7.0  # from the running daemon" in lines
    assert '  token: "********"  # from the running daemon' in lines


def test_the_token_comes_from_the_environment_as_for_other_commands(daemon: Daemon) -> None:
    result = config("--url", daemon.url, CONTROLPLANE_TOKEN=WRITE)

    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["store"]["poll_interval_seconds"] == 7.0


def test_without_the_token_the_command_says_how_to_give_it(daemon: Daemon) -> None:
    result = config("--url", daemon.url)

    assert result.returncode == EXIT_FAILED
    assert result.stdout == ""
    assert "error: unauthorized:" in result.stderr
    assert "--token or CONTROLPLANE_TOKEN" in result.stderr


def test_a_daemon_that_cannot_be_reached_exits_3() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    result = config("--url", url)

    assert result.returncode == EXIT_UNREACHABLE
    assert f"cannot reach the control plane at {url}" in result.stderr


class _OlderDaemon(BaseHTTPRequestHandler):
    """Answers every path as a daemon without GET /v1/config does: 404 not_found."""

    def do_GET(self) -> None:
        body = b'{"error": {"code": "not_found", "message": "Not Found"}}'
        self.send_response(404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def older_daemon() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OlderDaemon)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_daemon_older_than_the_route_is_named_as_such(older_daemon: str) -> None:
    result = config("--url", older_daemon)

    assert result.returncode == EXIT_FAILED
    assert "has no GET /v1/config: it is older than this client" in result.stderr
