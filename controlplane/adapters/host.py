"""The host's memory, and the figures the headroom check compares a load against.

``/proc/meminfo``'s ``MemAvailable`` is what the kernel can still give without swapping; in a
container it is the node's figure, which is why the pod's memory limit still matters. GPU
figures come from Triton's own metrics (``nv_gpu_memory_total_bytes`` and
``nv_gpu_memory_used_bytes``), so no NVML is needed here. Shared memory is the ``statvfs`` of
``/dev/shm`` (or where ``memory.shm_path`` says Triton's is mounted): the Python backend takes a
region there per model instance.
"""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.adapters.triton.metrics import TritonMetrics
from controlplane.ports import GpuMemory, ShmSpace

PROC = Path("/proc")
SHM = Path("/dev/shm")  # noqa: S108 - read, never written: where POSIX shared memory lives


def meminfo(proc_root: Path = PROC) -> dict[str, int]:
    """``/proc/meminfo`` in bytes; empty when it cannot be read.

    Not ``psutil.virtual_memory()``: it reads the same file for the two figures used here, but
    raises when the file cannot be read and warns when fields these figures do not need are
    missing (as in some sandboxes).
    """
    try:
        text = (proc_root / "meminfo").read_text(encoding="ascii")
    except OSError:
        return {}
    figures = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if parts[1:] == ["kB"] else 1
            figures[key.strip()] = int(parts[0]) * scale
    return figures


class HostAndGpuMemory:
    """:class:`~controlplane.ports.MemoryFigures` from Triton's metrics and the host."""

    def __init__(
        self, metrics: TritonMetrics, *, proc_root: Path = PROC, shm_path: Path = SHM
    ) -> None:
        self._metrics = metrics
        self._proc = proc_root
        self._shm = shm_path

    async def gpu_memory(self) -> dict[str, GpuMemory] | None:
        return await self._metrics.gpu_memory()

    def host_available(self) -> int | None:
        return meminfo(self._proc).get("MemAvailable")

    def host_total(self) -> int | None:
        return meminfo(self._proc).get("MemTotal")

    def shm(self) -> ShmSpace | None:
        """``statvfs`` of the shm mount: a tmpfs (RAM) whose size is its own limit (Docker's
        default is 64 MiB, a pod's is its ``emptyDir`` ``sizeLimit`` or the node's half RAM)."""
        try:
            found = os.statvfs(self._shm)
        except OSError:
            return None
        return ShmSpace(
            total=found.f_blocks * found.f_frsize,
            free=found.f_bavail * found.f_frsize,
            path=str(self._shm),
        )
