"""Start-up reconcile of a blue-green model: slots from the disk, the alias from the database.

The alias's target lives only in Triton's memory (a config override), so after a Triton or a
daemon restart it is re-pointed from the database: the desired release's slot is loaded if it
is not, then the alias is loaded with the config that points at it. A slot left RETIRING gets
a fresh retire window. If no slot holds the desired release, it is deployed again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.operations import OperationStatus, Trigger
from controlplane.domain.slots import SlotState
from controlplane.domain.traffic import TrafficPolicy, alias_config, alias_target
from controlplane.ports import IndexEntry, Staging, Triton
from controlplane.services.deploy import DeployService
from controlplane.services.slots import SlotBook

log = logging.getLogger(__name__)


class BlueGreenReconciler:
    def __init__(
        self,
        *,
        deploy: DeployService,
        staging: Staging,
        triton: Triton,
        slots: SlotBook,
        traffic: Callable[[str], TrafficPolicy],
    ) -> None:
        self._deploy = deploy
        self._staging = staging
        self._triton = triton
        self._slots = slots
        self._traffic = traffic

    async def converge(self, model: str, desired: str | None, index: dict[str, IndexEntry]) -> str:
        """Bring ``model`` back; return what was done (for the report)."""
        serving = None
        for name in self._traffic(model).slots(model):
            marker = self._staging.read_marker(name)
            entry = index.get(name)
            loaded = entry is not None and entry.state == "READY"
            release = marker.release if marker else None
            stored = self._slots.get(model, name)
            if release is None:
                self._slots.observe(model, SlotState.ABSENT, None, "not on disk", slot_name=name)
            elif release == desired and serving is None:
                if not loaded:
                    await self._triton.load(name)
                self._slots.observe(
                    model, SlotState.ACTIVE, release, "serving after start-up", slot_name=name
                )
                serving = name
            elif loaded and stored.state in (SlotState.RETIRING, SlotState.ACTIVE):
                self._slots.observe(
                    model, SlotState.RETIRING, release, "warm after start-up", slot_name=name
                )
                self._deploy.schedule_retire(model, name)
            else:
                self._slots.observe(
                    model, SlotState.UNAVAILABLE, release, "on disk, not needed", slot_name=name
                )
                self._deploy.schedule_retire(model, name, now=True)
        if desired is None:
            return "nothing desired"
        if serving is None:
            operation = await self._deploy.run_inline(model, desired, trigger=Trigger.RECONCILE)
            if operation.status is not OperationStatus.SUCCEEDED:
                message = operation.error.message if operation.error else operation.status.value
                raise ControlPlaneError(f"redeploy of {desired} failed: {message}")
            return "redeployed"
        alias = index.get(model)
        if alias is not None and alias.state == "READY":
            current = alias_target(await self._triton.model_config(model))
            if current == serving:
                return "in place"
        config = alias_config(model, await self._triton.model_config(serving))
        await self._triton.load(model, config_json=json.dumps(config))
        log.info("re-pointed alias %s at %s after start-up", model, serving)
        return "re-pointed"
