"""The fleet as a person or CI sees it: who is in it, what each member serves, and waiting
until every member serves what was asked.

Read from the store (the desired state and the heartbeats), with this member's own state as it
is now rather than as its last heartbeat said. Waiting polls the same records with a bound: it
ends when every live member serves the release, when one reports that it cannot (its error is
in the answer), or when the desired state moved elsewhere (a canary was rolled back, another
deploy won).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.domain.errors import (
    ControlPlaneError,
    DesiredStateConflict,
    FleetTimeout,
    MemberFailed,
)
from controlplane.domain.fleet import (
    DesiredModel,
    MemberBeat,
    MemberModel,
    MemberState,
    RolloutPhase,
    converged,
    pause_for_storage,
)
from controlplane.domain.refusals import Refusal
from controlplane.ports import Clock, DesiredStates
from controlplane.services.fleet_refusals import refusal_json
from controlplane.services.fleet_sync import FleetSync

log = logging.getLogger(__name__)
WAIT_POLL = 0.25
# After an outage of the store, how long (beyond three beats) the others have to beat again:
# their writes may be in the store's backoff (5 s apart at most) when it comes back.
BACK_AFTER_OUTAGE = 10.0
# A member's clock this far (s) from the store's is shown: beyond what a write's latency and
# the timestamps' whole seconds account for.
CLOCK_SAID = 5.0


@dataclass(frozen=True)
class FleetSnapshot:
    at: datetime
    member: str  # this member
    desired: dict[str, DesiredModel]
    beats: dict[str, MemberBeat]
    unreadable: str | None = None  # the store could not be read: this is what was read last
    # records refused (by where): no member acts on their models, or sees their members
    broken: dict[str, Refusal] = field(default_factory=dict)
    read_at: datetime | None = None  # when the others' heartbeats were read (unreadable: last)
    # (the last read before the store went away, when it came back) for a store that was away
    # lately: the others could not beat meanwhile either
    blind: tuple[datetime, datetime] | None = None

    def alive(self, beat: MemberBeat) -> bool:
        """Whether ``beat``'s member was alive when its heartbeat was read: a view the store
        could not give again does not turn the others dead, nor tell what they do now; nor
        does a store that was away for everyone (their beats could not land), until they have
        had three beats since it came back."""
        if beat.member == self.member:
            return beat.alive(self.at)
        if beat.alive(self.read_at or self.at) or (self.unreadable is None and beat.alive(self.at)):
            return True  # as of when the read began (a slow store), or now
        if self.blind is None:
            return False
        before, back = self.blind
        grace = 3 * beat.interval + BACK_AFTER_OUTAGE
        # Alive at some moment of the blind stretch: a beat that landed just before the store
        # went away may be newer than the last read before it.
        alive_then = beat.alive(before) or before <= beat.seen <= back
        return alive_then and (self.at - back).total_seconds() <= grace

    def incarnations_alive(self) -> dict[str, str]:
        """Each live member's process (a turn held by another one holds nothing)."""
        return {name: beat.incarnation for name, beat in self.beats.items() if self.alive(beat)}

    def converged(self, model: str) -> bool:
        """Every live member serves what the fleet wants; never known while the store cannot
        be read (the others may be anywhere by now)."""
        wanted = self.desired.get(model)
        if wanted is None or self.unreadable is not None:
            return False
        return converged(wanted, self.beats, self.at, alive=self.alive)


