"""The reconcile loop: make what Triton serves match what should serve, on a beat.

The daemon never trusts memory alone. At start-up it marks operations that were running when
it died as interrupted and deletes staging leftovers; then, at start-up and every beat
(``reconcile.interval_seconds``), it observes every managed model (its records, the markers of
the dirs it placed, Triton's index, the alias's target), asks :func:`~controlplane.domain.drift.
assess` what is wrong, and repairs it through operations of kind ``repair`` (trigger
``reconcile``): load a release that is on disk, re-point an alias, deploy the desired release
again from the store, take down slots nothing needs. Models with an operation running are left
to it; models the database does not know are left alone (they may belong to someone else).

So a Triton restart, a model unloaded through Triton's own API, or a daemon that died mid-way
are all repaired the same way, without anyone asking. Repairs of different models run in
parallel; their loads share the load slots (a wait shows as a ``queue`` step). While Triton is
down the loop checks its liveness ten times a second, so repairs start as soon as it is back.
Between beats it watches its connection to Triton, which costs nothing while it holds, so a
Triton restart (however quick) is met at once; and while a model it manages is READY it looks
at Triton's index every :data:`INDEX_LOOK` s, so a model unloaded behind its back (Triton's
own API) is met within that, not at the next beat. With nothing managed READY there is nothing
such a look could find, and none is made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from controlplane.domain.drift import NOT_REPAIRED, Action, Assessment, Observed, assess
from controlplane.domain.errors import ControlPlaneError, OperationInProgress
from controlplane.domain.operations import (
    REFUSE,
    Cause,
    Operation,
    OperationKind,
    Trigger,
)
from controlplane.domain.triton import TritonState, index_by_name
from controlplane.ports import (
    Clock,
    IndexEntry,
    ModelRecord,
    OperationLog,
    ReleaseMarker,
    ServingRepo,
    Staging,
    Telemetry,
    Triton,
)
from controlplane.services.deploy import DeployService
from controlplane.services.operations import Ended, OperationClient
from controlplane.services.restart import StartupReport, recover
from controlplane.services.runner import OperationRunner
from controlplane.services.slots import SlotBook, record_serving
from controlplane.services.telemetry import NO_TELEMETRY
from controlplane.timing import Backoff, RetryBook, Wake, Woke

log = logging.getLogger(__name__)
DOWN_POLL = 0.1  # while Triton is down: how often its liveness is checked (a failed connect)
SAY_AGAIN = 60.0  # while Triton is down: the least time between two log lines of a new cause
INDEX_LOOK = 1.0  # between beats: how often Triton's index is looked at (one gRPC call)
# A repair that failed is tried again after RETRY_FIRST, then twice as long each time: the
# first retry is soon, because the commonest cause is a world that changed under the pass
# (Triton restarted between reading its index and acting on it).
RETRY = Backoff(first=0.5, limit=300.0)


@dataclass
class PassReport:
    """What one pass saw and did."""

    triton_live: bool = True
    triton_problem: str | None = None  # not live: why, with Triton's URL and what to check
    error: str | None = None  # the pass could not run to its end
    assessments: dict[str, Assessment] = field(default_factory=dict)
    repairs: dict[str, str] = field(default_factory=dict)  # model -> operation id
    failed: dict[str, str] = field(default_factory=dict)
    busy: list[str] = field(default_factory=list)  # an operation of ours was running
    deferred: dict[str, float] = field(default_factory=dict)  # failed before: next try in s

    @property
    def not_serving(self) -> dict[str, str]:
        return {m: a.why for m, a in self.assessments.items() if not a.serving}


class Reconciler:
    def __init__(
        self,
        *,
        deploy: DeployService,
        runner: OperationRunner,
        client: OperationClient,
        staging: Staging,
        triton: Triton,
        slots: SlotBook,
        serving: ServingRepo,
        journal: OperationLog,
        clock: Clock,
        telemetry: Telemetry = NO_TELEMETRY,
        held: Callable[[str], str | None] = lambda _model: None,
    ) -> None:
        self._deploy = deploy
        self._held = held  # why a model is held out of rotation: no repair loads it
        self._runner = runner
        self._client = client
        self._staging = staging
        self._triton = triton
        self._slots = slots
        self._serving = serving
        self._journal = journal
        self._clock = clock
        self._telemetry = telemetry
        self.last: PassReport | None = None
        # since when a liveness check waits for Triton's answer (None: none waits), so that a
        # start-up that waits for it can say so before the check times out
        self._probing_since: float | None = None
        self._said: str | None = None  # Triton's problem as last logged, and when
        self._said_at = 0.0
        self.wake = Wake(clock)
        self._started = False
        self._retry: RetryBook[str, str] = RetryBook(RETRY, clock)  # model -> its last error
        self._repairs: dict[str, asyncio.Task[None]] = {}  # model -> its repair in flight
        self._ready_seen: set[str] = set()  # managed names Triton had READY at the last look

    def _worth_saying(self, problem: str) -> bool:
        """Whether to log that Triton cannot be reached: when it could be before (or at the
        first look), and when the cause changed, at most once a minute (gRPC words one
        cause in several ways, and the check runs ten times a second)."""
        now = self._clock.monotonic()
        fresh = self.last is None or self.last.triton_live
        if fresh or (problem != self._said and now - self._said_at >= SAY_AGAIN):
            self._said, self._said_at = problem, now
            return True
        return False

    def last_pass(self) -> PassReport | None:
        return self.last

    def drift_of(self, model: str) -> str | None:
        """What the last pass found wrong with ``model``; None when it serves as it should."""
        if self.last is not None and model in self.last.failed:
            return self.last.failed[model]  # it could not look, or must not repair (held)
        found = self.last.assessments.get(model) if self.last is not None else None
        return None if found is None or found.serving else found.why

    def waiting_for_triton(self) -> float | None:
        """How long the liveness check in flight has waited for Triton's answer (None: none
        is in flight)."""
        since = self._probing_since
        return None if since is None else self._clock.monotonic() - since

    # --- start-up ---------------------------------------------------------------------------

    async def startup(self) -> StartupReport:
        """Before any pass: what a daemon that died left behind (:mod:`.restart`)."""
        return await recover(
            journal=self._journal,
            serving=self._serving,
            staging=self._staging,
            clock=self._clock,
            fleet=self._deploy.fleet,
        )

    # --- the loop ---------------------------------------------------------------------------

    async def run(self, interval: float, ready: asyncio.Event) -> None:
        """Start-up (once per process, also when the job is restarted), then a pass every
        ``interval`` s (or when woken) until cancelled. ``ready`` is set after the first pass
        that reached Triton has ended with its repairs: until then, operations would act on a
        state nobody checked, and readiness would be claimed for a repository still being
        put right."""
        if not self._started:
            await self.startup()
            self._started = True
        try:
            while True:
                try:
                    report = await self.run_pass(wait=not ready.is_set())
                except ControlPlaneError as exc:  # Triton or the store failed mid-pass
                    log.warning("reconcile pass failed: %s", exc)
                    report = PassReport(triton_live=False, triton_problem=str(exc), error=str(exc))
                    self.last = report
                if report.triton_live:
                    ready.set()
                pause = interval if report.triton_live else DOWN_POLL
                soonest = self._retry.soonest()
                if soonest is not None:  # a repair failed: its retry may come before the beat
                    pause = max(DOWN_POLL, min(pause, soonest))
                await self._until_next_pass(pause, watch=report.triton_live)
        finally:
            for task in self._repairs.values():
                task.cancel("the reconcile loop stops")

    async def _until_next_pass(self, pause: float, *, watch: bool) -> None:
        """Sleep ``pause`` s, or less: when woken, or (``watch``: Triton answered the last
        pass) as soon as the connection to Triton breaks (a restart, however quick) or a
        model it had READY is no longer (an unload behind the daemon's back), so that drift is
        met at once rather than at the next beat."""
        deadline = self._clock.monotonic() + pause
        lost = asyncio.ensure_future(self._triton.connection_lost()) if watch else None
        try:
            while (left := deadline - self._clock.monotonic()) > 0:
                look = watch and bool(self._ready_seen)
                woke = await self.wake.sleep(
                    min(left, INDEX_LOOK) if look else left,
                    watch=[lost] if lost is not None else [],
                )
                if woke is Woke.WAKE:
                    return
                if woke is Woke.WATCHED and lost is not None:  # the connection broke, or
                    if lost.exception() is None:  # watching it failed
                        return
                    log.warning("cannot watch the connection to Triton: %s", lost.exception())
                    lost = None  # the index looks and the beats carry on
                elif look and await self._lost_a_model():
                    return
        finally:
            if lost is not None:
                lost.cancel()
                await asyncio.gather(lost, return_exceptions=True)

    async def _lost_a_model(self) -> bool:
        try:
            ready = {e.name for e in await self._triton.index() if e.state is TritonState.READY}
        except ControlPlaneError:
            return True  # Triton stopped answering: the pass will say so
        lost = self._ready_seen - ready
        self._ready_seen &= ready
        return bool(lost)

    async def run_pass(self, *, wait: bool = True) -> PassReport:
        """Observe every managed model and start repairs of what drifted, in parallel.

        ``wait``: return once the repairs have ended. The loop does not wait: a slow repair
        (a model that takes a minute to load) must not hold back the next beat, nor the
        repair of another model; a model with a repair in flight is left to it."""
        report = PassReport()
        self._probing_since = self._clock.monotonic()
        try:
            problem = await self._triton.liveness()
        finally:
            self._probing_since = None
        if problem is not None:
            report.triton_live = False
            report.triton_problem = problem
            if self._worth_saying(problem):
                log.error("%s (looking again every %g s)", problem, DOWN_POLL)
            self.last = report
            return report
        if self.last is not None and not self.last.triton_live:
            log.info("Triton at %s is live", _url(self._triton))
        index = index_by_name(await self._triton.index())
        placed = await asyncio.to_thread(self._staging.placed)
        repairs: list[asyncio.Task[None]] = []
        records = await self._serving.all()
        managed = {name for r in records for name in (r.name, *(slot.name for slot in r.slots))}
        ready = {n for n, entry in index.items() if entry.state is TritonState.READY}
        self._ready_seen = ready & managed
        for record in records:
            repair = await self._look_at(record, index, placed, report)
            if repair is not None:
                repairs.append(repair)
        self.last = report
        if wait and repairs:
            await asyncio.gather(*repairs)
        return report

    async def _look_at(
        self,
        record: ModelRecord,
        index: Mapping[str, IndexEntry],
        placed: Mapping[str, ReleaseMarker],
        report: PassReport,
    ) -> asyncio.Task[None] | None:
        """One model: busy, as it should be, deferred, or a repair started (its task)."""
        model = record.name
        repairing = self._repairs.get(model)
        if self._runner.holder(model) is not None or (repairing and not repairing.done()):
            report.busy.append(model)
            if repairing and self.last is not None and model in self.last.assessments:
                # Still what the last look found: a model under repair is not serving
                # until a pass after the repair (woken by its end) says so.
                report.assessments[model] = self.last.assessments[model]
            return None
        if (held := self._held(model)) is not None:
            report.failed[model] = f"{NOT_REPAIRED}{held}"
            return None
        strategy = self._deploy.strategy(model)
        snapshot = self._slots.snapshot_of(model, record, strategy.slot_names(model))
        try:
            seen = await strategy.observe(snapshot, index, placed)
        except ControlPlaneError as exc:
            report.failed[model] = str(exc)
            return None
        assessment = assess(seen)
        report.assessments[model] = assessment
        if assessment.action in (Action.NONE, Action.WAIT) and not assessment.retire:
            if assessment.unrecorded and assessment.slot is not None:
                await record_serving(self._slots, model, assessment.slot, seen.desired)
            self._retry.succeeded(model)
            return None
        if (left := self._retry.left(model)) > 0:  # it failed lately: do not hammer it
            report.deferred[model] = left
            return None
        task = asyncio.create_task(self._repair(seen, assessment, report), name=f"repair-{model}")
        self._repairs[model] = task
        task.add_done_callback(partial(self._forget_repair, model))
        return task

    def _forget_repair(self, model: str, done: asyncio.Task[None]) -> None:
        if self._repairs.get(model) is done:
            del self._repairs[model]
        self.wake.set()  # look again now: what the repair did is what readiness reports

    async def not_serving(self) -> dict[str, str]:
        """Managed models whose desired release Triton does not serve now, and why: a quick
        look at Triton's index (for readiness), plus what the last pass found."""
        index = index_by_name(await self._triton.index())
        found: dict[str, str] = {}
        for record in await self._serving.all():
            if record.active_release is None:
                continue
            strategy = self._deploy.strategy(record.name)
            names = strategy.slot_names(record.name)
            snapshot = self._slots.snapshot_of(record.name, record, names)
            why = strategy.not_serving(snapshot, index)
            if why is not None:
                found[record.name] = why
        if self.last is not None:
            for model, why in self.last.not_serving.items():
                found.setdefault(model, why)
        return found

    # --- repairs ----------------------------------------------------------------------------

    async def _repair(self, seen: Observed, assessment: Assessment, report: PassReport) -> None:
        model = seen.model
        action = assessment.action
        cause = Cause(reason=assessment.why)
        if action is Action.REDEPLOY:
            assert seen.desired is not None
            log.warning("repairing %s: %s; deploying it again", model, assessment.why)
            self._telemetry.repair_started(action.value)
            strategy = self._deploy.strategy(model)
            try:  # records as Triton and the disk show them, so every transition is valid
                async with self._runner.claimed(model, REFUSE):
                    await strategy.settle(seen)
            except OperationInProgress:
                report.busy.append(model)  # someone started an operation meanwhile: theirs
                return
            outcome = await self._client.run(
                partial(
                    self._deploy.deploy,
                    model,
                    seen.desired,
                    trigger=Trigger.RECONCILE,
                    kind=OperationKind.REPAIR,
                    cause=cause,
                ),
                patience=self._deploy.behind_housekeeping(model),
            )
        elif action in (Action.LOAD, Action.REPOINT, Action.REMOVE) or assessment.retire:
            if action is not Action.NONE and action is not Action.WAIT:
                log.warning("repairing %s: %s (%s)", model, assessment.why, action.value)
                self._telemetry.repair_started(action.value)
            strategy = self._deploy.strategy(model)
            outcome = await self._client.housekeeping(
                OperationKind.REPAIR,
                model,
                lambda run: strategy.repair(run, seen, assessment),
                cause=cause,
                release=seen.desired,
            )
        else:
            return
        done = outcome.operation
        if done is not None:
            report.repairs[model] = done.id
        if outcome.ended is Ended.UNCHANGED:
            return
        if outcome.ended is Ended.BUSY:
            report.busy.append(model)  # someone started an operation meanwhile: theirs
            return
        if outcome.ended is Ended.REFUSED:
            self._failed(model, report, f"refused: {outcome.error}", None)
            return
        if not outcome.succeeded or done is None:
            self._failed(model, report, outcome.message or outcome.ended.value, outcome_id(done))
            return
        self._retry.succeeded(model)
        if action is not Action.NONE:
            log.info("repaired %s (%s, operation %s)", model, action.value, done.id)
        report.assessments[model] = dataclasses.replace(
            assessment,
            action=Action.NONE,
            serving=assessment.serving or action is not Action.WAIT,
            why=f"repaired ({action.value})",
        )

    def _failed(self, model: str, report: PassReport, error: str, operation: str | None) -> None:
        """A repair failed: say so, and try again later, waiting longer each time."""
        delay = self._retry.failed(model, error).delay
        report.failed[model] = error
        log.error(
            "repair of %s failed%s: %s; trying again in %.0f s",
            model,
            f" ({operation})" if operation else "",
            error,
            delay,
        )


def outcome_id(operation: Operation | None) -> str | None:
    return operation.id if operation is not None else None


def _url(triton: Triton) -> str:
    return str(getattr(triton, "url", "the configured address"))
