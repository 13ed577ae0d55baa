"""The last step of the rollback chain: the serving release, reloaded on CPU-only instances.

The serving slot (the model itself under ``inplace``) is reloaded with every instance on CPU,
which Triton applies in place: the GPU is freed, the model keeps answering, more slowly. One
inference through the name clients call proves it. The override lives until the slot is next
loaded from its files (a deploy, or a Triton restart repaired by the daemon); the slot's reason
carries :data:`~controlplane.domain.slots.ON_CPU_ONLY` as long (status and ``/metrics`` read it).
"""

from __future__ import annotations

import asyncio

from controlplane.domain.slots import ON_CPU_ONLY, Slot, SlotState
from controlplane.ports import Triton
from controlplane.services.runner import Run
from controlplane.services.slots import SlotBook


async def reload_on_cpu(run: Run, *, triton: Triton, slots: SlotBook, slot: Slot) -> None:
    tracker = run.tracker
    model, slot_name = run.model, slot.name
    async with tracker.step("cpu"):
        updating = await slots.move(
            model, slot, SlotState.UPDATING, run.trigger, "reloading on CPU-only instances"
        )
        try:
            groups = await triton.reload_cpu_only(slot_name)
        except BaseException:
            # Triton keeps the loaded version when a reload fails (a cut one may still land).
            await asyncio.shield(
                slots.move(
                    model,
                    updating,
                    slot.state if slot.state is SlotState.STALE else SlotState.ACTIVE,
                    run.trigger,
                    "CPU-only reload failed",
                )
            )
            raise
        await slots.move(
            model, updating, SlotState.ACTIVE, run.trigger, f"serving {ON_CPU_ONLY}", cpu_only=True
        )
        tracker.detail(slot=slot_name, instance_group=groups)
    async with tracker.step("verify"):
        tracker.detail(outputs=await triton.smoke(model, None))
