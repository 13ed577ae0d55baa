"""What Triton's processes are and hold: the tritonserver, its stubs, their files and memory.

Owns every look at processes for the residue audit (:mod:`.residue`): finding the tritonserver
that serves a repository, its Python-backend stubs and the shared memory they use, the files
any process still holds open under a dir, and resident memory. Read only. psutil reads the
process table (who runs, argv, parent, state, start, cwd, RSS, memory maps); the few reads it
has no API for are plain `/proc` reads, each saying why.

A Python-backend model instance runs in a `triton_python_backend_stub` child of tritonserver
whose argv is `stub <repo>/<model>/<version>/model.py <shm region> <size> <growth> <parent pid>
<lib dir> <ipc handle> <instance name> <runtime dir>`. Segment names are
`triton_python_backend_shm_region_<uuid4>`: nothing in the name says which model, so a stub's
argv and its memory maps are what tie a segment to a model.

Paths: `/proc/<pid>/fd` links and a stub's argv show paths as seen in *Triton's* mount
namespace, so a slot dir given here must be spelled that way (`TritonProcess.repository`, taken
from Triton's own `--model-repository`). A sidecar that mounts the repository elsewhere is still
matched to Triton by file identity, and a file still open after its dir was renamed away and
removed, by its inode.

Invariants: nothing here raises because a process exited or denied access mid-scan (it is
skipped); the calling process is never reported; each scan is one pass over the process table
(tens of ms on a pod or a small host).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

__all__ = [
    "PYTHON_BACKEND_SHM_PREFIX",
    "PYTHON_BACKEND_STUB",
    "OpenFile",
    "StubProcess",
    "TritonLookup",
    "TritonProcess",
    "descendants",
    "find_triton",
    "open_files_under",
    "python_stubs",
    "rss_bytes",
    "segments_mapped_by",
    "tree_rss_bytes",
]

# Where POSIX shared memory (`shm_open`) lives on Linux, as a stub's memory maps spell it.
_SHM_MOUNT = "/dev/shm"  # noqa: S108
# The Python backend's default `shm-region-prefix-name` (a `--backend-config=python,...` knob).
PYTHON_BACKEND_SHM_PREFIX = "triton_python_backend_shm_region_"
PYTHON_BACKEND_STUB = "triton_python_backend_stub"
_TRITONSERVER = "tritonserver"
_REPOSITORY_FLAGS = ("--model-repository", "--model-store")
_DELETED = " (deleted)"
_NOT_VISIBLE = (
    "no tritonserver process visible: run the sidecar with shareProcessNamespace: true, "
    "or on the same host"
)
# A process that exited (ZombieProcess is a NoSuchProcess) or may not be read is skipped;
# OSError covers the plain `/proc` reads, and the bare FileNotFoundError psutil lets through
# when a file of a process vanishes while its `stat` is still there.
_SKIPPED = (psutil.NoSuchProcess, psutil.AccessDenied, OSError)
_GONE = (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
_T = TypeVar("_T")
KILL_WAIT = 10.0  # s for a SIGKILLed process to be gone


@dataclass(frozen=True)
class TritonProcess:
    """A running tritonserver and the model repository it serves, spelled as Triton spells it."""

    pid: int
    command: tuple[str, ...]
    repository: Path


@dataclass(frozen=True)
class TritonLookup:
    """Either the Triton process, or why it cannot be seen (`skipped`); never both."""

    process: TritonProcess | None
    skipped: str | None = None


@dataclass(frozen=True)
class OpenFile:
    """One file descriptor of a visible process; `target` is the link text, maybe `(deleted)`."""

    pid: int
    fd: int
    target: str
    command: str

    @property
    def deleted(self) -> bool:
        return self.target.endswith(_DELETED)

    @property
    def path(self) -> str:
        return self.target.removesuffix(_DELETED)


@dataclass(frozen=True)
class StubProcess:
    """A Python-backend stub: one per model instance, a child of tritonserver."""

    # pid and start time (clock ticks after boot): `is_running()` tells a reused pid apart.
    process: psutil.Process
    model_file: Path  # `<repository>/<model>/<version>/model.py`, as Triton spells it
    instance: str  # `<model>_<group>_<index>`
    segments: tuple[str, ...]  # the /dev/shm names it was given or maps

    @property
    def pid(self) -> int:
        return self.process.pid

    def still_running(self) -> bool:
        """Not exited, not a zombie, and its pid not taken by another process since."""
        return self.process.is_running() and _alive(self.process)


# --- processes -----------------------------------------------------------------------------


def _read(read: Callable[[], _T], skipped: _T) -> _T:
    """`read()`, or `skipped` when the process exited or denied access: it never raises for it."""
    try:
        return read()
    except _SKIPPED:
        return skipped


def _process(pid: int) -> psutil.Process | None:
    return _read(lambda: psutil.Process(pid), None)


def _alive(process: psutil.Process) -> bool:
    return _read(process.status, psutil.STATUS_DEAD) not in _GONE


def _cmdline(process: psutil.Process) -> tuple[str, ...]:
    return tuple(_read(process.cmdline, []))


def _rss(process: psutil.Process) -> int | None:
    # A zombie's memory reads as zeros: it has none, which is not "0 bytes resident".
    return _read(lambda: process.memory_info().rss, None) if _alive(process) else None


def stop(pid: int, grace: float, *, poll: float = 0.1) -> str | None:
    """SIGTERM ``pid``, then SIGKILL past ``grace`` s, and wait until it is gone (an exited
    process its parent has not reaped yet counts as gone). None once it is; else why not."""
    target = _process(pid)
    if target is None:
        return None
    try:
        target.terminate()
        deadline = time.monotonic() + grace
        while _alive(target) and time.monotonic() < deadline:
            time.sleep(poll)
        if _alive(target):
            target.kill()
            deadline = time.monotonic() + KILL_WAIT
            while _alive(target) and time.monotonic() < deadline:
                time.sleep(poll)
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return (
            f"not allowed to signal Triton's process (pid {pid}): run the daemon as Triton's "
            "user, or give its container the KILL capability"
        )
    return None if not _alive(target) else f"Triton's process (pid {pid}) outlived SIGKILL"


def _descendants(pid: int) -> list[psutil.Process]:
    found: list[psutil.Process] = _read(lambda: psutil.Process(pid).children(recursive=True), [])
    return sorted(found, key=lambda p: p.pid)


def _proc(pid: int, *parts: str) -> str:
    """`/proc/<pid>/...` (the procfs psutil reads), for the reads psutil has no API for."""
    return os.path.join(psutil.PROCFS_PATH, str(pid), *parts)


def _norm(path: Path | str) -> str:
    return os.path.normpath(str(path))


def _spellings(path: Path) -> set[str]:
    """`path` as given and with symlinks resolved (the kernel reports resolved paths)."""
    return {_norm(path), _norm(os.path.realpath(path))}


def _is_under(target: str, prefixes: Collection[str]) -> bool:
    return any(target == p or target.startswith(p.rstrip("/") + "/") for p in prefixes)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...), by pid."""
    return [p.pid for p in _descendants(pid)]


