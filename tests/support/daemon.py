"""The daemon as tests meet it: a real `controlplane serve` process on a free port.

Tests talk to it over HTTP like a CI job would, and kill it like the kernel would. Readiness is
polled with a deadline; every daemon started is stopped at teardown by the fixture that made it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from controlplane.adapters.instance_lock import LOCK_NAME
from devtools.launcher import RunningTriton, free_port


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    url: str
    env: dict[str, str]
    log_path: Path
    repository: Path
    staging: Path
    database: Path
    token: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    _http: httpx.Client | None = None

    def client(self, **kwargs: Any) -> httpx.Client:
        """A new client; the caller closes it."""
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=120.0, **kwargs)

    @property
    def http(self) -> httpx.Client:
        """One client kept open across calls (building one costs tens of ms)."""
        if self._http is None:
            self._http = self.client()
        return self._http

    def post(self, path: str, body: Mapping[str, Any]) -> httpx.Response:
        return self.http.post(path, json=dict(body))

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def deploy(self, model: str, release: str, *, wait: bool = True) -> httpx.Response:
        return self.post(f"/v1/models/{model}/deploy", {"release": release, "wait": wait})

    def wait_operation(self, operation_id: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            operation: dict[str, Any] = self.get(f"/v1/operations/{operation_id}").json()[
                "operation"
            ]
            if operation["status"] in ("succeeded", "failed", "interrupted"):
                return operation
            if time.monotonic() > deadline:
                raise AssertionError(f"operation {operation_id} still {operation['status']}")
            time.sleep(0.05)

    def _close_http(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def staging_leftovers(self) -> list[str]:
        """What is in staging besides the content cache and the daemon's lock: empty between
        operations."""
        if not self.staging.is_dir():
            return []
        return sorted(p.name for p in self.staging.iterdir() if p.name not in ("cas", LOCK_NAME))

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, timeout: float = 20.0) -> int:
        self._close_http()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as after an OOM kill or a node failure."""
        self._close_http()
        self.process.kill()
        self.process.wait()


def start_daemon(
    *,
    triton: RunningTriton,
    store: Path,
    workdir: Path,
    repository: Path | None = None,
    token: str | None = None,
    extra_env: Mapping[str, str] | None = None,
    ready_timeout: float = 120.0,
    log_name: str = "daemon.log",
    store_uri: str | None = None,
    config: str | None = None,
    database: Path | None = None,
    expect_exit: bool = False,
    wait_ready: bool = True,
    python: str | None = None,
    port: int | None = None,
) -> Daemon:
    """Start `controlplane serve` against `triton` and wait until /readyz answers 200.

    `config` is YAML for `--config`; `store_uri` replaces the local `store` (e.g. `s3://...`);
    `database` replaces `workdir/controlplane.db`. With `expect_exit`, the daemon is expected
    to refuse to start: this waits for it to exit and returns it (see `process.returncode`
    and `log()`), and raises if it becomes ready instead. `wait_ready=False` returns at once
    (to act on the daemon while it starts up). `python` runs it with another interpreter
    (a venv of its own) instead of this one. `port` is the API's (default: a free one; a
    restarted sidecar keeps its pod's, where a load balancer checks it).
    """
    repository = repository or triton.repository
    staging = workdir / "staging"
    database = database or workdir / "controlplane.db"
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONTROLPLANE_")}
    env.update(
        {
            "CONTROLPLANE_TRITON__GRPC_URL": triton.grpc_url,
            "CONTROLPLANE_TRITON__METRICS_URL": triton.metrics_url,
            "CONTROLPLANE_REPOSITORY__PATH": str(repository),
            "CONTROLPLANE_STAGING__PATH": str(staging),
            "CONTROLPLANE_STORE__URI": store_uri or store.as_uri(),
            "CONTROLPLANE_DATABASE__PATH": str(database),
            "CONTROLPLANE_API__HOST": "127.0.0.1",
            "CONTROLPLANE_API__PORT": str(port),
        }
    )
    if token is not None:
        env["CONTROLPLANE_API__TOKEN"] = token
    env.update(extra_env or {})
    log_path = workdir / log_name
    command = [python or sys.executable, "-m", "controlplane", "serve"]
    if config is not None:
        config_path = workdir / "controlplane.yaml"
        config_path.write_text(config, encoding="utf-8")
        command += ["--config", str(config_path)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    daemon = Daemon(
        process=process,
        url=f"http://127.0.0.1:{port}",
        env=env,
        log_path=log_path,
        repository=repository,
        staging=staging,
        database=database,
        token=token,
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    if not wait_ready:
        return daemon
    deadline = time.monotonic() + ready_timeout
    # One client for the whole wait: each httpx.get builds an SSL context (about 70 ms of CPU),
    # which polled every 50 ms took most of a core from the daemon it waited for.
    with httpx.Client(timeout=2.0) as probe:
        while True:
            if process.poll() is not None:
                if expect_exit:
                    return daemon
                tail = daemon.log()[-3000:]
                raise RuntimeError(f"daemon exited with {process.returncode}:\n{tail}")
            try:
                if probe.get(f"{daemon.url}/readyz").status_code == 200:
                    if expect_exit:
                        daemon.stop()
                        raise RuntimeError(f"daemon started but should not have:\n{daemon.log()}")
                    return daemon
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                daemon.stop()
                tail = daemon.log()[-3000:]
                raise RuntimeError(f"daemon not ready in {ready_timeout} s:\n{tail}")
            time.sleep(0.05)
