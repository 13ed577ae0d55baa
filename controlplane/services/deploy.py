"""The operations on models: deploy, rollback, unload, the CPU-only reload.

Entry points validate, take the model's lock and make the checks that can refuse a request
(the release exists and is complete) before anything is recorded: a refusal before any work is
an error answer, not an operation. The bodies run in a task owned by the
:class:`~controlplane.services.runner.OperationRunner`; what they do to the model is its
strategy's (:mod:`.strategy`: ``inplace`` in :mod:`.inplace`, ``blue-green`` in
:mod:`.bluegreen`). Invariants:

* All operations on one model are serialized (the runner's lock); loads across models are
  bounded by :class:`~controlplane.services.runner.LoadSlots`.
* Deploying the release that already serves, unchanged in the store, does nothing and says so
  (:class:`Unchanged`), as ``kubectl apply`` does; ``force`` loads it again.
* No request, release watcher, rollback or fleet's desired state makes a release that sorts
  before the model's floor (``min_release``) serve: it is refused before anything is recorded
  (``release_below_floor``). Repairs put back what serves, floor or not.
* A rollback a person asks for rejects the release it leaves: it is latched degraded, so it is
  neither the fallback nor pushed again by the watcher until someone deploys it by name.
* In a fleet, a rollback during a canary rollout goes back to the rollout's stable release on
  whichever member it reaches, and leaves the canary's release (``domain.rollout.
  rollback_aim``), never that member's own previous release.
* In a fleet, what a person, CI or the release watcher asks of this member is published to the
  fleet's desired state as the operation's last step, once it serves here
  (:mod:`.fleet_ledger`); what the fleet's sync asks (trigger ``fleet``), repairs, retires and
  automatic rollbacks (they move the fleet afterwards) publish nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from controlplane.domain.errors import (
    ControlPlaneError,
    ModelNotFound,
    NoPreviousRelease,
    StoreUnavailable,
)
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.operations import (
    NO_CAUSE,
    REFUSE,
    Cause,
    Operation,
    OperationKind,
    Patience,
    Trigger,
    Unchanged,
    housekeeping,
)
from controlplane.domain.publish import FleetBase, fleet_agrees, publishes
from controlplane.domain.releases import check_floor
from controlplane.domain.rollout import rollback_aim
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.domain.triton import TritonState
from controlplane.ports import (
    Clock,
    ModelStore,
    OperationLog,
    ReleaseBook,
    RollbackBook,
    Staging,
    Triton,
)
from controlplane.services.cpu_fallback import reload_on_cpu
from controlplane.services.fleet_ledger import FleetLedger
from controlplane.services.memory import MemoryWatch
from controlplane.services.prepare import Preparer, store_away
from controlplane.services.runner import CANCEL_GRACE, Claim, OperationRunner, Run
from controlplane.services.slots import SlotBook, SlotSnapshot
from controlplane.services.strategy import ModelStrategy
from controlplane.services.swaps import SwapFollowUp

log = logging.getLogger(__name__)
READY = TritonState.READY


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
        strategies: Mapping[Strategy, ModelStrategy],
        preparer: Preparer,
        memory: MemoryWatch,
        clock: Clock,
        policy_for: Callable[[str], TrafficPolicy],
        unload_seconds: float = 120.0,
        fleet: FleetLedger | None = None,
        floor_for: Callable[[str], str | None] = lambda _model: None,
    ) -> None:
        self._unload_seconds = unload_seconds
        self._floor_for = floor_for
        self._store = store
        self._staging = staging
        self._triton = triton
        self._runner = runner
        self._slots = slots
        self._journal = journal
        self._releases = releases
        self._rollbacks = rollbacks
        self._after_swap = SwapFollowUp(memory=memory, rollbacks=rollbacks, clock=clock)
        self._strategies = strategies
        self._preparer = preparer
        self._clock = clock
        self._policy_for = policy_for
        self.fleet = fleet

    def strategy(self, model: str) -> ModelStrategy:
        return self._strategies[self._policy_for(model).strategy]

    async def snapshot(self, model: str) -> SlotSnapshot:
        """The model as recorded, with the slots its strategy names."""
        return await self._slots.snapshot(model, self.strategy(model).slot_names(model))

    def behind_housekeeping(self, model: str) -> Patience:
        """Wait behind the daemon's own freeing of an old slot of ``model``: a retire holds
        it at most its drain, its unload and the grace of a cut."""
        bound = self._policy_for(model).drain_timeout + self._unload_seconds + CANCEL_GRACE
        return housekeeping(bound)

    async def is_warm(self, model: str, release: str) -> bool:
        """Whether serving ``release`` again needs no load (its slot is still loaded)."""
        return self.strategy(model).warm(await self.snapshot(model), release) is not None

    # --- entry points -----------------------------------------------------------------
    #
    # Each claims the model first (waiting as ``patience`` allows), reads it once, and makes
    # the checks that can refuse: a refusal, or a request that changes nothing, releases the
    # model and is no operation. ``patient``: the caller waits for the operation anyway, so
    # the checks ride out a store outage as the fetch does, rather than refuse at once.

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
        headroom check finds too little free memory. ``cause`` is recorded on the operation."""
        validate_model_name(model)
        validate_release_name(release)
        if trigger is not Trigger.RECONCILE:  # a repair puts back what serves, floor or not
            check_floor(model, release, self._floor_for(model))
        async with self._runner.claimed(model, patience) as claim:
            snapshot = await self.snapshot(model)
            base = await self._fleet_base(model, kind, trigger, patient=patient)
            if not force and kind is OperationKind.DEPLOY:
                unchanged = await self._unchanged(snapshot, release)
                settled = unchanged is not None and fleet_agrees(base, release)
                if unchanged is not None and settled and not await self._held(base, model, release):
                    log.info("%s", unchanged.message, extra={"model": model, "release": release})
                    return unchanged
                if unchanged is not None:  # it serves here already: only the fleet must hear
                    return await self._publish_only(
                        claim, snapshot, kind, release, trigger, base, cause
                    )
            return await self._load(
                claim, snapshot, kind, release, trigger, base, cause, force, patient
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
        kind = OperationKind.ROLLBACK
        async with self._runner.claimed(model, patience) as claim:
            snapshot = await self.snapshot(model)
            base = await self._fleet_base(model, kind, trigger, patient=patient)
            target = self._rollback_target(snapshot, base, to)
            check_floor(model, target, self._floor_for(model))
            unchanged = await self._unchanged(snapshot, target)
            if unchanged is not None and fleet_agrees(base, target):
                return unchanged
            if unchanged is not None:  # it serves here already: only the fleet has to hear it
                return await self._publish_only(claim, snapshot, kind, target, trigger, base, cause)
            strategy = self.strategy(model)
            warm = strategy.warm(snapshot, target)
            if warm is not None and await self._edited(warm.name):
                warm = None  # its files are not the release's any more: placed again, loaded
            if warm is None:
                return await self._load(
                    claim, snapshot, kind, target, trigger, base, cause, False, patient
                )

            async def body(run: Run) -> None:  # inside the retire window: no load
                await strategy.roll_back(run, snapshot, warm)
                await self._publish(run, base, target)

            return await claim.start(
                kind,
                target,
                trigger,
                body,
                from_release=snapshot.active_release,
                after=self._after_swap,
                cause=cause,
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
        kind = OperationKind.UNLOAD
        async with self._runner.claimed(model, patience) as claim:
            snapshot = await self.snapshot(model)
            base = await self._fleet_base(model, kind, trigger)
            if snapshot.active_release is None:
                if base is not None and base.record is not None and base.record.release:
                    # Not here, but the fleet serves it elsewhere: unloading it is the fleet's.
                    return await self._publish_only(
                        claim, snapshot, kind, None, trigger, base, cause
                    )
                raise ModelNotFound(f"model {model!r} is not serving here; nothing to unload")
            strategy = self.strategy(model)

            async def body(run: Run) -> None:
                await strategy.unload(run, snapshot)
                await self._publish(run, base, None)

            return await claim.start(
                kind, None, trigger, body, from_release=snapshot.active_release, cause=cause
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
        async with self._runner.claimed(model, patience) as claim:
            snapshot = await self.snapshot(model)
            release = snapshot.active_release
            if release is None:
                raise ModelNotFound(f"model {model!r} is not serving here; nothing to move to CPU")
            slot_name = self.strategy(model).serving_name(snapshot)
            if slot_name is None:
                raise ModelNotFound(f"model {model!r} has no active slot to move to CPU")
            return await claim.start(
                OperationKind.CPU_FALLBACK,
                release,
                trigger,
                lambda run: reload_on_cpu(
                    run, triton=self._triton, slots=self._slots, slot=snapshot.slot(slot_name)
                ),
                from_release=release,
                cause=cause,
            )

    # --- the bodies ---------------------------------------------------------------------

    async def _load(
        self,
        claim: Claim,
        snapshot: SlotSnapshot,
        kind: OperationKind,
        release: str,
        trigger: Trigger,
        base: FleetBase | None,
        cause: Cause,
        force: bool,
        patient: bool,
    ) -> Operation:
        """Resolve ``release`` (a refusal here is no operation), then serve it from the store."""
        resolved, info = await self._preparer.resolve(
            snapshot.model, release, self._releases, self._clock, patient=patient
        )
        strategy = self.strategy(snapshot.model)

        async def body(run: Run) -> None:
            await strategy.deploy(run, snapshot, revision=info.revision, force=force)
            await self._publish(run, base, release)

        return await claim.start(
            kind,
            release,
            trigger,
            body,
            from_release=snapshot.active_release,
            done_steps=[resolved],
            after=self._after_swap,
            cause=cause,
        )

    async def _publish_only(
        self,
        claim: Claim,
        snapshot: SlotSnapshot,
        kind: OperationKind,
        release: str | None,
        trigger: Trigger,
        base: FleetBase | None,
        cause: Cause,
    ) -> Operation:
        """It serves here already (or, unloading, nowhere here): only the fleet has to hear."""
        return await claim.start(
            kind,
            release,
            trigger,
            lambda run: self._publish(run, base, release),
            from_release=snapshot.active_release,
            cause=cause,
        )

    def _rollback_target(
        self, snapshot: SlotSnapshot, base: FleetBase | None, to: str | None
    ) -> str:
        """``to``, else what served before: the fleet's (:func:`rollback_aim`), so that during
        a canary rollout every member, canary or not, goes back to the stable release."""
        named = None if to in (None, "", "previous") else validate_release_name(to or "")
        model, active = snapshot.model, snapshot.active_release
        record = base.record if base is not None else None
        aim = rollback_aim(record, active=active, previous=snapshot.previous_release, to=named)
        if aim.to is not None and (named is not None or aim.stops_rollout):
            return aim.to
        if active is None:
            raise ModelNotFound(f"model {model!r} is not serving here; nothing to roll back")
        if aim.to is None:
            raise NoPreviousRelease(
                f"model {model!r} has no previous release to roll back to; name one with 'to'"
            )
        return aim.to

    async def wait(self, operation_id: str) -> Operation:
        """The operation once it has ended (the client's :meth:`~.operations.OperationClient.
        wait` says how it ended, and cuts it past a budget)."""
        return await self._runner.wait(operation_id)

    async def get_operation(self, operation_id: str) -> Operation:
        return await self._runner.get(operation_id)

    async def list_operations(self, model: str | None, limit: int) -> list[Operation]:
        if model is not None:
            validate_model_name(model)
        return await self._journal.recent(model, limit)

    async def _edited(self, slot_name: str) -> bool:
        """Whether the files of a placed slot changed since they were placed (by hand)."""
        marker = await asyncio.to_thread(self._staging.read_marker, slot_name)
        if marker is not None and marker.edited:
            log.warning("%s's files changed since they were placed: not served as is", slot_name)
            return True
        return False

    # --- the fleet ----------------------------------------------------------------------

    async def _fleet_base(
        self, model: str, kind: OperationKind, trigger: Trigger, *, patient: bool = False
    ) -> FleetBase | None:
        """The fleet's record this request replaces, read before the operation is recorded:
        as patient with the store as :meth:`_resolve` is."""
        if self.fleet is None or not publishes(kind, trigger):
            return None
        records = self.fleet.records
        try:
            return FleetBase(await asyncio.to_thread(records.read, model, patient=patient))
        except StoreUnavailable as exc:
            if patient:
                raise
            raise store_away(self._store.uri, exc) from exc

    async def _held(self, base: FleetBase | None, model: str, release: str) -> bool:
        """A member holds back from ``release``: deploying it again is a new decision."""
        if base is None or self.fleet is None:
            return False
        return await self.fleet.held_by_a_member(model, release)

    async def _publish(self, run: Run, base: FleetBase | None, release: str | None) -> None:
        if base is not None and self.fleet is not None:
            await self.fleet.publish_result(run, base, release)

    # --- pieces -----------------------------------------------------------------------

    async def _unchanged(self, snapshot: SlotSnapshot, release: str) -> Unchanged | None:
        """``release`` serves already, from the same revision the store holds, and Triton
        says it is READY: a deploy of it would change nothing."""
        model = snapshot.model
        if snapshot.active_release != release:
            return None
        slot_name = self.strategy(model).serving_name(snapshot)
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
        if index.get(slot_name) is not READY or index.get(model) is not READY:
            return None
        return Unchanged(
            model,
            release,
            f"{model} serves {release} already (same revision in the store); nothing to do. "
            "Deploy with force to load it again",
        )
