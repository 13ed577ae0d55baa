"""The real ``haproxy`` binary in front of a fleet's members, as a load balancer would be.

:class:`HAProxy` owns one haproxy process: it renders the config (:func:`haproxy_config`, the
one docs/fleet.md shows), runs haproxy in the foreground (``-db``: no daemon, no master) with
its stderr in a file beside the config, and stops and reaps it. gRPC goes over h2c; each
member is a Triton's gRPC port, checked with ``GET /readyz`` over HTTP/1 on *another* port
(the daemon's API). :class:`RotationRecorder` samples the admin socket's ``show stat`` and
keeps when each member was out of rotation.

Facts of haproxy 2.6 these rely on (checked against Debian bookworm's 2.6.12):

- A server starts UP, with ``check_status`` ``INI``, until its first check has run; the
  first checks are spread over one ``inter`` by the servers' order (the second of two is
  first checked ``inter``/2 after the start). So "UP" right after a start proves nothing:
  :meth:`HAProxy.wait_until_up` also wants the last check passed (``L7OK``; a check in
  progress shows as ``* L7OK``).
- A check runs every ``inter`` whatever the state, so with ``fall 1`` a server is DOWN at most
  one ``inter`` after its health port starts failing (0.29-0.31 s measured with 300 ms), and
  with ``rise 2`` UP again at most two after it recovers (0.58-0.61 s).
- With ``fall 1`` one failed check takes a server DOWN (no ``UP 1/1`` in between); with
  ``rise 2`` it comes back through ``DOWN 1/2`` to ``UP``. Other statuses: ``MAINT``,
  ``DRAIN``, ``NOLB``, ``no check``.
- Without ``check-proto h1`` the check speaks the server's ``proto h2`` to the health port,
  which an HTTP/1 server refuses: the server stays DOWN with ``SOCKERR``.
- ``bind`` refuses port 0, so the frontend port is picked free beforehand.
"""

from __future__ import annotations

import csv
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from devtools.launcher import free_port
from tests.support.polling import eventually

__all__ = [
    "BACKEND",
    "FRONTEND",
    "HAProxy",
    "HAProxyError",
    "Member",
    "OutOfRotation",
    "RotationRecorder",
    "haproxy_config",
]

FRONTEND = "grpc_in"
BACKEND = "members"
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0
_SOCKET_TIMEOUT = 2.0
_SUN_PATH_MAX = 107  # sockaddr_un's sun_path, less its terminating NUL


class HAProxyError(RuntimeError):
    """haproxy refused its config, exited, or its admin socket did not answer; the message
    holds what haproxy wrote on stderr."""


@dataclass(frozen=True)
class Member:
    """One backend server: a Triton's gRPC address and the port of its health check (the
    member's daemon API, whose ``/readyz`` says whether it takes traffic)."""

    name: str
    grpc_address: str  # "127.0.0.1:8001", as RunningTriton.grpc_url gives it
    health_port: int


def haproxy_config(
    servers: Sequence[Member], *, frontend_port: int, stats_socket: Path, inter_ms: int = 300
) -> str:
    """haproxy's config for gRPC (h2c) on 127.0.0.1:``frontend_port``, round robin over
    ``servers``, each checked every ``inter_ms`` with ``GET /readyz`` on its health port."""
    lines = [
        "global",
        f"    stats socket {stats_socket} mode 600 level admin",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 1s",
        "    timeout client 30s",
        "    timeout server 30s",
        "",
        f"frontend {FRONTEND}",
        f"    bind 127.0.0.1:{frontend_port} proto h2",
        f"    default_backend {BACKEND}",
        "",
        f"backend {BACKEND}",
        "    balance roundrobin",
        "    option httpchk GET /readyz",
        *(
            f"    server {s.name} {s.grpc_address} proto h2 check check-proto h1"
            f" port {s.health_port} inter {inter_ms}ms fall 1 rise 2"
            for s in servers
        ),
    ]
    return "\n".join(lines) + "\n"


