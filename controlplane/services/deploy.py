"""The operations on models: deploy, rollback, unload, retire, the CPU-only reload.

Entry points validate, take the model's lock and return the operation; the bodies run in a
task (``inplace`` in :mod:`.inplace`, ``blue-green`` in :mod:`.bluegreen`). Invariants:

* All operations on one model are serialized (:class:`ModelLocks`); loads across models are
  bounded by a semaphore.
* ``submit`` runs ``resolve`` before it returns, so a release that does not exist or is not
  complete is refused at once; the rest runs in a task the caller may await.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controlplane.domain.errors import (
    ControlPlaneError,
    ModelNotFound,
    NoPreviousRelease,
    OperationInProgress,
    OperationNotFound,
    ReleaseIncomplete,
)
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.operations import Operation, OperationKind, OperationStatus, Trigger
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.ports import (
    Clock,
    MetricsSource,
    ModelConfigEditor,
    ModelStore,
    Staging,
    StateRepo,
    Telemetry,
    Triton,
)
from controlplane.services.bluegreen import BlueGreen
from controlplane.services.coordination import ModelLocks, TaskOwner
from controlplane.services.cpu_fallback import reload_on_cpu
from controlplane.services.headroom import HeadroomPolicy
from controlplane.services.inplace import Inplace
from controlplane.services.memory import LeakPolicy, MemoryWatch
from controlplane.services.pipeline import PipelineDeps
from controlplane.services.slots import SlotBook
from controlplane.services.telemetry import NO_TELEMETRY
from controlplane.services.tracker import OperationTracker, current_operation

log = logging.getLogger(__name__)
RETIRE_RETRY = 1.0


class _NoMetrics:
    """No metrics source: pending requests are unknown, and the drain relies on the retire
    window (traffic left the slot ``retire_after`` ago) instead."""

    async def pending_requests(self, model: str) -> int | None:
        return None

    async def close(self) -> None:
        return None


@dataclass(frozen=True)
class DeployPolicy:
    require_checksums: bool = True
    unload_timeout: float = 120.0


class DeployService:
    def __init__(
        self,
        *,
        store: ModelStore,
        staging: Staging,
        editor: ModelConfigEditor,
        triton: Triton,
        repo: StateRepo,
        clock: Clock,
        locks: ModelLocks,
        tasks: TaskOwner,
        load_slots: asyncio.Semaphore,
        policy: DeployPolicy,
        traffic: Callable[[str], TrafficPolicy] | None = None,
        metrics: MetricsSource | None = None,
        telemetry: Telemetry = NO_TELEMETRY,
        headroom: HeadroomPolicy | None = None,
        memory: MemoryWatch | None = None,
    ) -> None:
        self._telemetry = telemetry
        self._headroom = headroom or HeadroomPolicy()
        self._memory = memory or MemoryWatch(
            processes=None, figures=None, repo=repo, clock=clock, policy=LeakPolicy()
        )
        self._store = store
        self._staging = staging
        self._editor = editor
        self._triton = triton
        self._repo = repo
        self._clock = clock
        self._locks = locks
        self._tasks = tasks
        self._load_slots = load_slots
        self._policy = policy
        self._slots = SlotBook(repo, clock)
        self._traffic = traffic or (lambda _model: TrafficPolicy(strategy=Strategy.INPLACE))
        deps = PipelineDeps(
            store=store,
            staging=staging,
            editor=editor,
            triton=triton,
            metrics=metrics or _NoMetrics(),
            repo=repo,
            clock=clock,
            load_slots=load_slots,
            require_checksums=policy.require_checksums,
            unload_timeout=policy.unload_timeout,
            policy_for=self._traffic,
            headroom=self._headroom,
            memory=self._memory,
        )
        self._bg = BlueGreen(
            deps, schedule_retire=self._schedule_retire, cancel_retire=self.cancel_retire
        )
        self._inplace = Inplace(deps)

    # --- entry points -----------------------------------------------------------------

    async def deploy(
        self,
        model: str,
        release: str,
        *,
        trigger: Trigger,
        kind: OperationKind | None = None,
        force: bool = False,
    ) -> Operation:
        """Serve ``release``; ``force`` loads it even when the headroom check says no room."""
        validate_model_name(model)
        validate_release_name(release)
        blue_green = self._traffic(model).strategy is Strategy.BLUE_GREEN
        body = self._bg.deploy if blue_green else self._inplace.deploy
        return await self._submit(
            kind or OperationKind.DEPLOY,
            model,
            release,
            trigger,
            lambda tracker: body(tracker, force=force),
        )

    async def rollback(self, model: str, *, to: str | None, trigger: Trigger) -> Operation:
        validate_model_name(model)
        if to in (None, "", "previous"):
            record = self._repo.get_model(model)
            if record is None:
                raise ModelNotFound(f"model {model!r} has never been deployed here")
            if record.previous_release is None:
                raise NoPreviousRelease(
                    f"model {model!r} has no previous release to roll back to; name one with 'to'"
                )
            target = record.previous_release
        else:
            target = validate_release_name(to)
        warm = (
            self._bg.warm(model, target)
            if self._traffic(model).strategy is Strategy.BLUE_GREEN
            else None
        )
        if warm is not None:  # inside the retire window: a pure re-point
            slot_name = warm.name
            return await self._submit(
                OperationKind.ROLLBACK,
                model,
                target,
                trigger,
                lambda tracker: self._bg.repoint_back(tracker, slot_name),
                resolve=False,
            )
        return await self.deploy(model, target, trigger=trigger, kind=OperationKind.ROLLBACK)

    async def unload(self, model: str, *, trigger: Trigger) -> Operation:
        validate_model_name(model)
        record = self._repo.get_model(model)
        if record is None or record.active_release is None:
            raise ModelNotFound(f"model {model!r} is not serving here; nothing to unload")
        blue_green = self._traffic(model).strategy is Strategy.BLUE_GREEN
        body = self._bg.unload if blue_green else self._inplace.unload
        return await self._submit(OperationKind.UNLOAD, model, None, trigger, body)

    async def serve_on_cpu(self, model: str, *, trigger: Trigger) -> Operation:
        """Reload the serving release with CPU-only instances (the rollback chain's last step)."""
        validate_model_name(model)
        record = self._repo.get_model(model)
        if record is None or record.active_release is None:
            raise ModelNotFound(f"model {model!r} is not serving here; nothing to move to CPU")
        slot_name = model
        if self._traffic(model).strategy is Strategy.BLUE_GREEN:
            active = self._bg.active(model)
            if active is None:
                raise ModelNotFound(f"model {model!r} has no active slot to move to CPU")
            slot_name = active.name
        return await self._submit(
            OperationKind.CPU_FALLBACK,
            model,
            record.active_release,
            trigger,
            lambda tracker: reload_on_cpu(
                tracker, triton=self._triton, slots=self._slots, slot_name=slot_name
            ),
            resolve=False,
        )

    async def cancel(self, operation_id: str) -> Operation:
        """Cut a running operation short (its own cleanup runs) and wait until it has ended."""
        task = self._tasks.get(operation_id)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        return self.get_operation(operation_id)

    # --- retiring old blue-green slots ------------------------------------------------

    def schedule_retire(self, model: str, slot_name: str, *, now: bool = False) -> None:
        """Retire ``slot_name`` after the model's retire window (or at once)."""
        key = f"retire-{slot_name}"
        self._tasks.cancel(key)  # a newer switch restarts the slot's retire window
        delay = 0.0 if now else self._traffic(model).retire_after
        self._tasks.spawn(key, self._retire_later(model, slot_name, delay))

    def cancel_retire(self, slot_name: str) -> None:
        self._tasks.cancel(f"retire-{slot_name}")

    def _schedule_retire(self, model: str, slot_name: str) -> None:
        self.schedule_retire(model, slot_name)

    async def _retire_later(self, model: str, slot_name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        while True:
            try:
                operation = await self._submit(
                    OperationKind.RETIRE,
                    model,
                    None,
                    Trigger.SCHEDULE,
                    lambda tracker: self._bg.retire(tracker, slot_name),
                )
            except OperationInProgress:
                await asyncio.sleep(RETIRE_RETRY)  # another operation first; then retire
                continue
            await self.wait(operation.id)
            return

    async def wait(self, operation_id: str) -> Operation:
        task = self._tasks.get(operation_id)
        if task is not None:
            await asyncio.shield(task)
        return self.get_operation(operation_id)

    def get_operation(self, operation_id: str) -> Operation:
        operation = self._repo.get_operation(operation_id)
        if operation is None:
            raise OperationNotFound(f"no operation with id {operation_id!r}")
        return operation

    def list_operations(self, model: str | None, limit: int) -> list[Operation]:
        if model is not None:
            validate_model_name(model)
        return self._repo.list_operations(model, limit)

    async def run_inline(self, model: str, release: str, *, trigger: Trigger) -> Operation:
        """Deploy and wait, for reconcile: same pipeline, same records."""
        operation = await self.deploy(model, release, trigger=trigger)
        return await self.wait(operation.id)

    # --- submission -------------------------------------------------------------------

    async def _submit(
        self,
        kind: OperationKind,
        model: str,
        release: str | None,
        trigger: Trigger,
        body: Callable[[OperationTracker], Awaitable[None]],
        *,
        resolve: bool = True,
    ) -> Operation:
        operation_id = uuid.uuid4().hex[:16]
        self._locks.claim(model, operation_id)
        try:
            record = self._repo.get_model(model)
            tracker = OperationTracker(
                Operation(
                    id=operation_id,
                    kind=kind,
                    model=model,
                    release=release,
                    trigger=trigger,
                    status=OperationStatus.RUNNING,
                    created_at=self._clock.now(),
                    from_release=record.active_release if record else None,
                ),
                self._repo,
                self._clock,
                self._telemetry,
            )
        except BaseException:
            self._locks.release(model, operation_id)
            raise
        try:
            if release is not None and resolve:
                await self._resolve(tracker, model, release)
        except BaseException as exc:
            if isinstance(exc, ControlPlaneError):
                tracker.fail(exc)
                exc.details.setdefault("operation_id", operation_id)
            elif isinstance(exc, Exception):
                tracker.fail(ControlPlaneError(f"unexpected error: {exc!r}"))
            else:
                tracker.interrupt()
            self._locks.release(model, operation_id)
            raise
        self._tasks.spawn(operation_id, self._run(tracker, body))
        return tracker.operation

    async def _resolve(self, tracker: OperationTracker, model: str, release: str) -> None:
        async with tracker.step("resolve"):
            info = await asyncio.to_thread(self._store.describe, model, release)
            self._repo.record_releases([info], self._clock.now())
            tracker.detail(store=self._store.uri, complete=info.complete)
            if not info.complete and self._policy.require_checksums:
                raise ReleaseIncomplete(
                    f"release {release!r} of model {model!r} has no SHA256SUMS yet; the "
                    "publisher writes it last, so the release is still being published (or "
                    "set store.require_checksums: false to deploy releases without one)"
                )

    async def _run(
        self, tracker: OperationTracker, body: Callable[[OperationTracker], Awaitable[None]]
    ) -> None:
        operation = tracker.operation
        current_operation.set(operation.id)  # this task's own context
        try:
            await body(tracker)
            tracker.succeed()
            if operation.kind in (OperationKind.DEPLOY, OperationKind.ROLLBACK):
                await self._sample_memory(tracker.operation)
            chosen = operation.trigger in (Trigger.API, Trigger.CLI) and operation.release
            # A person or CI chose this release: it is no longer latched degraded.
            if chosen and self._repo.clear_degraded(operation.model, operation.release or ""):
                log.info("%s %s is no longer degraded", operation.model, operation.release)
        except ControlPlaneError as exc:
            tracker.fail(exc)
        except asyncio.CancelledError:
            tracker.interrupt()
            raise
        except Exception as exc:
            log.exception("operation %s failed unexpectedly", operation.id)
            tracker.fail(ControlPlaneError(f"unexpected error: {exc!r}"))
        finally:
            await asyncio.to_thread(self._staging.cleanup, operation.id)
            self._locks.release(operation.model, operation.id)

    async def _sample_memory(self, operation: Operation) -> None:
        try:
            await self._memory.after_swap(operation)
        except Exception:  # the swap is done; a failed sample must not say otherwise
            log.exception("sampling Triton's memory after %s failed", operation.id)
