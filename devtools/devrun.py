"""`make run`: the bundled Triton (CPU) and the daemon, wired to the example store (or the one
given with ``--store``, ``make run STORE=...``), on loopback.

Owns the development set-up only: a state dir `.state/` in the working directory, Triton
started with the launcher, the daemon started as a child process (`python -m controlplane
serve`) configured through the environment, a "what to try next" guide, and an orderly stop
(daemon first, then Triton) on Ctrl-C, SIGTERM or when the daemon dies; Triton is started
again when it exits, as a pod's kubelet would. Production runs the
daemon as a sidecar next to an existing Triton; nothing here is used there, and the wheel does
not ship it. Run it from the checkout's root (`make run`), where `devtools` is importable.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from devtools.launcher import (
    RunningTriton,
    TritonNotFoundError,
    TritonPorts,
    TritonStartError,
    free_port,
    free_ports,
    launch_triton,
    port_is_free,
)
from devtools.store_choice import StoreChoiceError, store_uri

_DEFAULT_TRITON_PORTS = TritonPorts(http=8000, grpc=8001, metrics=8002)
_DEFAULT_API_PORT = 8080
_READY_TIMEOUT = 60.0
_DAEMON_STOP_TIMEOUT = 10.0
_EXAMPLE_STORE = Path(__file__).resolve().parent.parent / "examples" / "store"


def _triton_ports() -> TritonPorts:
    if all(port_is_free(port) for port in _DEFAULT_TRITON_PORTS.as_tuple()):
        return _DEFAULT_TRITON_PORTS
    return free_ports()


def _daemon_env(state: Path, store: str, triton: RunningTriton, api_port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "CONTROLPLANE_TRITON__GRPC_URL": triton.grpc_url,
            "CONTROLPLANE_TRITON__METRICS_URL": triton.metrics_url,
            "CONTROLPLANE_REPOSITORY__PATH": str(state / "repository"),
            "CONTROLPLANE_STAGING__PATH": str(state / "staging"),
            "CONTROLPLANE_STORE__URI": store,
            "CONTROLPLANE_DATABASE__PATH": str(state / "controlplane.db"),
            "CONTROLPLANE_API__HOST": "127.0.0.1",
            "CONTROLPLANE_API__PORT": str(api_port),
        }
    )
    return env


def _wait_ready(daemon: subprocess.Popen[bytes], url: str, timeout: float) -> str | None:
    """None once `url` answers 200; otherwise why not (the daemon exited, or the deadline)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(trust_env=False) as client:
        while True:
            code = daemon.poll()
            if code is not None:
                return f"the daemon exited with code {code} before it was ready"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f"the daemon was not ready within {timeout:g} s"
            try:
                if client.get(url, timeout=min(1.0, remaining)).status_code == 200:
                    return None
            except httpx.TransportError:
                pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic())))


def _stop_daemon(daemon: subprocess.Popen[bytes]) -> None:
    if daemon.poll() is not None:
        return
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=_DAEMON_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        print(f"the daemon did not stop within {_DAEMON_STOP_TIMEOUT:g} s: killing it")
        daemon.kill()
        daemon.wait()


def _cli() -> str:
    cli = str(Path(sys.executable).parent / "controlplane")
    if not os.path.relpath(cli).startswith(".."):
        cli = os.path.relpath(cli)  # `.venv/bin/controlplane` when run from the checkout
    return cli


def _guide(triton: RunningTriton, api: str, log: Path, store: str) -> str:
    head = f"""
controlplane is running (Ctrl-C stops both).

  Triton   HTTP {triton.http_url}   gRPC {triton.grpc_url}   metrics {triton.metrics_url}
           log  {log}
  daemon   {api}   (store: {store})
"""
    if store == store_uri(None, _EXAMPLE_STORE):
        return head + _example_steps(triton, api)
    cli = _cli()
    return f"""{head}
Try it, with a model and a release of your store (MODEL/RELEASE/ under it):

  {cli} deploy MODEL RELEASE --wait --url {api}
  {cli} status MODEL --url {api}
  {cli} rollback MODEL --wait --url {api}
"""


