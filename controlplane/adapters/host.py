"""The host's memory, and the figures the headroom check compares a load against.

``/proc/meminfo``'s ``MemAvailable`` is what the kernel can still give without swapping; in a
container it is the node's figure, which is why the pod's memory limit still matters. GPU
figures come from Triton's own metrics (``nv_gpu_memory_total_bytes`` and
``nv_gpu_memory_used_bytes``), so no NVML is needed here.
"""

from __future__ import annotations

from pathlib import Path

from controlplane.adapters.triton.metrics import TritonMetrics
from controlplane.ports import GpuMemory

PROC = Path("/proc")


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

    def __init__(self, metrics: TritonMetrics, *, proc_root: Path = PROC) -> None:
        self._metrics = metrics
        self._proc = proc_root

    async def gpu_memory(self) -> dict[str, GpuMemory] | None:
        return await self._metrics.gpu_memory()

    def host_available(self) -> int | None:
        return meminfo(self._proc).get("MemAvailable")

    def host_total(self) -> int | None:
        return meminfo(self._proc).get("MemTotal")
