"""Start-up reconcile: make what serves match what the database says should serve.

The daemon never trusts memory alone. At start-up it (1) marks operations that were running
when it died as ``interrupted``, (2) deletes every staging leftover, (3) reads the repository
(each placed dir carries a marker naming its release) and Triton's index, then (4) converges:

* desired release on disk and READY: nothing to do;
* desired release on disk, not loaded (Triton restarted, or a load was cut short): load it;
* the dir holds another release (a deploy was killed after placing it) or is missing:
  deploy the desired release again, from the store, through the normal pipeline;
* no desired release, and a dir left by an interrupted first deploy: take it back out.

Models the database does not know are left alone: they may belong to someone else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.operations import OperationStatus, Trigger
from controlplane.domain.slots import SlotState
from controlplane.domain.traffic import TrafficPolicy
from controlplane.ports import Clock, IndexEntry, Staging, StateRepo, Triton
from controlplane.services.deploy import DeployService
from controlplane.services.reconcile_bluegreen import BlueGreenReconciler
from controlplane.services.slots import SlotBook

log = logging.getLogger(__name__)


@dataclass
class ReconcileReport:
    interrupted: list[str] = field(default_factory=list)
    staging_removed: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    redeployed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class Reconciler:
    def __init__(
        self,
        *,
        deploy: DeployService,
        staging: Staging,
        triton: Triton,
        repo: StateRepo,
        clock: Clock,
        unload_timeout: float = 120.0,
        traffic: Callable[[str], TrafficPolicy] | None = None,
    ) -> None:
        self._deploy = deploy
        self._staging = staging
        self._triton = triton
        self._repo = repo
        self._clock = clock
        self._slots = SlotBook(repo, clock)
        self._unload_timeout = unload_timeout
        self._blue_green = (
            None
            if traffic is None
            else BlueGreenReconciler(
                deploy=deploy, staging=staging, triton=triton, slots=self._slots, traffic=traffic
            )
        )

    async def run(self) -> ReconcileReport:
        report = ReconcileReport()
        interrupted_models: set[str] = set()
        for operation in self._repo.unfinished_operations():
            self._repo.save_operation(operation.interrupt(self._clock.now()))
            report.interrupted.append(operation.id)
            interrupted_models.add(operation.model)
        report.staging_removed = await asyncio.to_thread(self._staging.clean_all)
        index = {entry.name: entry for entry in await self._triton.index()}
        for record in self._repo.list_models():
            try:
                await self._converge(
                    record.name, record.active_release, index, interrupted_models, report
                )
            except ControlPlaneError as exc:
                report.failed[record.name] = str(exc)
                log.error("reconcile could not converge %s: %s", record.name, exc)
        log.info(
            "reconcile done: %d interrupted, %d staging dirs removed, loaded %s, "
            "redeployed %s, removed %s, failed %s",
            len(report.interrupted),
            len(report.staging_removed),
            report.loaded,
            report.redeployed,
            report.removed,
            sorted(report.failed),
        )
        return report

    def _unconfirmed(self, operation_id: str, interrupted: set[str], model: str) -> bool:
        """A placed dir whose deploy never succeeded (killed, or cut short by a shutdown)."""
        if model in interrupted:
            return True
        operation = self._repo.get_operation(operation_id)
        return operation is None or operation.status is not OperationStatus.SUCCEEDED

    async def _converge(
        self,
        model: str,
        desired: str | None,
        index: dict[str, IndexEntry],
        interrupted: set[str],
        report: ReconcileReport,
    ) -> None:
        if self._blue_green is not None and self._staging.is_alias_dir(model):
            outcome = await self._blue_green.converge(model, desired, index)
            if outcome == "redeployed":
                report.redeployed.append(model)
            elif outcome == "re-pointed":
                report.loaded.append(model)
            return
        marker = self._staging.read_marker(model)
        entry = index.get(model)
        loaded = entry is not None and entry.state == "READY"
        on_disk = marker.release if marker else None
        # Record what is really there before acting, so every later transition is valid.
        if loaded:
            self._slots.observe(model, SlotState.ACTIVE, on_disk, "READY in Triton at start-up")
        elif marker is not None:
            self._slots.observe(model, SlotState.UNAVAILABLE, on_disk, "on disk, not loaded")
        else:
            self._slots.observe(model, SlotState.ABSENT, None, "not in the repository")

        if desired is None:
            if marker is not None and self._unconfirmed(marker.operation_id, interrupted, model):
                if loaded:
                    await self._triton.unload(model)
                    await self._triton.wait_unavailable(model, self._unload_timeout)
                await asyncio.to_thread(self._staging.remove, model)
                self._slots.observe(model, SlotState.ABSENT, None, "unconfirmed deploy removed")
                report.removed.append(model)
            return

        if on_disk == desired:
            if not loaded:
                await self._triton.load(model)
                self._slots.observe(model, SlotState.ACTIVE, desired, "loaded by reconcile")
                report.loaded.append(model)
            return

        log.warning(
            "%s: repository holds %s but %s should serve; deploying %s again",
            model,
            on_disk or "nothing",
            desired,
            desired,
        )
        operation = await self._deploy.run_inline(model, desired, trigger=Trigger.RECONCILE)
        if operation.status is not OperationStatus.SUCCEEDED:
            message = operation.error.message if operation.error else operation.status.value
            raise ControlPlaneError(f"redeploy of {desired} failed: {message}")
        report.redeployed.append(model)


async def reconcile_until_done(
    reconciler: Reconciler, ready: asyncio.Event, *, retry_interval: float = 2.0
) -> None:
    """Retry reconcile while Triton is unreachable; set ``ready`` once it has run."""
    while True:
        try:
            await reconciler.run()
        except ControlPlaneError as exc:
            if not exc.retryable:
                log.error("reconcile failed: %s", exc)
                ready.set()
                return
            log.warning("reconcile waits for Triton: %s", exc)
            await asyncio.sleep(retry_interval)
            continue
        ready.set()
        return
