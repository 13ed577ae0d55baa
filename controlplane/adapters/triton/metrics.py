"""Reading Triton's Prometheus endpoint: pending requests per model (for the drain), GPU
utilisation (for the overload watcher) and GPU memory (for the headroom check).

A scrape that fails answers None ("unknown"): the caller decides what that means, never this.
``nv_gpu_utilization`` is a ratio in [0, 1], one series per ``gpu_uuid``.

Only the lines of the families asked for are parsed: Triton exports a dozen counters per model
and version, and parsing them all was most of a scrape's CPU, every second, growing with the
models served.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from controlplane.ports import GpuMemory, ShmSpace

PENDING = "nv_inference_pending_request_count"
GPU_UTILIZATION = "nv_gpu_utilization"
GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"


class TritonMetrics:
    def __init__(self, url: str, *, timeout: float = 2.0) -> None:
        self._url = url
        # TLS only for an https endpoint: for Triton's plain-HTTP one (the default) httpx would
        # still load the CA bundle into an SSL context that no request uses (0.8 MiB a client).
        tls = httpx.URL(url).scheme == "https"
        self._client = httpx.AsyncClient(timeout=timeout, trust_env=False, verify=tls)

    async def pending_requests(self, model: str) -> int | None:
        samples = await self._scrape(PENDING)
        if samples is None:
            return None
        return int(sum(value for _, labels, value in samples if labels.get("model") == model))

    async def gpu_utilization(self) -> dict[str, float] | None:
        """Utilisation per GPU (``gpu_uuid`` -> ratio); None when the scrape failed.

        An empty dict means Triton answered but exports no GPU (no NVML, or CPU only).
        """
        samples = await self._scrape(GPU_UTILIZATION)
        if samples is None:
            return None
        return {labels.get("gpu_uuid", ""): value for _, labels, value in samples}

    async def gpu_memory(self) -> dict[str, GpuMemory] | None:
        """Total and used memory per GPU; ``{}`` without GPUs, None when the scrape failed."""
        samples = await self._scrape(GPU_MEMORY_TOTAL, GPU_MEMORY_USED)
        if samples is None:
            return None
        total = {lab.get("gpu_uuid", ""): v for name, lab, v in samples if name == GPU_MEMORY_TOTAL}
        used = {lab.get("gpu_uuid", ""): v for name, lab, v in samples if name == GPU_MEMORY_USED}
        return {
            uuid: GpuMemory(total=int(total[uuid]), used=int(used[uuid]))
            for uuid in total
            if uuid in used
        }

    async def _scrape(self, *metrics: str) -> list[tuple[str, dict[str, str], float]] | None:
        """(name, labels, value) of every sample of ``metrics``; None when the scrape failed."""
        try:
            response = await self._client.get(self._url)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return [
            (family.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(_lines_of(response.text, metrics))
            if family.name in metrics
            for sample in family.samples
        ]

    async def close(self) -> None:
        await self._client.aclose()


def _lines_of(text: str, metrics: tuple[str, ...]) -> str:
    """The lines of ``text`` (Prometheus' text format) about the families ``metrics``: their
    samples (``name{...} v``, ``name v``, a counter's ``name_total``...) and their ``# HELP``
    and ``# TYPE`` lines."""
    heads = tuple(f"{kind}{name}" for kind in ("", "# HELP ", "# TYPE ") for name in metrics)
    names = {f"{name}{suffix}" for name in metrics for suffix in _SAMPLE_SUFFIXES}
    kept = []
    for line in text.splitlines():
        if line.startswith(heads) and (found := _NAME.match(line)) and found.group(1) in names:
            kept.append(line)
    return "\n".join(kept)


_SAMPLE_SUFFIXES = ("", "_total", "_created", "_count", "_sum", "_bucket")
_NAME = re.compile(r"(?:# (?:HELP|TYPE) )?([a-zA-Z_:][a-zA-Z0-9_:]*)")


# --- the memory figures of the host and the GPU ------------------------------------------------


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
