"""The residue audit and Triton's memory, as the services see them (``TritonProcesses``).

Built on :mod:`controlplane.adapters.triton.process`: it finds the tritonserver that serves
our repository each time it is asked (a few ms, and it follows a Triton restart), snapshots a
slot before its unload, audits after it, and reads Triton's memory for the leak trend: the main
process's resident memory plus what is in use under ``/dev/shm`` (tmpfs: RAM, counted against
a pod's memory limit, and where Python-backend models and their leaks keep shared memory).
"""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.adapters.host import meminfo
from controlplane.adapters.triton import process
from controlplane.domain.memory import HeldFile, ResidueReport
from controlplane.ports import TritonMemory


class _Probe:
    def __init__(self, slot: str, before: process.Snapshot | None, skipped: str | None) -> None:
        self._slot = slot
        self._before = before
        self._skipped = skipped

    def finish(self) -> ResidueReport:
        if self._before is None:
            return ResidueReport(self._slot, skipped=self._skipped or "no snapshot")
        found = process.audit(self._before)
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
        self, repository: Path, *, pid: int | None = None, shm_root: Path = process.SHM_ROOT
    ) -> None:
        self._repository = repository
        self._pid = pid
        self._shm = shm_root

    def probe(self, slot: str) -> _Probe:
        """Snapshot ``slot`` while it is still loaded; ``finish()`` after its dir is gone."""
        lookup = process.find_triton(self._repository, pid=self._pid)
        if lookup.process is None:
            return _Probe(slot, None, lookup.skipped)
        before = process.snapshot(
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
