"""This member's writes to the fleet's desired state.

An operation that a person, CI, the release watcher or a fleet-scope automatic rollback asked
of this member *publishes* its result as its last step (``publish``), still holding the model:
only once this member serves the release does the desired state move, so a release that fails
to load or preflight here never reaches the others, and this member's own sync loop can never
see the new local state before the fleet's (it would otherwise "repair" it back).

The write is a compare-and-swap on the record read when the request arrived: if another member
changed it meanwhile, the request gets ``desired_state_conflict`` naming the winner, unless the
winner wants the same release (two members that roll back the same overload both succeed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from controlplane.domain.errors import DesiredStateConflict
from controlplane.domain.fleet import (
    Claim,
    Degraded,
    DesiredModel,
    MemberState,
    Rollout,
    RolloutPhase,
    first_generation,
)
from controlplane.domain.operations import OperationKind
from controlplane.domain.publish import FleetBase
from controlplane.domain.rollout import RolloutPolicy, rollback_aim, stable_release, start
from controlplane.ports import Clock, DesiredStates, FleetPeers, ModelRecord
from controlplane.services.runner import Run

log = logging.getLogger(__name__)
ROLL_BACK_ATTEMPTS = 5


@dataclass(frozen=True)
class Member:
    """Who this daemon is in the fleet."""

    name: str
    incarnation: str  # this process: a restarted member is another incarnation
    version: str
    url: str | None = None  # where the other members wake it (None: they cannot)


@dataclass(frozen=True)
class ClaimAnswer:
    won: bool
    why: str
    look_again: bool = False  # another member holds it now; it may give up or die


@dataclass(frozen=True)
class Publication:
    """What an operation writes to the desired state once it serves here."""

    base: DesiredModel | None  # the record read when the request arrived
    release: str | None  # None: unloaded
    latch: str | None = None  # a release rolled back from: latched degraded for the fleet
    said: str = ""  # a rollback that stops a canary rollout: what it did, in words


class FleetLedger:
    def __init__(
        self,
        *,
        records: DesiredStates,
        member: Member,
        clock: Clock,
        rollout_for: Callable[[str], RolloutPolicy],
        wake: Callable[[], None] = lambda: None,
        peers: FleetPeers | None = None,
    ) -> None:
        self.records = records
        self.member = member
        self._clock = clock
        self._rollout_for = rollout_for
        self._own_wake = wake
        self._peers = peers
        self._telling: set[asyncio.Task[None]] = set()
        self._known: Mapping[str, DesiredModel] = {}  # the desired state as the sync last read it

    def remember(self, desired: Mapping[str, DesiredModel]) -> None:
        """The desired state as just read by the fleet sync: what "previous" means here."""
        self._known = dict(desired)

    def known(self, model: str) -> DesiredModel | None:
        """The desired state of ``model`` as the fleet sync last read it (None: no record)."""
        return self._known.get(model)

    def previous_of(self, record: ModelRecord) -> str | None:
        """What "previous" means for ``record`` here, from the desired state as last read
        (:meth:`DesiredModel.previous_for`)."""
        wanted = self._known.get(record.name)
        if wanted is None:
            return record.previous_release
        return wanted.previous_for(record.active_release, record.previous_release)

    async def read(self, model: str, *, patient: bool = False) -> DesiredModel | None:
        return await asyncio.to_thread(self.records.read, model, patient=patient)

    async def held_by_a_member(self, model: str, release: str) -> bool:
        """Whether a live member holds back from ``release`` (it rolled it back itself, with
        ``rollback.scope: member``): deploying it again must then make a new decision."""
        now = self._clock.now()
        beats = await asyncio.to_thread(self.records.beats)
        return any(
            beat.alive(now)
            and (state := beat.models.get(model)) is not None
            and state.state is MemberState.HELD
            and state.target == release
            for beat in beats.values()
        )

    async def publish_result(self, run: Run, base: FleetBase, release: str | None) -> None:
        """Publish what ``run`` made serve here; a rollback latches what it left: during a
        canary rollout the canary's release, whichever member ran it (:func:`rollback_aim`)."""
        operation = run.operation
        if operation.kind is not OperationKind.ROLLBACK or release is None:
            await self.publish(run, Publication(base.record, release))
            return
        aim = rollback_aim(base.record, active=operation.from_release, previous=None, to=release)
        publication = Publication(base.record, release, latch=aim.away_from, said=aim.said)
        await self.publish(run, publication)

    async def publish(self, run: Run, publication: Publication) -> DesiredModel:
        """The ``publish`` step: write the desired state this operation has made true here."""
        async with run.tracker.step("publish"):
            for _attempt in range(ROLL_BACK_ATTEMPTS):
                new = await self._next(run, publication)
                try:
                    await asyncio.to_thread(self.records.swap, new)
                    break
                except DesiredStateConflict as lost:
                    current = await self.read(run.model)
                    if _only_turns_moved(publication.base, current):
                        # Members took or gave back turns out of rotation meanwhile (this one,
                        # for its own rolling update): the state it was asked to move is the same.
                        publication = replace(publication, base=current)
                        continue
                    if current is None or current.release != publication.release:
                        raise _lost_here(
                            lost, self.member.name, publication.release, current
                        ) from lost
                    self._say(run, publication)
                    run.tracker.detail(generation=current.generation, already=current.set_by)
                    log.info(
                        "%s: the fleet's desired state already says %s (generation %d, set by %s)",
                        run.model,
                        publication.release,
                        current.generation,
                        current.set_by,
                    )
                    return current
            else:
                raise DesiredStateConflict(
                    f"the desired state of {run.model} kept changing while this member published "
                    f"{publication.release or 'unloaded'} (members taking turns out of rotation); "
                    "try again"
                )
            self._say(run, publication)
            run.tracker.detail(
                generation=new.generation,
                phase=new.rollout.phase.value,
                **({"canaries": list(new.rollout.canaries)} if new.rollout.canaries else {}),
            )
            log.info(
                "%s: the fleet's desired state is now %s (generation %d, %s)",
                run.model,
                new.release or "unloaded",
                new.generation,
                new.rollout.phase.value,
            )
        self._wake()
        return new

    async def claim(self, model: str, release: str, revision: str | None) -> ClaimAnswer:
        """Take on a new release for the fleet (the release watcher's ``auto_deploy``): one
        member deploys it first and, once it serves there, publishes it; the others follow.
        Refused when another member holds a live claim on it (look again later: it may die),
        it failed on its claimer, or the fleet has it already or latched it degraded."""
        now = self._clock.now()
        current = await self.read(model) or first_generation(
            model, by=self.member.name, at=now, trigger="watcher", reason=""
        )
        if current.release == release:
            return ClaimAnswer(False, f"the fleet's desired state is {release} already")
        if current.is_degraded(release):
            return ClaimAnswer(False, f"{release} is latched degraded for the fleet")
        held = current.claim
        if held is not None and (held.release, held.revision) == (release, revision):
            if held.failed is not None:
                why = f"it failed on {held.member}, which claimed it: {held.failed}"
                return ClaimAnswer(False, why)
            if held.member != self.member.name or held.incarnation != self.member.incarnation:
                beats = await asyncio.to_thread(self.records.beats)
                beat = beats.get(held.member)
                if beat is not None and beat.alive(now) and beat.incarnation == held.incarnation:
                    why = f"{held.member} claimed it and deploys it first"
                    return ClaimAnswer(False, why, look_again=True)
        new = current.changed(
            by=self.member.name,
            at=now,
            trigger="watcher",
            reason=f"{self.member.name} claimed {release} to deploy it first",
            claim=Claim(release, revision, self.member.name, self.member.incarnation, now),
        )
        try:
            await asyncio.to_thread(self.records.swap, new)
        except DesiredStateConflict:
            return ClaimAnswer(False, "another member changed the desired state first", True)
        return ClaimAnswer(True, f"claimed (generation {new.generation})")

    async def claim_failed(self, model: str, release: str, error: str) -> None:
        """This member's claimed deploy failed: say so in the record, so that no other member
        tries the release (it stops at one member) until it is published again."""
        for _attempt in range(ROLL_BACK_ATTEMPTS):
            current = await self.read(model)
            held = current.claim if current is not None else None
            if current is None or held is None or held.release != release:
                return
            if held.member != self.member.name:
                return
            failed = current.changed(
                by=self.member.name,
                at=self._clock.now(),
                trigger="watcher",
                reason=f"{release} failed on {self.member.name}, which claimed it",
                claim=replace(held, failed=error[:500]),
            )
            try:
                await asyncio.to_thread(self.records.swap, failed)
                return
            except DesiredStateConflict:
                continue

    async def roll_back(
        self, model: str, *, away_from: str, to: str, trigger: str, reason: str
    ) -> DesiredModel | None:
        """After an automatic rollback served ``to`` here (``rollback.scope: fleet``): latch
        ``away_from`` degraded for the fleet and move the desired state to ``to``, so that every
        member follows. Left alone when the desired state moved elsewhere meanwhile (a person
        deployed another release); the record written, or None when nothing was written.
        A canary rollout in progress is stopped, and says how (:func:`rollback_aim`)."""
        for _attempt in range(ROLL_BACK_ATTEMPTS):
            now = self._clock.now()
            current = await self.read(model) or first_generation(
                model, by=self.member.name, at=now, trigger=trigger, reason=""
            )
            if current.release == to and current.is_degraded(away_from):
                return None  # another member got there first
            if current.release not in (away_from, to, None) or (
                current.release is None and current.generation > 0
            ):
                log.warning(
                    "%s: not moving the fleet to %s: its desired state is %s now (set by %s)",
                    model,
                    to,
                    current.release or "unloaded",
                    current.set_by,
                )
                return None
            rollout = current.rollout
            said = rollback_aim(current, active=away_from, previous=None, to=to).said
            why = f"{reason}; {said}" if said else reason
            if rollout.in_progress:
                rollout = replace(
                    rollout,
                    phase=RolloutPhase.ROLLED_BACK,
                    note=f"{self.member.name}: {why}",
                    paused=None,
                )
            new = current.changed(
                by=self.member.name,
                at=now,
                trigger=trigger,
                reason=f"automatic rollback on {self.member.name}: {why}",
                release=to,
                previous=away_from,
                degraded=current.latched(away_from, now, f"{self.member.name}: {reason}"),
                rollout=rollout,
            )
            try:
                await asyncio.to_thread(self.records.swap, new)
            except DesiredStateConflict:
                continue  # read it again: another member may have done it, or moved it
            log.warning(
                "%s: the fleet's desired state is now %s (generation %d); %s is latched "
                "degraded for every member",
                model,
                to,
                new.generation,
                away_from,
            )
            self._wake()
            return new
        raise DesiredStateConflict(
            f"the desired state of {model} kept changing under {ROLL_BACK_ATTEMPTS} attempts "
            f"to move it to {to}"
        )

    @staticmethod
    def _say(run: Run, publication: Publication) -> None:
        """A rollback that stopped a canary rollout says so on its operation."""
        if publication.said:
            run.tracker.operation_detail({"rollout": publication.said})

    def _wake(self) -> None:
        """After this member changed what a member should serve: look again here, and wake
        the other live members so they follow now rather than at their next poll."""
        self._own_wake()
        self.tell_peers()

    def wake_fleet(self) -> None:
        """This member changed the desired state outside an operation (a rollout control):
        look again here, and wake the others."""
        self._wake()

    def tell_peers(self) -> None:
        """Wake the other live members that say where (in the background: a member that
        cannot be reached follows at its next poll, and this member's operation does not wait
        for it)."""
        if self._peers is None:
            return
        task = asyncio.create_task(self._tell_peers(self._peers), name="fleet-wake-peers")
        self._telling.add(task)
        task.add_done_callback(self._told)

    def _told(self, task: asyncio.Task[None]) -> None:
        self._telling.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("could not wake the other members: %s", exc, exc_info=exc)

    async def _tell_peers(self, peers: FleetPeers) -> None:
        now = self._clock.now()
        beats = await asyncio.to_thread(self.records.beats)
        members: dict[str, list[str]] = {}  # url -> the live members that give it
        for beat in beats.values():
            if (
                beat.url is not None
                and beat.member != self.member.name
                and beat.url != self.member.url
                and beat.alive(now)
            ):
                members.setdefault(beat.url, []).append(beat.member)
        urls = sorted(members)
        for url, error in (await peers.wake(urls)).items():
            if error is not None:
                log.warning(
                    "could not wake %s at %s (%s); it follows at its next poll",
                    ", ".join(sorted(members[url])),
                    url,
                    error,
                )
        log.debug("woke %d other members", len(urls))

    async def _next(self, run: Run, publication: Publication) -> DesiredModel:
        operation = run.operation
        now = self._clock.now()
        base = publication.base or first_generation(
            operation.model, by=self.member.name, at=now, trigger="none", reason=""
        )
        release = publication.release
        rollout = Rollout(RolloutPhase.COMPLETE)
        stable = stable_release(publication.base)
        policy = self._rollout_for(operation.model)
        if operation.kind is OperationKind.DEPLOY and policy.progressive and stable != release:
            beats = await asyncio.to_thread(self.records.beats)
            rollout = start(
                policy,
                first=self.member.name,
                alive=[m for m, beat in beats.items() if beat.alive(now)],
                stable=stable,
                generation=base.generation + 1,
            )
        elif base.rollout.in_progress and publication.latch == base.release:
            by = f"by {operation.trigger.value} on {self.member.name}"
            rollout = Rollout(
                RolloutPhase.ROLLED_BACK,
                stable=base.rollout.stable,
                canaries=base.rollout.canaries,
                since_generation=base.rollout.since_generation,
                note=f"{publication.said}, {by}" if publication.said else f"rolled back {by}",
            )
        degraded = base.unlatched(release)  # a release served on purpose is no longer degraded
        latch = publication.latch
        if latch is not None and latch != release and not base.is_degraded(latch):
            reason = f"rolled back from by {operation.trigger.value} (operation {operation.id})"
            degraded = (*degraded, Degraded(latch, now, reason))
        what = release or "unloaded"
        unloaded = None
        if release is None:  # an unload names what it left: members unload only for such a
            # record (DesiredModel.unloads). Something served, here or in the fleet, or the
            # unload was refused before it started.
            unloaded = base.release or operation.from_release or base.unloaded or "unknown"
        return base.changed(
            by=self.member.name,
            at=now,
            trigger=operation.trigger.value,
            reason=f"{operation.kind.value} of {what} by {operation.trigger.value} through "
            f"{self.member.name} (operation {operation.id})"
            + (f": {publication.said}" if publication.said else "")
            + (f": {operation.cause.reason}" if operation.cause.reason else ""),
            release=release,
            previous=base.release if base.release != release else base.previous,
            degraded=degraded,
            rollout=rollout,
            claim=None if base.claim is None or base.claim.release == release else base.claim,
            unloaded=unloaded,
        )


def _only_turns_moved(base: DesiredModel | None, current: DesiredModel | None) -> bool:
    """Whether ``current`` differs from ``base`` in its turns out of rotation alone."""
    if base is None or current is None or current.generation <= base.generation:
        return False
    return replace(current, turns=base.turns) == replace(
        base,
        generation=current.generation,
        set_by=current.set_by,
        set_at=current.set_at,
        trigger=current.trigger,
        reason=current.reason,
    )


def _lost_here(
    lost: DesiredStateConflict, member: str, release: str | None, current: DesiredModel | None
) -> DesiredStateConflict:
    """The race's error as the operation that lost it says it: the store's record is untouched,
    but this member did serve ``release`` (the steps before ``publish`` ran) and now goes back
    to what the fleet wants."""
    wanted = (current.release or "it unloaded") if current is not None else "what it had"
    served = f"served {release}" if release is not None else "unloaded it"
    return DesiredStateConflict(
        f"{lost.message}. This member ({member}) {served} before it "
        f"lost the race, and now goes back to what the fleet wants ({wanted})",
        details=lost.details,
    )