def rss_bytes(pid: int) -> int | None:
    """Resident memory of `pid`; None when it is gone, a zombie, or unreadable."""
    process = _process(pid)
    return None if process is None else _rss(process)


def tree_rss_bytes(pid: int) -> int | None:
    """RSS of `pid` plus all its descendants (shared pages count once per process)."""
    own = rss_bytes(pid)
    if own is None:
        return None
    return own + sum(_rss(p) or 0 for p in _descendants(pid))


# --- finding Triton ------------------------------------------------------------------------


def _repository_args(command: tuple[str, ...]) -> Iterator[str]:
    for i, arg in enumerate(command[1:], start=1):
        for flag in _REPOSITORY_FLAGS:
            if arg.startswith(flag + "="):
                yield arg[len(flag) + 1 :]
            elif arg == flag and i + 1 < len(command):
                yield command[i + 1]


def _served_repository(
    process: psutil.Process, command: tuple[str, ...], repository: Path
) -> Path | None:
    """The `--model-repository` of `process` that is `repository`, as Triton spells it."""
    wanted = _spellings(repository)
    for value in _repository_args(command):
        if not value.startswith("/"):
            cwd = _read(process.cwd, None)
            if cwd is None:
                continue
            value = os.path.join(cwd, value)
        if _norm(value) in wanted:
            return Path(_norm(value))
        # Same directory mounted at another path (a sidecar's mount namespace): same inode.
        # psutil has no view into another mount namespace; `/proc/<pid>/root` is one.
        try:
            if os.path.samefile(_proc(process.pid, "root", value.lstrip("/")), repository):
                return Path(_norm(value))
        except OSError:
            continue
    return None


def _is_tritonserver(process: psutil.Process, command: tuple[str, ...]) -> bool:
    if command and os.path.basename(command[0]) == _TRITONSERVER:
        return True
    return _read(process.name, "") == _TRITONSERVER


