"""Memory: the headroom check before a load, and the audit of what an unloaded slot leaves
behind (residue, and Triton's growth over swaps)."""

from __future__ import annotations

from typing import Literal

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
    shm_path: str = Field(
        "/dev/shm",  # noqa: S108 - read only: statvfs of Triton's shared memory
        description="Where Triton's shared memory is mounted as this daemon sees it: /dev/shm "
        "on the same host or container; in a pod, the mount of the Memory emptyDir that both "
        "containers mount at /dev/shm (a sidecar's own /dev/shm is not Triton's).",
    )
    shm_per_instance_bytes: int = Field(
        1024**2,
        ge=0,
        description="Shared memory one instance of a backend in shm_backends takes at load: "
        "the Python backend's shm-default-byte-size (1 MiB unless Triton runs with "
        "--backend-config=python,shm-default-byte-size=N; then give N).",
    )
    shm_backends: tuple[str, ...] = Field(
        ("python",),
        description="Backends whose instances each take shm_per_instance_bytes of /dev/shm; "
        "add Python-based backends (e.g. vllm) that run in the Python backend's stub.",
    )
    shm_margin_bytes: int = Field(
        32 * 1024**2,
        ge=0,
        description="Refuse a load (insufficient_memory) that would leave less than this free "
        "in shm_path: the Python backend grows its regions with the tensors it passes, and a "
        "full /dev/shm fails every Python model's requests, not just the new one's.",
    )
    gpu_metrics_url: str | None = Field(
        None,
        description="Where GPU memory figures (nv_gpu_memory_*) are read. "
        "Default: triton.metrics_url.",
    )
    return_seconds: float = Field(
        60.0,
        gt=0,
        allow_inf_nan=False,
        le=3600,
        description="rolling: after the old release unloaded, how long to wait for the GPU "
        "memory it held to come back (until the new release fits in what is free) before the "
        "new one loads; "
        "past it the update stops with memory_not_returned and the member stays out of "
        "rotation.",
    )
    on_not_returned: Literal["stop", "restart-triton"] = Field(
        "stop",
        description="rolling, memory not returned: stop (no load; the member stays out of "
        "rotation until a deploy of the model succeeds: restart Triton, then deploy again), "
        "or restart-triton (stop Triton's process, which must be visible: same host, or "
        "shareProcessNamespace: true; its supervisor, the kubelet or systemd, starts it "
        "again; wait for it, then go on; every model on the member reloads).",
    )
    restart_seconds: float = Field(
        300.0,
        gt=0,
        allow_inf_nan=False,
        le=3600,
        description="restart-triton: how long to wait for Triton to stop and be live again.",
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