class FleetService:
    def __init__(self, *, records: DesiredStates, sync: FleetSync, clock: Clock) -> None:
        self._records = records
        self._sync = sync
        self._clock = clock
        self._beats: dict[str, MemberBeat] = {}  # the others' heartbeats, as read last
        self._beats_at: datetime | None = None
        self._away_since: datetime | None = None  # the last read before a failed one
        self._blind: tuple[datetime, datetime] | None = None  # the last outage: before, back

    @property
    def member(self) -> str:
        return self._sync.member.name

    @property
    def stale(self) -> bool:
        return self._sync.stale

    @property
    def name_conflict(self) -> str | None:
        return self._sync.name_conflict

    async def snapshot(self, model: str | None = None) -> FleetSnapshot:
        """The fleet now: every record (or ``model``'s), every heartbeat, this member live."""
        started = self._clock.now()
        try:
            if model is None:
                desired = await asyncio.to_thread(self._records.read_all)
            else:
                one = await asyncio.to_thread(self._records.read, model)
                desired = {model: one} if one is not None else {}
            beats = await asyncio.to_thread(self._records.beats)
        except ControlPlaneError as exc:
            if self._away_since is None:  # the store was read last then (by anyone here)
                reads = [t for t in (self._beats_at, self._sync.last_read) if t is not None]
                self._away_since = max(reads) if reads else self._clock.now()
            last = self._sync.last
            if last is None or (last.error is not None and self._sync.last_read is None):
                raise
            # What this member read last, and itself: an operator still sees something.
            known = dict(last.desired)
            if model is not None:
                known = {model: known[model]} if model in known else {}
            seen = {**self._beats, self.member: self._sync.heartbeat()}
            return FleetSnapshot(
                self._clock.now(), self.member, known, seen, str(exc), read_at=self._beats_at
            )
        now = self._clock.now()
        own = self._sync.heartbeat()
        if self._away_since is not None:  # the first read since the store went away
            self._blind, self._away_since = (self._away_since, now), None
        elif (now - started).total_seconds() > own.interval:  # it rode out an outage
            self._blind = (self._beats_at or started, now)
        self._beats, self._beats_at = dict(beats), now
        beats[self.member] = own
        refusals = self._sync.refusals
        behind = refusals.behind(desired)  # shown as the sync follows them
        desired = {
            **desired,
            **{r.name: refusals.generations.seen[r.name] for r in behind.values()},
        }
        broken = {
            **(self._records.unreadable() if model is None else {}),
            **{w: r for w, r in refusals.found().items() if model in (None, r.name)},
            **behind,
        }
        gaps = [g for g in (self._blind, self._sync.store_gap) if g is not None]
        blind = max(gaps, key=lambda gap: gap[1]) if gaps else None
        # The others judged as of when the read began: a slow store must not age them.
        return FleetSnapshot(
            now, self.member, desired, beats, broken=broken, read_at=started, blind=blind
        )

    async def wait_for(self, model: str, release: str | None, timeout: float) -> FleetSnapshot:
        """Return once every live member serves ``release`` of ``model`` (no rollout in
        progress: complete, or rolled back to ``release``); :class:`MemberFailed` when one
        cannot, :class:`DesiredStateConflict` when the desired state moved to something else,
        :class:`FleetTimeout` past ``timeout`` s. Each error's details carry every member's
        state."""
        self._sync.wake.set()  # this member's own state first: beat it now
        deadline = self._clock.monotonic() + timeout
        while True:
            snapshot = await self.snapshot(model)
            wanted = snapshot.desired.get(model)
            details = {"fleet": fleet_json_model(snapshot, model)}
            if snapshot.unreadable is not None:  # nothing to conclude: wait for the store
                if self._clock.monotonic() >= deadline:
                    raise FleetTimeout(
                        f"cannot tell whether every member serves {model} "
                        f"{release or '(unloaded)'} after {timeout:g} s: the fleet's records "
                        f"cannot be read ({snapshot.unreadable}); they go on converging",
                        details=details,
                    )
                await self._clock.sleep(WAIT_POLL)
                continue
            if wanted is None or wanted.release != release:
                moved = (
                    "has no record"
                    if wanted is None
                    else f"wants {wanted.release or 'it unloaded'} now (set by {wanted.set_by}: "
                    f"{wanted.reason})"
                )
                error: Exception = DesiredStateConflict(
                    f"the fleet's desired state of {model} moved while waiting: it {moved}",
                    details=details,
                )
                if wanted is not None and wanted.rollout.phase is RolloutPhase.ROLLED_BACK:
                    error = MemberFailed(
                        f"the rollout of {release} was stopped: {wanted.rollout.note}",
                        details=details,
                    )
                raise error
            failed = _failed_members(wanted, snapshot)
            if failed:
                raise MemberFailed(
                    f"{len(failed)} member(s) could not serve {model} {release or '(unloaded)'}: "
                    + "; ".join(f"{member}: {why}" for member, why in failed.items()),
                    details=details,
                )
            if (
                not wanted.rollout.in_progress  # complete, or rolled back to this release
                and snapshot.converged(model)
                and not _turns_held(wanted, snapshot)
            ):
                return snapshot
            if self._clock.monotonic() >= deadline:
                waiting = [
                    beat.member
                    for beat in snapshot.beats.values()
                    if snapshot.alive(beat)
                    and not beat.serves(model, wanted.target_for(beat.member))
                ]
                raise FleetTimeout(
                    f"not every member serves {model} {release or '(unloaded)'} after "
                    f"{timeout:g} s (phase {wanted.rollout.phase.value}; waiting for "
                    f"{', '.join(waiting) or 'the rollout'}); they go on converging",
                    details=details,
                )
            await self._clock.sleep(WAIT_POLL)


def _turns_held(wanted: DesiredModel, snapshot: FleetSnapshot) -> list[str]:
    """Live members still out of rotation for a rolling update of the model (or letting
    the load balancer see them back): the rollout is not over until they hand the turn on,
    and until their own beat says so too (the turn is given back in the desired state a
    moment before the member beats again, and the views read the beat)."""
    alive = snapshot.incarnations_alive()
    held = {turn.member for turn in wanted.turns if turn.held(alive)}
    for beat in snapshot.beats.values():
        state = beat.models.get(wanted.model)
        if snapshot.alive(beat) and state is not None and state.progress.phase is not None:
            held.add(beat.member)
    return sorted(held)


