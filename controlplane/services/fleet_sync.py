"""The fleet sync: make what this member serves match the fleet's desired state, on a beat.

Every ``store.poll_interval_seconds`` (sooner when woken: after this member's own writes, or
when one of its operations ends) it reads the desired state from the store and, per model,
compares this member's target (:meth:`~controlplane.domain.fleet.DesiredModel.target_for`) with
what serves here, then runs whatever operation brings it there through the usual pipeline
(trigger ``fleet``): a re-point when the target's slot is still warm, else a deploy, or an
unload. Level-triggered: a member that missed a change, crashed, or joined late converges the
same way. The reconcile loop below it keeps Triton true to what this member serves.

Invariants:

* Nothing is ever unloaded because the store cannot be read, or because a model has no record:
  only a record that says an unload left it unloaded unloads
  (:meth:`~controlplane.domain.fleet.DesiredModel.unloads`; a null release written by hand is
  refused where it is read, and this member keeps serving what it has). When the store cannot
  be read the member keeps serving what it has and reports itself stale (status,
  ``/metrics``, its heartbeat).
* A target this member cannot serve is retried with backoff (2 s, doubling to 5 min) and
  reported in its heartbeat; the release that serves keeps serving meanwhile. A target the
  store does not hold, or that is not signed where a signature is required, refuses the
  record (:mod:`controlplane.domain.refusals`): tried once per generation of the record, not
  again until it changes.
* A record that cannot be read, or whose generation went back, is refused for its model only;
  every refusal is logged once a minute (:mod:`.fleet_refusals`), counted and shown. No record
  can make a pass raise: the job is never restarted for one.
* A target latched degraded here after it was set (``rollback.scope: member``) is held: this
  member does not go back to a release it rolled back from, until someone sets it again.
* A model with an operation of this member's own running is left to it.

It also writes this member's heartbeat every ``fleet.keepalive_seconds`` and when what it says
changes (:mod:`.heartbeat`), and does the fleet's upkeep (:mod:`.fleet_upkeep`): it advances
canary rollouts and, on its first pass, records what serves here that the fleet has no record of.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import TypeVar

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.fleet import (
    DesiredModel,
    MemberBeat,
    MemberModel,
    MemberState,
)
from controlplane.domain.operations import Cause, Trigger
from controlplane.domain.refusals import RELEASE_REFUSALS, RecordKind, Refusal
from controlplane.domain.rollback import DegradedRelease
from controlplane.domain.turns import rolling_progress
from controlplane.ports import Clock, DesiredStateEvents, ModelRecord, RollbackBook, ServingRepo
from controlplane.services.deploy import DeployService
from controlplane.services.fleet_ledger import FleetLedger
from controlplane.services.fleet_refusals import SyncRefusals, refusal_json
from controlplane.services.fleet_upkeep import advance_rollouts, forget_departed, seed
from controlplane.services.heartbeat import HeartbeatWriter
from controlplane.services.operations import Begin, Ended, OperationClient
from controlplane.services.rotation import Rotation
from controlplane.timing import Backoff, PokeGap, RetryBook, Wake, Woke, first_of

log = logging.getLogger(__name__)
T = TypeVar("T")
RETRY = Backoff(first=2.0, limit=300.0)
TRANSIENT_RETRY_MOST = 10.0  # s: an outage of the store or Triton is retried this often at least
POKE_GAP = 1.0  # seconds: passes started by other members' wakes are at least this apart
FORGET_EVERY = 900.0  # s between looks for departed members (forgotten after an hour)
CHECK_EVERY = 300.0  # s: the desired state is read at least this often (store.full_scan_seconds)


@dataclass(frozen=True)
class _Failure:
    """A target this member could not serve: retried on :data:`RETRY`, from its first delay
    again when the target changes. A ``transient`` one (the store or Triton away, not the
    release at fault) is no failure of the member's: it is still converging, and tries again
    within :data:`TRANSIENT_RETRY_MOST`."""

    target: str | None
    generation: int
    error: str
    transient: bool = False


@dataclass
class SyncReport:
    """What one pass read and did."""

    at: datetime
    error: str | None = None  # the desired state could not be read: nothing was done
    desired: dict[str, DesiredModel] = field(default_factory=dict)
    states: dict[str, MemberModel] = field(default_factory=dict)
    started: dict[str, str] = field(default_factory=dict)  # model -> what it went for


class FleetSync:
    def __init__(
        self,
        *,
        ledger: FleetLedger,
        deploy: DeployService,
        client: OperationClient,
        serving: ServingRepo,
        rollbacks: RollbackBook,
        clock: Clock,
        poll_interval: float,
        beat_interval: float,
        overload: Callable[[], str] | None = None,
        wake: Wake | None = None,
        rotation: Rotation | None = None,
        check_every: float = CHECK_EVERY,
    ) -> None:
        self._ledger = ledger
        self._records = ledger.records
        self.member = ledger.member
        self._deploy = deploy
        self._client = client
        self._serving = serving
        self._rollbacks = rollbacks
        self._clock = clock
        self._poll = poll_interval
        self._beat_interval = beat_interval
        self._overload = overload
        self._rotation = rotation or Rotation()
        self.wake = wake or Wake(clock)
        self.last: SyncReport | None = None
        self.last_read: datetime | None = None  # when the desired state was last read
        self.stale_since: datetime | None = None  # reads fail since then
        self._heart = HeartbeatWriter(records=self._records, interval=beat_interval, clock=clock)
        self._failures: RetryBook[str, _Failure] = RetryBook(
            RETRY,
            clock,
            same=lambda last, new: (last.target, last.transient) == (new.target, new.transient),
        )
        self._follows: dict[str, asyncio.Task[None]] = {}
        self._seeded = False
        # what it refuses of the records it reads (and the newest generation read of each)
        self.refusals = SyncRefusals(clock, where=self._records.where)
        self._pokes = PokeGap(POKE_GAP, clock)
        # Reading the desired state only when something may have changed (module docstring):
        self._events: DesiredStateEvents | None = None
        self._check_every = check_every
        self._vouched: int | None = None  # the events' token at the last read
        self._next_check = -math.inf  # monotonic time of the next read events cannot spare
        self._named: set[str] = set()  # models events said changed since the last read
        self._woken = False  # the wait before this pass was cut short by a wake
        self._desired_read: dict[str, DesiredModel] = {}  # what the last read returned

    @property
    def name_conflict(self) -> str | None:
        """Why this member's name seems taken by another daemon; None when it does not."""
        return self._heart.name_conflict

    @property
    def store_gap(self) -> tuple[datetime, datetime] | None:
        """The last stretch in which this member's heartbeats did not land (the store was
        away for it): (the last landed before, the first after). A pass that could not read
        the store lies inside one: the beats between passes failed too."""
        return self._heart.gap

    @property
    def stale(self) -> bool:
        return self.stale_since is not None

    # --- the loop ---------------------------------------------------------------------------

    async def run(self, reconciled: asyncio.Event, ready: asyncio.Event) -> None:
        """Once start-up reconcile has run: a pass, a heartbeat, and again every poll interval
        or when woken. Until ``ready`` is set each pass waits for what it starts, and ``ready``
        is set by the first that starts nothing: a new member takes traffic once it serves what
        the fleet wants now, not a release the fleet left during its first load. It beats all
        along, so the fleet sees it starting and converging, and waits for it."""
        await self._beating(reconciled.wait())
        next_forget = self._clock.monotonic()
        try:
            while True:
                if ready.is_set():
                    await self.sync_pass()
                elif not (await self._beating(self.sync_pass(wait=True))).started:
                    ready.set()
                await self._heart.write_if_due(self.heartbeat())
                if self._clock.monotonic() >= next_forget and self.stale_since is None:
                    await forget_departed(self._records, self.member.name, self._clock.now())
                    next_forget = self._clock.monotonic() + FORGET_EVERY
                await self._until_next_pass()
        finally:
            for task in self._follows.values():
                task.cancel("the fleet sync stops")

    async def _beating(self, work: Awaitable[T]) -> T:
        """``work``, with this member's heartbeat written whenever it is due meanwhile (start-up
        reconcile, or a first pass that waits for a load of minutes)."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                await self._heart.write_if_due(self.heartbeat())
                due_in = max(0.0, self._heart.wake_at - self._clock.monotonic())
                await first_of(self._clock, due_in, [task])
        finally:
            task.cancel()  # a no-op once it is done; else this loop was cancelled: so is it
        return task.result()

    def poke(self, models: Collection[str] = ()) -> None:
        """Another member changed the desired state (``POST /v1/fleet/wake``, or the bucket's
        event of ``models``' records): read it now, or a second after the last pass that a
        poke started, whichever is later (a wake needs no token, so a flood of them must not
        become a flood of store reads)."""
        self._named.update(models)
        self._pokes.poked = True
        self.wake.set()

    def hear_from(self, events: DesiredStateEvents) -> None:
        """The bucket's events of changes of the desired state (this member's own queue):
        while they vouch that nothing changed, a pass reuses what it read last."""
        self._events = events

    def _must_read(self) -> bool:
        """Whether this pass reads the desired state from the store: always, unless events
        vouch that it did not change since the last read, nothing woke this pass, and the
        last read is less than ``check_every`` s old."""
        if self.last is None or self.last.error is not None or self._woken or self._named:
            return True
        if self._events is None or self._clock.monotonic() >= self._next_check:
            return True
        token = self._events.vouch()
        return token is None or token != self._vouched

    async def _read_desired(self) -> dict[str, DesiredModel]:
        """The desired state: read from the store when it may have changed, else as last
        read (events vouch for it)."""
        self._woken = False
        if not self._must_read():
            return dict(self._desired_read)
        token = self._events.vouch() if self._events is not None else None  # before the read
        named, self._named = frozenset(self._named), set()
        try:
            desired = await asyncio.to_thread(self._records.read_all, named)
        except BaseException:
            self._named.update(named)  # read at the next pass
            raise
        self._vouched = token
        self._next_check = self._clock.monotonic() + self._check_every
        self._desired_read = dict(desired)
        return desired

    async def _until_next_pass(self) -> None:
        """Sleep a poll interval (less when a retry is due, or when woken), beating on the way."""
        pause = self._poll
        soonest = self._failures.soonest()
        if soonest is not None:
            pause = max(0.1, min(pause, soonest))
        deadline = self._clock.monotonic() + pause
        while (left := deadline - self._clock.monotonic()) > 0:
            beat_in = max(0.0, self._heart.wake_at - self._clock.monotonic())
            if await self.wake.sleep(min(left, beat_in)) is Woke.WAKE:
                self._woken = True
                break
            await self._heart.write_if_due(self.heartbeat())
        await self._pokes.spaced()
        if self.wake.is_set():  # a wake during the last beat's write or the pokes' gap
            self._woken = True
        self.wake.clear()

    async def sync_pass(self, *, wait: bool = False) -> SyncReport:
        """Read the desired state and start what brings this member to it. ``wait``: return
        once what it started has ended (the first pass, so readiness means converged)."""
        report = SyncReport(at=self._clock.now())
        try:
            desired = await self._read_desired()
        except ControlPlaneError as exc:
            report.error = str(exc)
            if self.stale_since is None:
                self.stale_since = report.at
                log.error(
                    "cannot read the fleet's desired state at %s (%s); serving what this member "
                    "has until it can",
                    self._records.where,
                    exc,
                )
            report.states = await self._states_when_stale()
            report.desired = dict(self.last.desired) if self.last is not None else {}
            self.last = report
            return report
        if self.stale_since is not None:
            log.info("the fleet's desired state can be read again; following it")
        self.stale_since = None
        self.last_read = report.at
        unreadable = await self._unreadable()
        desired = self.refusals.screen(desired, unreadable)
        records = {record.name: record for record in await self._serving.all()}
        if not self._seeded:
            if await seed(self._records, self.member.name, self._clock, records, desired):
                self._ledger.tell_peers()  # the others follow the records it wrote now
            self._seeded = True
        report.desired = desired
        self._ledger.remember(desired)
        for model, wanted in sorted(desired.items()):
            await self._share_latches(model, wanted)
            report.states[model] = await self._converge(model, wanted, records.get(model), report)
        for model, record in records.items():  # served here, not the fleet's: reported as is
            if model not in desired and record.active_release is not None:
                report.states[model] = MemberModel(
                    record.active_release, MemberState.SERVING, target=record.active_release
                )
        self.last = report
        self.refusals.say(unreadable)
        if await advance_rollouts(
            self._records, self.member.name, desired, report.at, own=self.heartbeat()
        ):
            self.wake.set()
            self._ledger.tell_peers()
        if wait and self._follows:
            await asyncio.gather(*self._follows.values(), return_exceptions=True)
            report.states.update(
                {
                    model: await self._converge(model, wanted, await self._serving.get(model), None)
                    for model, wanted in desired.items()
                }
            )
        return report

    async def _unreadable(self) -> dict[str, Refusal]:
        """The records the store's last reads refused. Heartbeats are read by the views, the
        rollouts and the upkeep, not at every pass; while one is refused they are read again
        here, so that a record fixed (or deleted) is seen fixed at this pass, not at the next
        read by someone else."""
        unreadable = self._records.unreadable()
        if any(r.kind is RecordKind.MEMBER for r in unreadable.values()):
            try:
                await asyncio.to_thread(self._records.beats)
            except ControlPlaneError as exc:
                log.debug("cannot read the members' heartbeats again: %s", exc)
                return unreadable
            unreadable = self._records.unreadable()
        return unreadable

    async def _converge(
        self,
        model: str,
        wanted: DesiredModel,
        record: ModelRecord | None,
        report: SyncReport | None,
    ) -> MemberModel:
        target = wanted.target_for(self.member.name)
        serving = record.active_release if record is not None else None
        state = partial(MemberModel, serving, target=target, generation=wanted.generation)
        if target == serving:
            self._failures.succeeded(model)
            self.refusals.served(model)
            return state(MemberState.UNLOADED if target is None else MemberState.SERVING)
        if target is None and not wanted.unloads(self.member.name):
            # No release for this member, and no unload either (a claim on a new model, a
            # canary rollout's others when nothing was stable): kept as it is.
            self._failures.succeeded(model)
            return state(MemberState.SERVING, target=serving)
        if model in self._follows or self._client.holder(model) is not None:
            return state(MemberState.CONVERGING)
        refused = self.refusals.of_release(wanted, target)
        if refused is not None:  # not again until the record changes
            return state(MemberState.FAILED, error=refused.message)
        if await self._held(model, target, wanted):
            return state(MemberState.HELD, error=f"{target} was rolled back on this member")
        retry = self._failures.get(model)
        failure = retry.note if retry is not None else None
        out = self._rotation.held(model)
        tried = failure is not None and failure.target == target
        if out is not None and (failure is None or (tried and not _set_again(wanted, failure))):
            # Held out of rotation: trying again would drain and wait for the same memory,
            # in and out of "draining"; it waits for a person (a deploy, a restart of Triton),
            # or for the fleet to want something else.
            return state(MemberState.HELD, error=out)
        if failure is not None and failure.target == target:
            if _set_again(wanted, failure):
                self._failures.succeeded(model)  # set again since: try again now
            elif self._failures.left(model) > 0 or report is None:
                ended = MemberState.CONVERGING if failure.transient else MemberState.FAILED
                return state(ended, error=failure.error)
        if report is None:
            return state(MemberState.CONVERGING)
        log.info(
            "%s: the fleet wants %s here (generation %d, set by %s); serving %s",
            model,
            target or "it unloaded",
            wanted.generation,
            wanted.set_by,
            serving or "nothing",
            extra={"model": model},
        )
        task = asyncio.create_task(self._follow(model, wanted, target), name=f"follow-{model}")
        self._follows[model] = task
        task.add_done_callback(partial(self._followed, model))
        report.started[model] = target or "unload"
        failed = self._failures.get(model)
        return state(MemberState.CONVERGING, error=failed.note.error if failed else None)

    def _followed(self, model: str, task: asyncio.Task[None]) -> None:
        if self._follows.get(model) is task:
            del self._follows[model]
        self.wake.set()  # beat and look again now

    async def _follow(self, model: str, wanted: DesiredModel, target: str | None) -> None:
        """One operation towards ``target``; a failure is remembered, with its backoff."""
        cause = Cause(
            reason=f"the fleet's desired state, generation {wanted.generation}: {wanted.reason}",
            set_by=wanted.set_by,
        )
        begin: Begin
        if target is None:
            begin = partial(self._deploy.unload, model, trigger=Trigger.FLEET, cause=cause)
        elif await self._deploy.is_warm(model, target):
            begin = partial(
                self._deploy.rollback, model, to=target, trigger=Trigger.FLEET, cause=cause
            )
        else:
            begin = partial(self._deploy.deploy, model, target, trigger=Trigger.FLEET, cause=cause)
        outcome = await self._client.run(begin, patience=self._deploy.behind_housekeeping(model))
        if outcome.ended is Ended.BUSY:
            return  # an operation of ours started meanwhile: the next pass looks again
        done = outcome.operation
        if outcome.ended is Ended.SUCCEEDED and done is not None:
            self._failures.succeeded(model)
            log.info("%s: serves %s, as the fleet wants (operation %s)", model, target, done.id)
        elif not outcome.succeeded:
            where = f" (operation {done.id})" if done is not None else ""
            error = f"{outcome.error}{where}"
            refusal = RELEASE_REFUSALS.get(outcome.code or "")
            if refusal is not None and target is not None:
                # The store does not hold it, or it is not signed as required: refused until
                # the record changes, not retried with backoff (each try reads the store to
                # the same answer).
                self._failures.succeeded(model)
                self.refusals.refuse_release(wanted, target, refusal, error)
                return
            self._failed(model, _Failure(target, wanted.generation, error, outcome.retryable))

    def _failed(self, model: str, failure: _Failure) -> None:
        most = TRANSIENT_RETRY_MOST if failure.transient else None
        delay = self._failures.failed(model, failure, most=most).delay
        log.log(
            logging.WARNING if failure.transient else logging.ERROR,
            "%s: cannot serve %s as the fleet wants%s: %s; serving what it had, trying again "
            "in %.0f s",
            model,
            failure.target or "it unloaded",
            " yet" if failure.transient else "",
            failure.error,
            delay,
            extra={"model": model},
        )

    async def _share_latches(self, model: str, wanted: DesiredModel) -> None:
        """This member's degraded latches follow the fleet's: a release the fleet latched is
        latched here (so it is never this member's fallback), and one latched here before the
        fleet's last decision that the fleet does not list is let go (a person deployed it
        again through another member). A latch newer than that decision is this member's own
        (``rollback.scope: member``) and stays."""
        here = {latch.release: latch for latch in await self._rollbacks.latched(model)}
        for degraded in wanted.degraded:
            if degraded.release not in here:
                await self._rollbacks.latch(
                    DegradedRelease(model, degraded.release, degraded.at, degraded.reason)
                )
        for release, latch in here.items():
            if not wanted.is_degraded(release) and latch.at <= wanted.set_at:
                await self._rollbacks.unlatch(model, release)
                log.info("%s %s is no longer degraded: the fleet let it go", model, release)

    async def _held(self, model: str, target: str | None, wanted: DesiredModel) -> bool:
        """``target`` was latched degraded here after the fleet set it (a member-scope
        rollback): this member does not go back to it until it is set again."""
        if target is None:
            return False
        return any(
            latch.release == target and latch.at > wanted.set_at
            for latch in await self._rollbacks.latched(model)
        )

    # --- heartbeats -------------------------------------------------------------------------

    def heartbeat(self) -> MemberBeat:
        states = {
            model: replace(state, progress=rolling_progress(self._client.latest(model)))
            for model, state in (self.last.states if self.last is not None else {}).items()
        }
        return MemberBeat(
            member=self.member.name,
            incarnation=self.member.incarnation,
            at=self._clock.now(),
            interval=self._beat_interval,
            version=self.member.version,
            models=dict(states),
            overload=self._overload() if self._overload is not None else None,
            stale=self.stale,
            url=self.member.url,
            name_conflict=self.name_conflict,
            out_of_rotation=self._rotation.why_out(),
        )

    async def _states_when_stale(self) -> dict[str, MemberModel]:
        """The last known states, kept while the store cannot be read (at start-up: what
        serves here, as recorded)."""
        if self.last is not None:
            return dict(self.last.states)
        return {
            record.name: MemberModel(
                record.active_release, MemberState.SERVING, target=record.active_release
            )
            for record in await self._serving.all()
            if record.active_release is not None
        }

    # --- status -----------------------------------------------------------------------------

    def model_status(self, model: str) -> dict[str, object]:
        """What the fleet wants of this member for ``model``, as of the last pass."""
        last = self.last
        wanted = last.desired.get(model) if last is not None else None
        state = last.states.get(model) if last is not None else None
        return {
            "member": self.member.name,
            "stale": self.stale,
            "stale_since": self.stale_since.isoformat() if self.stale_since else None,
            "name_conflict": self.name_conflict,
            "last_read": self.last_read.isoformat() if self.last_read else None,
            "desired": wanted.release if wanted is not None else None,
            "generation": wanted.generation if wanted is not None else None,
            "target": state.target if state is not None else None,
            "state": state.state.value if state is not None else None,
            "error": state.error if state is not None else None,
            # its desired state's record as refused here (no member acts on a record refused)
            "refused": [
                refusal_json(where, refusal)
                for where, refusal in sorted(self.refusals.book.now.items())
                if refusal.kind is RecordKind.DESIRED and refusal.name == model
            ],
        }

    # --- readiness --------------------------------------------------------------------------

    def not_serving(self) -> dict[str, str]:
        """Models the fleet wants here that serve nothing here yet: a new member gets traffic
        only once it serves what the fleet does. (A member that serves an older release while
        it converges stays ready: taking every member out of the Service during a rollout
        would turn a slow load into an outage.)"""
        if self.last is None:
            return {}
        if self.last_read is None and self.last.error is not None:
            # It never read the desired state: it cannot know what to serve. A member that
            # serves models already (its daemon restarted) stays ready on what it has.
            serving = any(s.release is not None for s in self.last.states.values())
            if not serving:
                return {
                    "(fleet)": "cannot read the fleet's desired state from the store, so this "
                    f"member does not know what to serve: {self.last.error}"
                }
        return {
            model: f"the fleet wants {state.target} here; it serves nothing yet"
            + (f" ({state.error})" if state.error else "")
            for model, state in self.last.states.items()
            if state.target is not None and state.release is None
        }


def _set_again(wanted: DesiredModel, failure: _Failure) -> bool:
    """The desired state was set again since ``failure`` (a person or CI deployed it anew), not
    only its rollout or its turns moved: worth a new attempt at once."""
    return wanted.generation > failure.generation and wanted.trigger not in ("rollout", "turn")
