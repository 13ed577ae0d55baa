"""Start the tritonserver bundled in the nvidia-pytriton wheel as a child process.

Owns everything about running *our own* Triton: finding the server inside the wheel, preparing
a writable copy of its tree with the Python-backend stub for the running interpreter, the
environment it needs, free ports, and the wait until it is live. `make run`
(`devtools.devrun`), the benchmarks and the integration-test fixtures use it; in production the
daemon connects to a Triton it did not start, so `controlplane` never imports this module (an
import-linter contract) and the wheel does not ship it. It checks health with httpx, not
tritonclient, so it works without the gRPC client.

Why a copy of the tree: the Python backend looks for `triton_python_backend_stub` next to
`libtriton_python.so`, and the wheel ships one stub per Python version in a separate folder.

Invariants:

- A prepared tree is reused only when its completion marker exists. The tree is built in a
  temp dir beside its final place, the marker is written last, and then the temp dir is renamed
  into place, so a half copy is never reused.
- `launch_triton` either returns a live server or raises with the tail of Triton's log; it
  never leaves a process behind when it fails.

Errors:

    RuntimeError
    ├── TritonNotFoundError   the wheel with the server (nvidia-pytriton) is not installed
    └── TritonStartError      the server exited early or was not live before the deadline
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

__all__ = [
    "RunningTriton",
    "TritonNotFoundError",
    "TritonPorts",
    "TritonStartError",
    "free_port",
    "free_ports",
    "launch_triton",
    "port_is_free",
    "prepare_server_tree",
]

_DISTRIBUTION = "nvidia-pytriton"
_MARKER = ".complete"
_LOOPBACK = "127.0.0.1"
_POLL_INTERVAL = 0.1
# How Triton (its HTTP, gRPC and metrics servers) reports a port that is already taken.
_PORT_IN_USE = re.compile(r"address already in use|already in use|EADDRINUSE", re.IGNORECASE)
_INSTALL_HINT = "install it with `pip install 'controlplane[triton]'` (or run `make install`)"


class TritonNotFoundError(RuntimeError):
    """The bundled tritonserver (the nvidia-pytriton wheel) is not installed."""


class TritonStartError(RuntimeError):
    """tritonserver exited early or did not become live in time; the message holds its log."""


@dataclass(frozen=True)
class TritonPorts:
    """The three ports one Triton listens on, all on loopback."""

    http: int
    grpc: int
    metrics: int

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.http, self.grpc, self.metrics)


def free_ports() -> TritonPorts:
    """Three distinct ports that were free on 127.0.0.1 a moment ago (the kernel's choice)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(3)]
    try:
        # Hold all three at once so the kernel cannot hand out the same port twice.
        for sock in sockets:
            sock.bind((_LOOPBACK, 0))
        http, grpc, metrics = (int(sock.getsockname()[1]) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()
    return TritonPorts(http=http, grpc=grpc, metrics=metrics)


def free_port() -> int:
    """One port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = _LOOPBACK) -> bool:
    """Whether a server could listen on host:port now.

    SO_REUSEADDR makes a port held only by TIME_WAIT connections (a server that just stopped)
    count as free, as it does for the servers themselves; a listener still makes it busy.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _wheel_server_dir() -> Path:
    """`site-packages/pytriton/tritonserver`, found without importing pytriton."""
    spec = importlib.util.find_spec("pytriton")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        server_dir = Path(location) / "tritonserver"
        if (server_dir / "bin" / "tritonserver").is_file():
            return server_dir
    raise TritonNotFoundError(
        f"the bundled tritonserver was not found (package {_DISTRIBUTION} is missing or "
        f"incomplete for {sys.executable}): {_INSTALL_HINT}"
    )


def _wheel_libs_dir(server_dir: Path) -> Path:
    """The wheel's shared libraries (`site-packages/nvidia_pytriton.libs`)."""
    libs = server_dir.parent.parent / "nvidia_pytriton.libs"
    if not libs.is_dir():
        raise TritonNotFoundError(f"{libs} is missing; reinstall {_DISTRIBUTION}: {_INSTALL_HINT}")
    return libs


def _pytriton_version() -> str:
    try:
        return importlib.metadata.version(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise TritonNotFoundError(f"{_DISTRIBUTION} is not installed: {_INSTALL_HINT}") from exc


def _python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def prepare_server_tree(cache_dir: Path) -> Path:
    """A writable copy of the wheel's server tree with the stub for this Python; returns its root.

    The copy lives in `cache_dir/tritonserver-<pytriton version>-py<major.minor>/` and is made
    once: later calls (and other processes) reuse it when its completion marker is present.
    """
    source = _wheel_server_dir()
    python = _python_version()
    root = cache_dir / f"tritonserver-{_pytriton_version()}-py{python}"
    if (root / _MARKER).is_file():
        return root
    stub = source / "python_backend_stubs" / python / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonNotFoundError(
            f"{_DISTRIBUTION} has no Python backend stub for Python {python} (looked for {stub})"
        )

    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=cache_dir))
    try:
        shutil.copytree(
            source,
            staging,
            symlinks=True,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copy2(stub, staging / "backends" / "python" / stub.name)
        (staging / _MARKER).write_text(f"{_DISTRIBUTION} from {source}\n", encoding="utf-8")
        if root.exists() and not (root / _MARKER).is_file():
            shutil.rmtree(root)  # left by something else; never a tree of ours (no marker)
        try:
            staging.rename(root)
        except OSError:
            # Another process published the same tree first: use theirs.
            if not (root / _MARKER).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


class RunningTriton:
    """A tritonserver child process and where to reach it. Stop it with `stop()` or `with`."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        ports: TritonPorts,
        repository: Path,
        log_path: Path,
    ) -> None:
        self.process = process
        self.ports = ports
        self.repository = repository
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def grpc_url(self) -> str:
        return f"{_LOOPBACK}:{self.ports.grpc}"

    @property
    def http_url(self) -> str:
        return f"http://{_LOOPBACK}:{self.ports.http}"

    @property
    def metrics_url(self) -> str:
        return f"http://{_LOOPBACK}:{self.ports.metrics}/metrics"

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, wait up to `timeout` s, then SIGKILL; returns the exit code. Idempotent.

        Triton runs in its own session, so once it has exited any Python-backend stub it left
        behind is killed with its process group.
        """
        process = self.process
        if process.poll() is None:
            try:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()
                process.wait()
        self._kill_group()
        code = process.returncode
        assert code is not None
        return code

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def log_tail(self, n: int = 40) -> str:
        """The last `n` lines of Triton's log ('' when there is none yet)."""
        try:
            with self.log_path.open("rb") as log:
                size = log.seek(0, os.SEEK_END)
                log.seek(max(0, size - 256 * n))
                data = log.read()
        except FileNotFoundError:
            return ""
        return "\n".join(data.decode("utf-8", errors="replace").splitlines()[-n:])

    def __enter__(self) -> RunningTriton:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"RunningTriton(pid={self.pid}, ports={self.ports}, repository={self.repository})"


def _environment(libs: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The stub imports model code with the first python on PATH: it must be this venv's, or
    # `import numpy` in a model fails and the load ends FAILED.
    venv_bin = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join(p for p in (venv_bin, env.get("PATH", "")) if p)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(libs), env.get("LD_LIBRARY_PATH", "")) if p
    )
    return env


def _command(
    tree: Path, repository: Path, ports: TritonPorts, extra_args: Sequence[str]
) -> list[str]:
    return [
        str(tree / "bin" / "tritonserver"),
        f"--model-repository={repository}",
        "--model-control-mode=explicit",
        "--strict-readiness=false",
        "--exit-timeout-secs=10",
        f"--backend-directory={tree / 'backends'}",
        f"--cache-directory={tree / 'caches'}",
        f"--http-address={_LOOPBACK}",
        f"--http-port={ports.http}",
        f"--grpc-address={_LOOPBACK}",
        f"--grpc-port={ports.grpc}",
        f"--metrics-address={_LOOPBACK}",
        f"--metrics-port={ports.metrics}",
        "--allow-metrics=true",
        *extra_args,  # last, so a caller can override any of the above
    ]


def _start(
    tree: Path,
    env: dict[str, str],
    repository: Path,
    ports: TritonPorts,
    log_path: Path,
    extra_args: Sequence[str],
) -> RunningTriton:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            _command(tree, repository, ports, extra_args),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            # Its own session: a Ctrl-C meant for our caller does not reach Triton directly
            # (the caller stops it in order), and its stubs can be killed as one group.
            start_new_session=True,
        )
    return RunningTriton(process, ports, repository, log_path)