class HAProxy:
    """haproxy in front of ``servers``; ``with`` (or start/stop) runs it, config and socket
    under ``workdir``. Gives ``frontend_url`` for a ``tritonclient.grpc`` client."""

    def __init__(
        self,
        workdir: Path,
        servers: Sequence[Member],
        *,
        inter_ms: int = 300,
        binary: str | None = None,
    ) -> None:
        if not servers:
            raise ValueError("haproxy needs at least one server")
        workdir.mkdir(parents=True, exist_ok=True)
        self._servers = tuple(servers)
        self._inter_ms = inter_ms
        self._binary = binary or shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.stats_socket = workdir / "haproxy.sock"
        if len(str(self.stats_socket).encode()) > _SUN_PATH_MAX:
            raise ValueError(f"{self.stats_socket}: too long for a Unix socket's path")
        self.config_path = workdir / "haproxy.cfg"
        self.log_path = workdir / "haproxy.log"  # its stderr (it writes nothing on stdout)
        self.frontend_port = 0
        self.config_text = ""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def frontend_url(self) -> str:
        """``127.0.0.1:<port>``: what ``tritonclient.grpc.InferenceServerClient`` takes."""
        return f"127.0.0.1:{self.frontend_port}"

    @property
    def server_names(self) -> list[str]:
        return [s.name for s in self._servers]

    def start(self) -> None:
        """Start haproxy and return once its admin socket answers; raise :class:`HAProxyError`
        (with haproxy's stderr) if it refuses the config or exits. A frontend port taken
        between picking and binding is tried again once with another."""
        if self._process is not None:
            raise HAProxyError("haproxy is already running")
        for attempt in (1, 2):
            try:
                self._start_once()
            except HAProxyError as exc:
                if attempt == 2 or "cannot bind socket" not in str(exc):
                    raise
            else:
                return

    def _start_once(self) -> None:
        self.frontend_port = free_port()
        self.config_text = haproxy_config(
            self._servers,
            frontend_port=self.frontend_port,
            stats_socket=self.stats_socket,
            inter_ms=self._inter_ms,
        )
        self.config_path.write_text(self.config_text, encoding="utf-8")
        self.stats_socket.unlink(missing_ok=True)
        with self.log_path.open("wb") as log:
            process = subprocess.Popen(
                [self._binary, "-db", "-f", str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._process = process
        deadline = time.monotonic() + _START_TIMEOUT
        while True:
            if process.poll() is not None:
                self._reap()
                raise HAProxyError(
                    f"haproxy exited with {process.returncode} at start:\n{self.stderr()}"
                )
            try:
                self._command("show info")
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise HAProxyError(
                        f"haproxy's admin socket did not answer within {_START_TIMEOUT} s:\n"
                        f"{self.stderr()}"
                    ) from None
                time.sleep(0.02)
            else:
                return

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a bound; reap it. The exit code, None if never started.
        Idempotent."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=_STOP_TIMEOUT)
        return self._reap()

    def _reap(self) -> int | None:
        process, self._process = self._process, None
        return None if process is None else process.wait()

    def stderr(self) -> str:
        """What haproxy wrote so far (its alerts and warnings: servers going DOWN and UP)."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def show_stat(self) -> dict[str, str]:
        """Each backend server's status (``UP``, ``DOWN``, ``DOWN 1/2``, ``MAINT``...)."""
        return {row["svname"]: row["status"] for row in self.server_rows()}

    def server_rows(self) -> list[dict[str, str]]:
        """``show stat``'s CSV rows of the backend's servers (not FRONTEND/BACKEND)."""
        text = self._command("show stat").removeprefix("# ")
        return [
            row
            for row in csv.DictReader(text.splitlines())
            if row["pxname"] == BACKEND and row["svname"] not in ("FRONTEND", "BACKEND")
        ]

    def wait_until_up(self, servers: Iterable[str] | None = None, timeout: float = 10.0) -> float:
        """Wait until each of ``servers`` (default all) is UP *and* passed its last check
        (right after a start a server is UP before any check); returns how long it took."""
        names = list(self.server_names if servers is None else servers)

        def up() -> bool:
            rows = {row["svname"]: row for row in self.server_rows()}
            return all(
                rows[n]["status"] == "UP" and rows[n]["check_status"].removeprefix("* ") == "L7OK"
                for n in names
            )

        return eventually(up, timeout, f"haproxy servers {names} UP", every=0.02)

    def wait_for_status(self, server: str, prefix: str, timeout: float = 10.0) -> float:
        """Wait until ``server``'s status starts with ``prefix`` ("DOWN", "UP"...)."""
        return eventually(
            lambda: self.show_stat()[server].startswith(prefix),
            timeout,
            f"haproxy server {server} {prefix}",
            every=0.02,
        )

    def _command(self, command: str) -> str:
        """One admin-socket command; haproxy closes the connection after answering."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(_SOCKET_TIMEOUT)
            sock.connect(str(self.stats_socket))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def __enter__(self) -> HAProxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# --- who was out of rotation, and when --------------------------------------------------------


@dataclass(frozen=True)
class OutOfRotation:
    """One stretch a server was not UP: monotonic times (``end`` None: still out)."""

    server: str
    start: float
    end: float | None
    statuses: tuple[str, ...]  # what show stat said during it, in order, repeats collapsed


@dataclass
class _Open:
    start: float
    statuses: list[str] = field(default_factory=list)


class RotationRecorder:
    """Samples ``show stat`` every ``every`` s in a thread (``with`` or start/stop) and keeps,
    per server, the stretches it was not UP (a status not starting with "UP"), and the most
    servers out at once. Start it once the servers are UP (:meth:`HAProxy.wait_until_up`):
    a server already out at the first sample counts as out, but not as having left."""

    def __init__(self, haproxy: HAProxy, *, every: float = 0.05) -> None:
        self._haproxy = haproxy
        self._every = every
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rotation-recorder", daemon=True)
        self._t0 = 0.0
        self._last: dict[str, str] = {}
        self._open: dict[str, _Open] = {}
        self._closed: list[OutOfRotation] = []
        self._departures: dict[str, int] = {}
        self._max_out = 0
        self._changes: list[tuple[float, dict[str, str]]] = []
        self._errors: list[str] = []
        self.samples = 0

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._sample()  # the first sample before start returns: a baseline the test can trust
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._sample()

    def _sample(self) -> None:
        try:
            statuses = self._haproxy.show_stat()
        except (OSError, KeyError) as exc:
            with self._lock:
                self._errors.append(f"{time.monotonic() - self._t0:.3f}s: {exc!r}")
            return
        now = time.monotonic()
        with self._lock:
            self.samples += 1
            if statuses != self._last:
                self._changes.append((now - self._t0, dict(statuses)))
            for server, status in statuses.items():
                was_up = self._last.get(server, "UP").startswith("UP")
                opened = self._open.get(server)
                if status.startswith("UP"):
                    if opened is not None:
                        del self._open[server]
                        self._closed.append(
                            OutOfRotation(server, opened.start, now, tuple(opened.statuses))
                        )
                    continue
                if opened is None:
                    opened = self._open[server] = _Open(now)
                    if was_up and server in self._last:
                        self._departures[server] = self._departures.get(server, 0) + 1
                if not opened.statuses or opened.statuses[-1] != status:
                    opened.statuses.append(status)
            self._last = dict(statuses)
            self._max_out = max(self._max_out, len(self._open))

    def left_rotation(self, server: str) -> int:
        """How many times ``server`` went from UP to not UP."""
        with self._lock:
            return self._departures.get(server, 0)

    @property
    def max_out_at_once(self) -> int:
        """The most servers not UP in one sample."""
        with self._lock:
            return self._max_out

    def out_of_rotation(self, server: str | None = None) -> list[OutOfRotation]:
        """The stretches out of rotation (of ``server``, or all), the open ones last."""
        with self._lock:
            stretches = [
                *self._closed,
                *(
                    OutOfRotation(s, o.start, None, tuple(o.statuses))
                    for s, o in self._open.items()
                ),
            ]
        return [s for s in stretches if server is None or s.server == server]

    @property
    def timeline(self) -> str:
        """Every change of the statuses, seconds since start, and sampling errors: for an
        assertion's message."""
        with self._lock:
            lines = [
                f"{at:7.3f}s " + ", ".join(f"{s}={v}" for s, v in sorted(statuses.items()))
                for at, statuses in self._changes
            ]
            lines += [f"show stat failed at {error}" for error in self._errors]
            return "\n".join(lines) + f"\n({self.samples} samples)"

    def __enter__(self) -> RotationRecorder:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