def _example_steps(triton: RunningTriton, api: str) -> str:
    cli = _cli()
    infer = (
        f"curl -s -X POST {triton.http_url}/v2/models/example/infer "
        "-H 'Content-Type: application/json' -d "
        """'{"inputs":[{"name":"INPUT0","shape":[2],"datatype":"FP32","data":[1,2]}]}'"""
    )
    return f"""
Try it:

  # deploy release r1 of the example model (it doubles its input)
  {cli} deploy example r1 --wait --url {api}
  # infer through Triton: expect [2, 4]
  {infer}
  # switch to r2 (it triples), with no failed request on the way; then infer again: [3, 6]
  {cli} deploy example r2 --wait --url {api}
  # what is serving, what came before, and why
  {cli} status example --url {api}
  # go back to r1
  {cli} rollback example --wait --url {api}
  # the same over REST
  curl -s {api}/v1/models/example

A store of your own: make run STORE=/path/to/store (or STORE=s3://bucket/prefix).
"""


def _supervise(triton: RunningTriton, daemon: subprocess.Popen[bytes], cache_dir: Path) -> int:
    """Block until the daemon exits (1) or Ctrl-C / SIGTERM (0). Triton is started again when
    it exits, on its ports, as the kubelet or systemd would (``memory.on_not_returned:
    restart-triton`` stops it on purpose); 1 if it cannot be."""
    try:
        while True:
            code = daemon.poll()
            if code is not None:
                print(f"the daemon exited with code {code}; stopping", file=sys.stderr)
                return 1
            code = triton.process.poll()
            if code is not None:
                print(f"Triton exited with code {code}; starting it again", file=sys.stderr)
                log = triton.log_path.with_name(f"{triton.log_path.stem}-{int(time.time())}.log")
                try:
                    again = launch_triton(
                        triton.repository, cache_dir=cache_dir, ports=triton.ports, log_path=log
                    )
                except TritonStartError as exc:
                    print(f"Triton did not start again: {exc}; stopping", file=sys.stderr)
                    return 1
                triton.process, triton.log_path = again.process, again.log_path
                print(f"Triton is live again (log {log})", flush=True)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(timeout=0.5)
    except KeyboardInterrupt:
        print("\nstopping")
        return 0


def _run(state: Path, store: str) -> int:
    for sub in ("repository", "staging", "triton-cache"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    log = state / "triton.log"
    print("starting Triton (bundled, CPU) ...", flush=True)
    with launch_triton(
        state / "repository",
        cache_dir=state / "triton-cache",
        ports=_triton_ports(),
        log_path=log,
    ) as triton:
        api_port = _DEFAULT_API_PORT if port_is_free(_DEFAULT_API_PORT) else free_port()
        api = f"http://127.0.0.1:{api_port}"
        print(f"Triton is live at {triton.http_url}; starting the daemon ...", flush=True)
        daemon = subprocess.Popen(
            [sys.executable, "-m", "controlplane", "serve"],
            stdin=subprocess.DEVNULL,
            env=_daemon_env(state, store, triton, api_port),
            # Its own session, so Ctrl-C reaches only us and we stop the daemon in order.
            start_new_session=True,
        )
        try:
            failure = _wait_ready(daemon, f"{api}/readyz", _READY_TIMEOUT)
            if failure is not None:
                print(f"{failure}; see its output above", file=sys.stderr)
                return 1
            print(_guide(triton, api, log, store), flush=True)
            return _supervise(triton, daemon, state / "triton-cache")
        finally:
            # A second Ctrl-C must not cut the clean stop short; it is bounded anyway.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _stop_daemon(daemon)
            print("stopping Triton ...", flush=True)


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="make run", description="The bundled Triton and the daemon, on a store."
    )
    parser.add_argument(
        "--store",
        help="a directory of MODEL/RELEASE/ dirs or s3://bucket/prefix (default: examples/store)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        store = store_uri(_arguments(argv).store, _EXAMPLE_STORE)
    except StoreChoiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"store: {store}", flush=True)
    # SIGTERM takes the same path as Ctrl-C: a KeyboardInterrupt wherever we are waiting.
    # SIGINT is set too, since a shell starts background jobs with it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    state = Path.cwd() / ".state"
    try:
        return _run(state, store)
    except (TritonNotFoundError, TritonStartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