def find_triton(repository: Path, *, pid: int | None = None) -> TritonLookup:
    """The tritonserver serving `repository`, or why it cannot be seen.

    A configured `pid` wins while it is alive (its repository spelling is taken from its argv
    when it lists `repository`, else `repository` itself); otherwise every visible process is
    scanned for a tritonserver whose `--model-repository` is `repository` (same path, or the
    same directory mounted elsewhere). Two such servers are ambiguous: set the pid.
    """
    configured = None if pid is None else _process(pid)
    if configured is not None and _alive(configured):
        command = _cmdline(configured)
        served = _served_repository(configured, command, repository)
        return TritonLookup(
            TritonProcess(configured.pid, command, served or Path(_norm(repository)))
        )
    servers: list[int] = []
    matches: list[TritonProcess] = []
    for candidate in psutil.process_iter():
        command = _cmdline(candidate)
        if not _is_tritonserver(candidate, command) or not _alive(candidate):
            continue
        servers.append(candidate.pid)
        served = _served_repository(candidate, command, repository)
        if served is not None:
            matches.append(TritonProcess(candidate.pid, command, served))
    if len(matches) == 1:
        return TritonLookup(matches[0])
    if matches:
        pids = ", ".join(str(m.pid) for m in matches)
        return TritonLookup(
            None,
            f"several tritonserver processes serve {repository} (pids "
            f"{pids}): configure the Triton pid",
        )
    if servers:
        pids = ", ".join(map(str, sorted(servers)))
        return TritonLookup(
            None,
            f"tritonserver visible (pids {pids}) but none serves "
            f"{repository}: configure the Triton pid",
        )
    return TritonLookup(None, _NOT_VISIBLE)


# --- open files and shared memory ----------------------------------------------------------


def open_files_under(
    path: Path,
    *,
    pids: Collection[int] | None = None,
    inodes: Collection[tuple[int, int]] = frozenset(),
) -> list[OpenFile]:
    """Every fd of every visible process (or of `pids`) whose target is `path` or below it,
    or a deleted file that is one of `inodes` (the dir was renamed away before removal).

    Targets of removed files end in ` (deleted)` and are included. Processes that exit or deny
    access during the scan are skipped; the calling process is never reported.
    """
    # Not psutil's open_files(): it drops a file whose path no longer exists (the removed file
    # this audit is after), strips ' (deleted)', and leaves out directories. The fd links
    # themselves say all of that, and a stat through one gives the open file's inode.
    prefixes = _spellings(path)
    me = os.getpid()
    found: list[OpenFile] = []
    for pid in sorted(psutil.pids() if pids is None else pids):
        if pid == me:
            continue
        try:
            entries = list(os.scandir(_proc(pid, "fd")))
        except OSError:
            continue
        command: str | None = None
        for entry in entries:
            try:
                target = os.readlink(entry.path)
            except OSError:
                continue
            if not entry.name.isdigit():
                continue
            if not _is_under(target.removesuffix(_DELETED), prefixes) and not (
                inodes and target.endswith(_DELETED) and _inode(entry.path) in inodes
            ):
                continue
            if command is None:
                process = _process(pid)
                command = "" if process is None else " ".join(_cmdline(process))
            found.append(OpenFile(pid=pid, fd=int(entry.name), target=target, command=command))
    return sorted(found, key=lambda f: (f.pid, f.fd))


def _inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)  # through /proc/<pid>/fd/<n>: the open file, removed or not
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _shm_name(path: str, prefix: str) -> str | None:
    # psutil strips ' (deleted)', unless a file named with that suffix too exists.
    path = path.removesuffix(_DELETED)
    if not path.startswith(_SHM_MOUNT + "/"):
        return None
    name = path[len(_SHM_MOUNT) + 1 :]
    return name if name.startswith(prefix) and "/" not in name else None


def _mapped(process: psutil.Process, prefix: str) -> set[str]:
    paths: list[str] = _read(lambda: [m.path for m in process.memory_maps(grouped=False)], [])
    return {name for path in paths if (name := _shm_name(path, prefix)) is not None}


def segments_mapped_by(
    pids: Collection[int], *, prefix: str = PYTHON_BACKEND_SHM_PREFIX
) -> set[str]:
    """Names of the `/dev/shm` files with `prefix` that `pids` map."""
    processes = (_process(pid) for pid in pids)
    return {name for p in processes if p is not None for name in _mapped(p, prefix)}


def python_stubs(
    triton_pid: int, *, under: Path | None = None, prefix: str = PYTHON_BACKEND_SHM_PREFIX
) -> list[StubProcess]:
    """The live Python-backend stubs below `triton_pid` (those of a model under `under`, a dir
    as Triton spells it, when given), with the segments each one uses."""
    dirs = None if under is None else _spellings(under)
    stubs: list[StubProcess] = []
    for process in _descendants(triton_pid):
        command = _cmdline(process)
        if len(command) < 2 or os.path.basename(command[0]) != PYTHON_BACKEND_STUB:
            continue
        if (dirs is not None and not _is_under(_norm(command[1]), dirs)) or not _alive(process):
            continue
        given = {arg for arg in command[2:] if arg.startswith(prefix)}
        stubs.append(
            StubProcess(
                process=process,
                model_file=Path(command[1]),
                instance=command[8] if len(command) > 8 else "",
                segments=tuple(sorted(given | _mapped(process, prefix))),
            )
        )
    return stubs