def _metrics_enabled(extra_args: Sequence[str]) -> bool:
    """False when the caller turned the metrics server off (the last flag wins, as in Triton)."""
    flags = [arg for arg in extra_args if arg.startswith("--allow-metrics=")]
    return not flags or flags[-1].split("=", 1)[1].lower() not in ("false", "0", "no", "off")


def _wait_live(triton: RunningTriton, timeout: float, *, metrics: bool) -> str | None:
    """None once `/v2/health/live` (and `/metrics`) answer 200; otherwise why not.

    Triton starts gRPC, then HTTP, then metrics; waiting for the last one means every port
    listens when this returns.
    """
    urls = [f"{triton.http_url}/v2/health/live"]
    if metrics:
        urls.append(triton.metrics_url)
    deadline = time.monotonic() + timeout
    # trust_env=False: a proxy from the environment must not see loopback calls.
    with httpx.Client(trust_env=False) as client:
        while True:
            code = triton.process.poll()
            if code is not None:
                return f"tritonserver exited with code {code} before it was live"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return f"tritonserver was not live within {timeout:g} s"
            try:
                while urls and client.get(urls[0], timeout=min(1.0, remaining)).status_code == 200:
                    urls.pop(0)
            except httpx.TransportError:
                pass
            if not urls and triton.process.poll() is None:
                return None
            remaining = deadline - time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):
                triton.process.wait(timeout=max(0.0, min(_POLL_INTERVAL, remaining)))


