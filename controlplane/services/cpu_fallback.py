"""The last step of the rollback chain: the serving release, reloaded on CPU-only instances.

The serving slot (the model itself under ``inplace``) is reloaded with a config override whose
only change is ``instance_group`` (``KIND_CPU``), which Triton applies in place: the GPU is
freed, the model keeps answering, more slowly. One inference through the name clients call
proves it. The override lives until the slot is next loaded from its files (a deploy, or a
Triton restart reconciled by the daemon).
"""

from __future__ import annotations

import json

from controlplane.domain.rollback import cpu_only_config
from controlplane.ports import Triton
from controlplane.services.slots import SlotBook
from controlplane.services.tracker import OperationTracker


async def reload_on_cpu(
    tracker: OperationTracker, *, triton: Triton, slots: SlotBook, slot_name: str
) -> None:
    op = tracker.operation
    model = op.model
    slot = slots.get(model, slot_name)
    async with tracker.step("cpu"):
        config = cpu_only_config(await triton.model_config(slot_name))
        slot = slots.move(
            slot, "UPDATING", op.trigger, "reloading on CPU-only instances", model=model
        )
        try:
            await triton.load(slot_name, config_json=json.dumps(config))
        except BaseException:
            # Triton keeps the loaded version when a reload fails.
            slots.move(slot, "ACTIVE", op.trigger, "CPU-only reload failed", model=model)
            raise
        slot = slots.move(slot, "ACTIVE", op.trigger, "serving on CPU-only instances", model=model)
        tracker.detail(slot=slot_name, instance_group=config["instance_group"])
    async with tracker.step("verify"):
        tracker.detail(outputs=await triton.smoke(model, None))
