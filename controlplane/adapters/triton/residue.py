"""The residue audit of a retired slot, and Triton's memory, as the services see them.

Built on :mod:`controlplane.adapters.triton.process`, which reads the processes. The flow it is
built for (retiring a slot, when Triton's processes are visible: same host, or the same
Kubernetes pod with ``shareProcessNamespace: true``):

    lookup = find_triton(repository, pid=configured_pid)
    if lookup.process is None: record lookup.skipped and skip the audit
    slot_dir = lookup.process.repository / slot     # the path as *Triton* spells it
    before = snapshot(lookup.process, slot_dir)      # while the slot is still loaded
    unload; wait until UNAVAILABLE; remove the slot's dir
    residue = audit(before)                          # what the slot left behind

``snapshot`` ties shared memory to the slot through its Python-backend stubs (their argv and
memory maps): other Tritons on the host create segments too, so diffing ``/dev/shm`` is no
evidence. The backend removes a model's segment on a clean unload (about 1 s after the unload
call, just before UNAVAILABLE); a segment survives when its stub is killed (Triton hit its exit
timeout, or was killed) and then stays in RAM until someone removes it.

``ProcessAuditor`` (``TritonProcesses``) finds the tritonserver that serves our repository each
time it is asked (it follows a Triton restart), snapshots a slot before its unload, audits after
it, and reads Triton's memory for the leak trend: the main process's resident memory plus what
is in use under ``/dev/shm`` (tmpfs: RAM, counted against a pod's memory limit, and where
Python-backend models and their leaks keep shared memory).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from controlplane.adapters.triton import process
from controlplane.adapters.triton.metrics import meminfo
from controlplane.domain.memory import HeldFile, ResidueReport
from controlplane.ports import TritonMemory

# Read, never created here: where POSIX shared memory (`shm_open`) lives on Linux.
SHM_ROOT = Path("/dev/shm")  # noqa: S108


@dataclass(frozen=True)
class ShmSegment:
    name: str
    size: int


@dataclass(frozen=True)
class Snapshot:
    """What a loaded slot holds, taken just before it is unloaded."""

    triton_pid: int
    slot_dir: Path
    stubs: tuple[process.StubProcess, ...]
    segments: tuple[ShmSegment, ...]  # the stubs' segments found under the shm root
    unseen_segments: tuple[str, ...]  # named by a stub but not under the shm root: not audited
    main_rss_bytes: int | None
    tree_rss_bytes: int | None
    # (st_dev, st_ino) of the slot's files: the daemon removes a slot by renaming it away
    # first, so a file still open shows under the new name, with ' (deleted)'.
    inodes: frozenset[tuple[int, int]] = frozenset()


@dataclass(frozen=True)
class Residue:
    """What an unloaded, removed slot left behind; `clean` when nothing."""

    triton_pid: int
    slot_dir: Path
    open_files: tuple[process.OpenFile, ...]
    segments: tuple[ShmSegment, ...]  # the snapshot's segments still present
    stubs_alive: tuple[int, ...]  # the snapshot's stubs that have not exited
    main_rss_before: int | None
    main_rss_after: int | None
    tree_rss_before: int | None
    tree_rss_after: int | None

    @property
    def clean(self) -> bool:
        return not (self.open_files or self.segments or self.stubs_alive)

    @property
    def main_rss_delta(self) -> int | None:
        if self.main_rss_before is None or self.main_rss_after is None:
            return None
        return self.main_rss_after - self.main_rss_before

    def summary(self) -> str:
        """One line for a log or an operation step."""
        parts = [] if not self.clean else ["clean"]
        if self.open_files:
            held = ", ".join(f"pid {f.pid} fd {f.fd} {f.target}" for f in self.open_files[:5])
            parts.append(f"{len(self.open_files)} open file(s) under {self.slot_dir}: {held}")
        if self.segments:
            size = sum(s.size for s in self.segments)
            parts.append(f"{len(self.segments)} shm segment(s) left ({size} bytes)")
        if self.stubs_alive:
            parts.append(f"stub(s) still running: {', '.join(map(str, self.stubs_alive))}")
        if self.main_rss_delta is not None:
            parts.append(f"triton rss {self.main_rss_delta:+d} bytes")
        return "; ".join(parts)


# --- the retire audit ----------------------------------------------------------------------


def snapshot(
    triton: process.TritonProcess,
    slot_dir: Path,
    *,
    shm_root: Path = SHM_ROOT,
    shm_prefix: str = process.PYTHON_BACKEND_SHM_PREFIX,
    local_dir: Path | None = None,
) -> Snapshot:
    """What the loaded slot at `slot_dir` (Triton's spelling) holds now; take it before unload.

    `local_dir` is the same dir as this process spells it, when that differs (a sidecar that
    mounts the repository elsewhere): its files are what `audit` looks for once deleted.
    """
    stubs = tuple(process.python_stubs(triton.pid, under=slot_dir, prefix=shm_prefix))
    present = shm_segments(shm_root=shm_root, prefix=shm_prefix)
    names = sorted({name for stub in stubs for name in stub.segments})
    return Snapshot(
        triton_pid=triton.pid,
        slot_dir=slot_dir,
        stubs=stubs,
        segments=tuple(ShmSegment(n, present[n]) for n in names if n in present),
        unseen_segments=tuple(n for n in names if n not in present),
        main_rss_bytes=process.rss_bytes(triton.pid),
        tree_rss_bytes=process.tree_rss_bytes(triton.pid),
        inodes=files_of(local_dir or slot_dir),
    )


def audit(before: Snapshot, *, shm_root: Path = SHM_ROOT) -> Residue:
    """What the slot left behind; call it after UNAVAILABLE and after its dir was removed."""
    left: list[ShmSegment] = []
    for segment in before.segments:
        try:
            left.append(ShmSegment(segment.name, (shm_root / segment.name).stat().st_size))
        except OSError:
            continue  # removed: the clean case
    return Residue(
        triton_pid=before.triton_pid,
        slot_dir=before.slot_dir,
        open_files=tuple(process.open_files_under(before.slot_dir, inodes=before.inodes)),
        segments=tuple(left),
        stubs_alive=tuple(s.pid for s in before.stubs if s.still_running()),
        main_rss_before=before.main_rss_bytes,
        main_rss_after=process.rss_bytes(before.triton_pid),
        tree_rss_before=before.tree_rss_bytes,
        tree_rss_after=process.tree_rss_bytes(before.triton_pid),
    )


def files_of(root: Path) -> frozenset[tuple[int, int]]:
    """(st_dev, st_ino) of every regular file below `root`."""
    found: set[tuple[int, int]] = set()
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            found.add((st.st_dev, st.st_ino))
    return frozenset(found)


def shm_segments(
    *, shm_root: Path = SHM_ROOT, prefix: str = process.PYTHON_BACKEND_SHM_PREFIX
) -> dict[str, int]:
    """Name -> size of the files in `shm_root` whose name starts with `prefix`."""
    found: dict[str, int] = {}
    try:
        entries = list(os.scandir(shm_root))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            found[entry.name] = entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue  # removed between the listing and the stat
    return found


# --- the port ------------------------------------------------------------------------------


class _Probe:
    def __init__(self, slot: str, before: Snapshot | None, skipped: str | None) -> None:
        self._slot = slot
        self._before = before
        self._skipped = skipped

    def finish(self) -> ResidueReport:
        if self._before is None:
            return ResidueReport(self._slot, skipped=self._skipped or "no snapshot")
        found = audit(self._before)
        return ResidueReport(
            slot=self._slot,
            triton_pid=found.triton_pid,
            open_files=tuple(HeldFile(f.pid, f.command, f.target) for f in found.open_files),
            shm_segments=tuple(s.name for s in found.segments),
            shm_bytes=sum(s.size for s in found.segments),
            stubs_alive=found.stubs_alive,
            rss_before=found.main_rss_before,
            rss_after=found.main_rss_after,
        )


class ProcessAuditor:
    def __init__(
        self, repository: Path, *, pid: int | None = None, shm_root: Path = SHM_ROOT
    ) -> None:
        self._repository = repository
        self._pid = pid
        self._shm = shm_root

    def probe(self, slot: str) -> _Probe:
        """Snapshot ``slot`` while it is still loaded; ``finish()`` after its dir is gone."""
        lookup = process.find_triton(self._repository, pid=self._pid)
        if lookup.process is None:
            return _Probe(slot, None, lookup.skipped)
        before = snapshot(
            lookup.process,
            lookup.process.repository / slot,
            shm_root=self._shm,
            local_dir=self._repository / slot,
        )
        return _Probe(slot, before, None)

    def memory(self) -> TritonMemory | None:
        lookup = process.find_triton(self._repository, pid=self._pid)
        if lookup.process is None:
            return None
        return TritonMemory(
            pid=lookup.process.pid,
            resident_bytes=process.rss_bytes(lookup.process.pid),
            shm_bytes=_used_bytes(self._shm),
            host_total_bytes=meminfo().get("MemTotal"),
        )

    def skipped(self) -> str | None:
        """Why Triton's processes cannot be seen, or None when they can."""
        return process.find_triton(self._repository, pid=self._pid).skipped

    def stop(self, grace: float) -> str | None:
        lookup = process.find_triton(self._repository, pid=self._pid)
        if lookup.process is None:
            return f"Triton's process cannot be seen: {lookup.skipped}"
        return process.stop(lookup.process.pid, grace)


def _used_bytes(root: Path) -> int | None:
    """Bytes in use by the files directly under ``root`` (a tmpfs such as /dev/shm)."""
    total = 0
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
                except OSError:
                    continue
    except OSError:
        return None
    return total