def _failure_excerpt(triton: RunningTriton, n: int = 40) -> str:
    """The log's tail, minus the usage text Triton prints after a bad flag (it hides the cause)."""
    lines = triton.log_tail(n=1000).splitlines()
    usage = [i for i, text in enumerate(lines) if text.startswith("Usage: tritonserver")]
    return "\n".join(lines[: usage[0] if usage else None][-n:])


def launch_triton(
    repository: Path,
    *,
    cache_dir: Path,
    ports: TritonPorts | None = None,
    log_path: Path | None = None,
    extra_args: Sequence[str] = (),
    live_timeout: float = 60.0,
) -> RunningTriton:
    """Start tritonserver in EXPLICIT model-control mode on `repository`; return it once live.

    Without `ports`, it picks free ones and retries once with new ones if a port was taken
    in between. Its stdout and stderr go to `log_path` (default `cache_dir/triton-<grpc>.log`).
    Raises TritonNotFoundError when the wheel is missing, TritonStartError when the server
    does not come up (the process is stopped first; the message holds its log's tail).
    """
    repository = repository.resolve()
    if not repository.is_dir():
        raise TritonStartError(f"model repository {repository} is not a directory")
    server_dir = _wheel_server_dir()
    env = _environment(_wheel_libs_dir(server_dir))
    tree = prepare_server_tree(cache_dir)

    metrics = _metrics_enabled(extra_args)
    attempts = 1 if ports is not None else 2
    for attempt in range(1, attempts + 1):
        chosen = ports if ports is not None else free_ports()
        # Checked first because a probe cannot tell servers apart: while ours fails on a taken
        # port, another server there may answer the health check.
        taken = [port for port in chosen.as_tuple() if not port_is_free(port)]
        if taken and ports is not None:
            raise TritonStartError(f"cannot start tritonserver: port(s) {taken} in use")
        if taken:
            chosen = free_ports()
        log = log_path if log_path is not None else cache_dir / f"triton-{chosen.grpc}.log"
        triton = _start(tree, env, repository, chosen, log, extra_args)
        try:
            failure = _wait_live(triton, live_timeout, metrics=metrics)
        except BaseException:
            triton.stop(timeout=5.0)  # interrupted (Ctrl-C): leave nothing behind
            raise
        if failure is None:
            return triton
        triton.stop(timeout=10.0)
        tail = _failure_excerpt(triton)
        if attempt < attempts and _PORT_IN_USE.search(tail):
            continue
        raise TritonStartError(f"{failure}; last lines of {log}:\n{tail}")
    raise AssertionError("unreachable")
