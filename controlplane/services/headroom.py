"""The ``headroom`` step: refuse a load the GPU, the host or ``/dev/shm`` has no room for,
unless forced.

Runs after the release is verified and before anything is placed (blue-green: after the idle
slot is freed, since that frees memory too). A refusal is ``insufficient_memory`` with the
figures; ``force`` loads anyway and says so on the operation.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from controlplane.domain import headroom
from controlplane.domain.errors import InsufficientMemory
from controlplane.ports import MemoryFigures
from controlplane.services.prepare import PreparedRelease
from controlplane.services.tracker import OperationTracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadroomPolicy:
    figures: MemoryFigures | None = None  # None: the check is off
    factor: float = 1.5
    shm_per_instance: int = 1024**2
    shm_backends: tuple[str, ...] = ("python",)
    shm_margin: int = 32 * 1024**2


async def check_headroom(
    tracker: OperationTracker, policy: HeadroomPolicy, prepared: PreparedRelease, *, force: bool
) -> None:
    async with tracker.step("headroom"):
        if policy.figures is None:
            tracker.detail(checked=False)
            return
        summary = prepared.summary
        need, basis = headroom.estimate_need(
            prepared.size_bytes, policy.factor, summary.memory_hint
        )
        gpus = await policy.figures.gpu_memory() if summary.may_use_gpu else {}
        host = await asyncio.to_thread(policy.figures.host_available)
        shm = await asyncio.to_thread(policy.figures.shm)
        found = headroom.check(
            need,
            basis,
            gpu_free=None if gpus is None else {uuid: g.free for uuid, g in gpus.items()},
            host_available=host,
            shm=headroom.shm_need(
                summary.backend,
                summary.instances,
                per_instance=policy.shm_per_instance,
                backends=policy.shm_backends,
                free=None if shm is None else shm.free,
                margin=policy.shm_margin,
                where="/dev/shm" if shm is None else shm.path,  # noqa: S108
            ),
        )
        tracker.detail(
            need_bytes=found.need,
            basis=found.basis,
            gpu_free_bytes=found.gpu_free,
            gpus="unreadable" if gpus is None else len(gpus),
            host_available_bytes=found.host_available,
            **_shm_detail(found.shm, summary.backend, policy.shm_backends),
            forced=force and not found.ok,
        )
        if found.ok:
            return
        if force:
            log.warning(
                "loading anyway (force): %s",
                found.describe(),
                extra={"operation_id": tracker.operation.id},
            )
            return
        raise InsufficientMemory(
            f"{found.describe()}; free memory first (unload a model) or deploy with force"
        )


def _shm_detail(
    shm: headroom.ShmNeed | None, backend: str, backends: tuple[str, ...]
) -> dict[str, object]:
    if shm is None:
        return {"shm": "unreadable" if backend in backends else f"not used by {backend}"}
    return {
        "shm_need_bytes": shm.need,
        "shm_basis": shm.basis,
        "shm_free_bytes": shm.free,
        "shm_margin_bytes": shm.margin,
    }
