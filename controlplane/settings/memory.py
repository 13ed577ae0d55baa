"""Memory: the headroom check before a load, and the audit of what an unloaded slot leaves
behind (residue, and Triton's growth over swaps)."""

from __future__ import annotations

from pydantic import Field

from controlplane.settings.group import Group


class MemorySettings(Group):
    headroom_check: bool = Field(
        True,
        description="Before a load, compare the release's estimated need with free GPU and "
        "host memory; refuse with insufficient_memory unless the deploy says force.",
    )
    load_factor: float = Field(
        1.5,
        gt=0,
        description="Estimated need = release size on disk x this, unless the release's "
        "config.pbtxt gives parameters 'controlplane.memory_hint_bytes'.",
    )
    gpu_metrics_url: str | None = Field(
        None,
        description="Where GPU memory figures (nv_gpu_memory_*) are read. "
        "Default: triton.metrics_url.",
    )
    audit: bool = Field(
        True,
        description="Audit each unloaded slot for residue (open files, shm, GPU memory) and "
        "sample Triton's memory after each swap; needs Triton's processes visible (same host, "
        "or shareProcessNamespace: true in the pod).",
    )
    triton_pid: int | None = Field(
        None,
        ge=1,
        description="Triton's pid, if finding it by its --model-repository is not enough.",
    )
    leak_window_swaps: int = Field(
        10, ge=2, description="Swaps over which Triton's memory growth is measured."
    )
    leak_threshold_bytes: int = Field(
        1024**3,
        ge=0,
        description="Growth over the window above this is logged as a suspected leak.",
    )