def _failed_members(wanted: DesiredModel, snapshot: FleetSnapshot) -> dict[str, str]:
    failed = {}
    for beat in snapshot.beats.values():
        state = beat.models.get(wanted.model)
        if not snapshot.alive(beat) or state is None:
            continue
        if state.target != wanted.target_for(beat.member) or state.generation < wanted.generation:
            continue  # a report on an older desired state
        if state.state in (MemberState.FAILED, MemberState.HELD):
            failed[beat.member] = state.error or state.state.value
    return failed


def _state_json(state: MemberModel | None) -> dict[str, object]:
    if state is None:
        return {"release": None, "state": None, "target": None, "error": None, "rolling": None}
    progress = state.progress
    return {
        "release": state.release,
        "state": state.state.value,
        "target": state.target,
        "error": state.error,
        # A rolling update here: the step running now, and how long each one done took.
        "rolling": None
        if not progress.took and progress.phase is None
        else {
            "phase": progress.phase,
            "took": dict(progress.took),
            "failed": progress.failed,
            "summary": progress.summary,
        },
    }


def clock_ahead(beat: MemberBeat) -> int | None:
    """How far the member's clock is ahead of this member's (negative: behind), in whole
    seconds, when it is further than a store's timestamps can tell; None: not that far, or
    not known. Shown, not acted on: liveness never uses the member's clock."""
    skew = beat.skew()
    return None if skew is None or abs(skew) <= CLOCK_SAID else round(skew)


def member_json(beat: MemberBeat, alive: bool) -> dict[str, object]:
    return {
        "member": beat.member,
        "alive": alive,
        "last_seen": beat.seen.isoformat(),  # when its last beat landed, on this clock
        "clock_ahead_seconds": clock_ahead(beat),
        "version": beat.version,
        "stale": beat.stale,
        "overload": beat.overload,
        "url": beat.url,
        "name_conflict": beat.name_conflict,
        "out_of_rotation": beat.out_of_rotation,  # why its load balancer sends it nothing
        "models": {name: _state_json(state) for name, state in sorted(beat.models.items())},
    }


def desired_json(snapshot: FleetSnapshot, wanted: DesiredModel) -> dict[str, object]:
    rollout = wanted.rollout
    return {
        "desired": wanted.release,
        "generation": wanted.generation,
        "converged": snapshot.converged(wanted.model),
        "phase": rollout.phase.value,
        "previous": wanted.previous,
        "set_by": wanted.set_by,
        "set_at": wanted.set_at.isoformat(),
        "trigger": wanted.trigger,
        "reason": wanted.reason,
        "stable": rollout.stable if rollout.in_progress else None,
        "canaries": list(rollout.canaries),
        "rollout_note": rollout.note or None,
        "bake_seconds": rollout.bake_seconds if rollout.in_progress else None,
        "paused": pause_for_storage(rollout.paused) if rollout.holds else None,
        "degraded": [
            {"release": d.release, "at": d.at.isoformat(), "reason": d.reason}
            for d in wanted.degraded
        ],
        # Members out of rotation for a rolling update of it (their turn taken when); a turn
        # whose holder died, or restarted since, holds nothing and is not shown.
        "turns": [
            {"member": t.member, "since": t.at.isoformat(), "release": t.release}
            for t in wanted.turns
            if t.held(snapshot.incarnations_alive())
        ],
    }


def fleet_json(
    snapshot: FleetSnapshot, *, stale: bool, name_conflict: str | None = None
) -> dict[str, object]:
    return {
        "member": snapshot.member,
        "stale": stale or snapshot.unreadable is not None,
        "store_error": snapshot.unreadable,
        "name_conflict": name_conflict,
        "unreadable_records": [
            refusal_json(where, r) for where, r in sorted(snapshot.broken.items())
        ],
        "members": [
            member_json(beat, snapshot.alive(beat))
            for _name, beat in sorted(snapshot.beats.items())
        ],
        "models": {
            name: desired_json(snapshot, wanted)
            for name, wanted in sorted(snapshot.desired.items())
        },
    }


def fleet_json_model(snapshot: FleetSnapshot, model: str) -> dict[str, object]:
    """One model across the fleet: its desired state and each member's state of it."""
    wanted = snapshot.desired.get(model)
    return {
        "model": model,
        **(desired_json(snapshot, wanted) if wanted is not None else {"desired": None}),
        "members": [
            {
                "member": beat.member,
                "alive": snapshot.alive(beat),
                "out_of_rotation": beat.out_of_rotation,
                **_state_json(beat.models.get(model)),
            }
            for _name, beat in sorted(snapshot.beats.items())
        ],
    }
