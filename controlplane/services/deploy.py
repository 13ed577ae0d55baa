"""The operations on models: deploy, rollback, unload, the CPU-only reload.

Entry points validate, take the model's lock and make the checks that can refuse a request
(the release exists and is complete) before anything is recorded: a refusal before any work is
an error answer, not an operation. The bodies run in a task owned by the
:class:`~controlplane.services.runner.OperationRunner` (``inplace`` in :mod:`.inplace`,
``blue-green`` in :mod:`.bluegreen`). Invariants:

* All operations on one model are serialized (the runner's lock); loads across models are
  bounded by :class:`~controlplane.services.coordination.LoadSlots`.
* Deploying the release that already serves, unchanged in the store, does nothing and says so
  (:class:`Unchanged`), as ``kubectl apply`` does; ``force`` loads it again.
* A rollback a person asks for rejects the release it leaves: it is latched degraded, so it is
  neither the fallback nor pushed again by the watcher until someone deploys it by name.
* In a fleet, what a person, CI or the release watcher asks of this member is published to the
  fleet's desired state as the operation's last step, once it serves here
  (:mod:`.fleet_ledger`); what the fleet's sync asks (trigger ``fleet``), repairs, retires and
  automatic rollbacks (they move the fleet afterwards) publish nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from controlplane.domain.errors import (
    ControlPlaneError,
    ModelNotFound,
    NoPreviousRelease,
    ReleaseIncomplete,
    StoreUnavailable,
)
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.operations import (
    NO_CAUSE,
    CancelReason,
    Cause,
    Operation,
    OperationKind,
    Step,
    StepStatus,
    Trigger,
    Unchanged,
)
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.rollback import DegradedRelease
from controlplane.domain.slots import SlotState
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.ports import (
    Clock,
    ModelStore,
    OperationLog,
    ReleaseBook,
    RollbackBook,
    Staging,
    Triton,
)
from controlplane.services.bluegreen import BlueGreen
from controlplane.services.cpu_fallback import reload_on_cpu
from controlplane.services.fleet_ledger import FleetBase, FleetLedger, fleet_agrees
from controlplane.services.inplace import Inplace
from controlplane.services.memory import MemoryWatch
from controlplane.services.runner import REFUSE, AfterSuccess, Body, OperationRunner, Patience, Run
from controlplane.services.slots import SlotBook

log = logging.getLogger(__name__)
PEOPLE = (Trigger.API, Trigger.CLI)


class DeployService:
    def __init__(
        self,
        *,
        store: ModelStore,
        staging: Staging,
        triton: Triton,
        runner: OperationRunner,
        slots: SlotBook,
        journal: OperationLog,
        releases: ReleaseBook,
        rollbacks: RollbackBook,
        bluegreen: BlueGreen,
        inplace: Inplace,
        memory: MemoryWatch,
        clock: Clock,
        policy_for: Callable[[str], TrafficPolicy],
        require_checksums: bool = True,
        unload_timeout: float = 60.0,
        fleet: FleetLedger | None = None,
    ) -> None:
        self._store = store
        self._staging = staging
        self._triton = triton
        self._runner = runner
        self._slots = slots
        self._journal = journal
        self._releases = releases
        self._rollbacks = rollbacks
        self.bluegreen = bluegreen
        self._inplace = inplace
        self._memory = memory
        self._clock = clock
        self._policy_for = policy_for
        self._require_checksums = require_checksums
        self._unload_timeout = unload_timeout
        self.fleet = fleet

    def blue_green(self, model: str) -> bool:
        return self._policy_for(model).strategy is Strategy.BLUE_GREEN

    async def is_warm(self, model: str, release: str) -> bool:
        """Whether serving ``release`` again is a re-point (its slot is still loaded)."""
        return self.blue_green(model) and await self.bluegreen.warm(model, release) is not None

    # --- entry points -----------------------------------------------------------------

    async def deploy(
        self,
        model: str,
        release: str,
        *,
        trigger: Trigger,
        kind: OperationKind = OperationKind.DEPLOY,
        force: bool = False,
        cause: Cause = NO_CAUSE,
        patience: Patience = REFUSE,
        patient: bool = False,
    ) -> Operation | Unchanged:
        """Serve ``release``. ``force`` loads it even when it serves already, or when the
        headroom check finds too little free memory. ``cause`` is recorded on the operation;
        ``patience`` says how long to wait for an operation that holds the model.
        ``patient``: the caller waits for the operation anyway, so the checks before it is
        recorded ride out a store outage as the fetch does, rather than refuse at once."""
        validate_model_name(model)
        validate_release_name(release)
        base = await self._fleet_base(model, kind, trigger, patient=patient)
        if not force and kind is OperationKind.DEPLOY:
            unchanged = await self._unchanged(model, release)
            if (
                unchanged is not None
                and fleet_agrees(base, release)
                and not (base is not None and await self._held(model, release))
            ):
                log.info("%s", unchanged.message, extra={"model": model, "release": release})
                return unchanged
            if unchanged is not None:  # it serves here already: only the fleet has to hear it
                return await self._start(
                    kind,
                    model,
                    release,
                    trigger,
                    lambda run: self._publish(run, base, release),
                    cause=cause,
                    patience=patience,
                )
        strategy = self.bluegreen if self.blue_green(model) else self._inplace
        info: ReleaseInfo | None = None

        async def resolve() -> Step:
            nonlocal info
            resolved, info = await self._resolve(model, release, patient=patient)
            return resolved

        async def body(run: Run) -> None:
            assert info is not None  # resolved before the operation was recorded
            await strategy.deploy(run, revision=info.revision, force=force)
            await self._publish(run, base, release)

        return await self._start(
            kind,
            model,
            release,
            trigger,
            body,
            check=resolve,
            after=self._after_swap,
            cause=cause,
            patience=patience,
        )

    async def rollback(
        self,
        model: str,
        *,
        to: str | None,
        trigger: Trigger,
        cause: Cause = NO_CAUSE,
        patience: Patience = REFUSE,
        patient: bool = False,
    ) -> Operation | Unchanged:
        """Serve the previous release again (or ``to``); a re-point when its slot is warm.
        Rolling back to the release that serves, unchanged, does nothing and says so."""
        validate_model_name(model)
        base = await self._fleet_base(model, OperationKind.ROLLBACK, trigger, patient=patient)
        if to in (None, "", "previous"):
            record = await self._slots.record(model)
            if record is None or record.active_release is None:
                raise ModelNotFound(f"model {model!r} is not serving here; nothing to roll back")
            previous = record.previous_release
            if base is not None and base.record is not None:  # the fleet's, as just read
                previous = base.record.previous_for(record.active_release, previous)
            if previous is None:
                raise NoPreviousRelease(
                    f"model {model!r} has no previous release to roll back to; name one with 'to'"
                )
            target = previous
        else:
            target = validate_release_name(to)
        unchanged = await self._unchanged(model, target)
        if unchanged is not None and fleet_agrees(base, target):
            return unchanged
        if unchanged is not None:  # it serves here already: only the fleet has to hear it
            return await self._start(
                OperationKind.ROLLBACK,
                model,
                target,
                trigger,
                lambda run: self._publish(run, base, target),
                cause=cause,
                patience=patience,
            )
        warm = await self.bluegreen.warm(model, target) if self.blue_green(model) else None
        if warm is None:
            return await self.deploy(
                model,
                target,
                trigger=trigger,
                kind=OperationKind.ROLLBACK,
                cause=cause,
                patience=patience,
                patient=patient,
            )
        slot_name = warm.name  # inside the retire window: a pure re-point

        async def body(run: Run) -> None:
            await self.bluegreen.repoint_back(run, slot_name)
            await self._publish(run, base, target)

        return await self._start(
            OperationKind.ROLLBACK,
            model,
            target,
            trigger,
            body,
            after=self._after_swap,
            cause=cause,
            patience=patience,
        )

    async def unload(
        self,
        model: str,
        *,
        trigger: Trigger,
        cause: Cause = NO_CAUSE,
        patience: Patience = REFUSE,
    ) -> Operation:
        validate_model_name(model)
        base = await self._fleet_base(model, OperationKind.UNLOAD, trigger)
        record = await self._slots.record(model)
        if record is None or record.active_release is None:
            if base is not None and base.record is not None and base.record.release is not None:
                # Not here, but the fleet serves it elsewhere: unloading it is the fleet's.
                return await self._start(
                    OperationKind.UNLOAD,
                    model,
                    None,
                    trigger,
                    lambda run: self._publish(run, base, None),
                    cause=cause,
                    patience=patience,
                )
            raise ModelNotFound(f"model {model!r} is not serving here; nothing to unload")
        unload = self.bluegreen.unload if self.blue_green(model) else self._inplace.unload

        async def body(run: Run) -> None:
            await unload(run)
            await self._publish(run, base, None)

        return await self._start(
            OperationKind.UNLOAD, model, None, trigger, body, cause=cause, patience=patience
        )

    async def serve_on_cpu(
        self,
        model: str,
        *,
        trigger: Trigger,
        cause: Cause = NO_CAUSE,
        patience: Patience = REFUSE,
    ) -> Operation:
        """Reload the serving release with CPU-only instances (the rollback chain's last step)."""
        validate_model_name(model)
        record = await self._slots.record(model)
        if record is None or record.active_release is None:
            raise ModelNotFound(f"model {model!r} is not serving here; nothing to move to CPU")
        slot_name = model
        if self.blue_green(model):
            active = await self.bluegreen.active(model)
            if active is None:
                raise ModelNotFound(f"model {model!r} has no active slot to move to CPU")
            slot_name = active.name
        return await self._start(
            OperationKind.CPU_FALLBACK,
            model,
            record.active_release,
            trigger,
            lambda run: reload_on_cpu(
                run, triton=self._triton, slots=self._slots, slot_name=slot_name
            ),
            cause=cause,
            patience=patience,
        )

    async def cancel(self, operation_id: str, reason: CancelReason) -> Operation:
        """Cut a running operation short for ``reason`` (its own clean-up runs)."""
        return await self._runner.cancel(operation_id, reason)

    async def wait(self, operation_id: str) -> Operation:
        return await self._runner.wait(operation_id)

    async def get_operation(self, operation_id: str) -> Operation:
        return await self._runner.get(operation_id)

    async def list_operations(self, model: str | None, limit: int) -> list[Operation]:
        if model is not None:
            validate_model_name(model)
        return await self._journal.recent(model, limit)

    def holder(self, model: str) -> str | None:
        return self._runner.holder(model)

    # --- the fleet ----------------------------------------------------------------------

    async def _fleet_base(
        self, model: str, kind: OperationKind, trigger: Trigger, *, patient: bool = False
    ) -> FleetBase | None:
        """The fleet's record this request replaces, read before the operation is recorded:
        as patient with the store as :meth:`_resolve` is."""
        if self.fleet is None:
            return None
        try:
            return await self.fleet.base_for(model, kind, trigger, patient=patient)
        except StoreUnavailable as exc:
            if patient:
                raise
            raise _store_away(self._store.uri, exc) from exc

    async def _held(self, model: str, release: str) -> bool:
        """A member holds back from ``release``: deploying it again is a new decision."""
        return self.fleet is not None and await self.fleet.held_by_a_member(model, release)

    async def _publish(self, run: Run, base: FleetBase | None, release: str | None) -> None:
        if base is not None and self.fleet is not None:
            await self.fleet.publish_result(run, base, release)

    # --- pieces -----------------------------------------------------------------------

    async def _start(
        self,
        kind: OperationKind,
        model: str,
        release: str | None,
        trigger: Trigger,
        body: Body,
        *,
        check: Callable[[], Awaitable[Step]] | None = None,
        after: AfterSuccess | None = None,
        cause: Cause = NO_CAUSE,
        patience: Patience = REFUSE,
    ) -> Operation:
        """Take the model's lock (waiting as ``patience`` allows), make ``check`` (a refusal
        there is not an operation), then record the operation, with the check as its first
        step, and run ``body``."""
        operation_id = await self._runner.claim(model, patience)
        try:
            checked = [await check()] if check is not None else []
            record = await self._slots.record(model)
        except BaseException:
            self._runner.release(model, operation_id)
            raise
        return await self._runner.start(
            operation_id,
            kind=kind,
            model=model,
            release=release,
            trigger=trigger,
            from_release=record.active_release if record else None,
            body=body,
            done_steps=checked,
            after=after,
            cause=cause,
        )

    async def _resolve(
        self, model: str, release: str, *, patient: bool
    ) -> tuple[Step, ReleaseInfo]:
        """The release exists and is complete; else a refusal, and no operation.

        A store that does not answer is tried again by the store's own retry policy: for a
        few seconds, then a refusal that says to retry; ``patient``, for as long as a fetch
        would be (``store.retry_seconds``), since the caller waits for the operation anyway."""
        started = self._clock.now()
        try:
            info = await asyncio.to_thread(self._store.describe, model, release, patient=patient)
        except StoreUnavailable as exc:
            if patient:
                raise
            raise _store_away(self._store.uri, exc) from exc
        await self._releases.record([info], self._clock.now())
        if not info.complete and self._require_checksums:
            raise ReleaseIncomplete(
                f"release {release!r} of model {model!r} has no SHA256SUMS yet; the "
                "publisher writes it last, so the release is still being published (or "
                "set store.require_checksums: false to deploy releases without one)"
            )
        step = Step(
            name="resolve",
            status=StepStatus.SUCCEEDED,
            started_at=started,
            finished_at=self._clock.now(),
            detail={"store": self._store.uri, "complete": info.complete},
        )
        return step, info

    async def _unchanged(self, model: str, release: str) -> Unchanged | None:
        """``release`` serves already, from the same revision the store holds, and Triton
        says it is READY: a deploy of it would change nothing."""
        record = await self._slots.record(model)
        if record is None or record.active_release != release:
            return None
        if self.blue_green(model):
            active = await self.bluegreen.active(model)
            slot_name = active.name if active is not None else None
        else:
            slot = await self._slots.get(model)
            slot_name = model if slot.state is SlotState.ACTIVE else None
        if slot_name is None:
            return None
        marker = await asyncio.to_thread(self._staging.read_marker, slot_name)
        try:
            info = await asyncio.to_thread(self._store.describe, model, release)
            index = {e.name: e.state for e in await self._triton.index()}
        except ControlPlaneError:
            return None  # the deploy itself will say what is wrong
        if marker is None or marker.release != release or marker.revision != info.revision:
            return None
        if index.get(slot_name) != "READY" or index.get(model) != "READY":
            return None
        return Unchanged(
            model,
            release,
            f"{model} serves {release} already (same revision in the store); nothing to do. "
            "Deploy with force to load it again",
        )

    async def _after_swap(self, operation: Operation) -> None:
        """After a deploy or rollback succeeded, still holding the model: sample Triton's
        memory, and update the latches of the releases a person chose or rejected."""
        if operation.kind in (OperationKind.DEPLOY, OperationKind.ROLLBACK):
            await self._memory.after_swap(operation)
        if operation.trigger not in PEOPLE or operation.release is None:
            return
        # A person or CI chose this release: it is no longer latched degraded.
        if await self._rollbacks.unlatch(operation.model, operation.release):
            log.info("%s %s is no longer degraded", operation.model, operation.release)
        rejected = operation.from_release
        if operation.kind is OperationKind.ROLLBACK and rejected and rejected != operation.release:
            await self._rollbacks.latch(
                DegradedRelease(
                    operation.model,
                    rejected,
                    self._clock.now(),
                    f"rolled back from by {operation.trigger.value} (operation {operation.id})",
                )
            )
            log.info(
                "%s %s is latched degraded: a person rolled back from it", operation.model, rejected
            )


def _store_away(where: str, exc: StoreUnavailable) -> StoreUnavailable:
    """The refusal of a request that does not wait, when the store did not answer a check
    made before its operation is recorded (within the scans' few seconds)."""
    return StoreUnavailable(
        f"the store {where} is away, nothing was started: {exc.message}. Retry in a few "
        "seconds; asked with wait, a deploy rides out an S3 outage of up to "
        "store.retry_seconds",
        details=exc.details,
    )
