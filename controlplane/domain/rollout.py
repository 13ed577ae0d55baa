"""A progressive rollout across the fleet, as pure rules over the desired state and the beats.

With ``rollout: {canary_members: N, bake_seconds: S}`` a new release first goes to N members
(the one that received the call counts, and went first), ``canary``; once every live canary
serves it, it bakes for S seconds, ``baking``; then every member follows, ``complete``. A canary
that fails to serve it, rolls it back (``rollback.scope: member``) or reports a GPU overload
ends the rollout, ``rolled_back``: the release is latched degraded for the fleet and the
canaries go back to the stable release. The members that are not canaries never moved.

Promotion needs every live canary's overload verdict healthy (or no GPU to watch, or the watcher
off); an ``unknown`` verdict (metrics unreadable) holds the bake rather than pass it. Any member
may advance a rollout (compare-and-swap makes one of them win), so it completes even when the
member that started it is gone.

A canary that goes away (not alive: no heartbeat for 3 of its beats; under Kubernetes a pod
replaced by one with another name) is *replaced*: the first live member by name that is not a
canary, and was not one before in this rollout, takes its place, and the rollout goes back to
``canary``, so the bake starts again once every canary serves the release. A bake vouches for
S seconds on N live canaries; time on a pod that vanished (maybe because of the release) vouches
for nothing, and promoting on the bake's clock alone would pass a release no member is serving.
With no member to take its place, the live canaries go on alone (none: the rollout waits). A
rollout that loses more than :data:`LOST_PER_CANARY` canaries per canary is stopped, as a canary
in trouble stops it: a release that keeps its canaries vanishing reaches no other member.

A person may pause, resume, promote or abort a rollout (:mod:`.rollout_controls`): while it is
paused nothing here moves it on (a canary in trouble still stops it), and a bake of
``bake_seconds`` None lasts until someone promotes it.

A rollback while a rollout is in progress (:func:`rollback_aim`), by hand or automatic, stops
it the same way whichever member answers, canary or not: back to the stable release, and the
canary's release is latched. The answering member's own history says nothing of the rollout: a
member that is not a canary serves the stable release, and its own previous release is older.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from controlplane.domain.fleet import (
    DesiredModel,
    MemberBeat,
    MemberState,
    Rollout,
    RolloutPhase,
)

PASSING_VERDICTS = frozenset({None, "healthy", "no_gpu"})  # what lets a bake complete
LOST_PER_CANARY = 2  # canaries replaced per canary before the rollout is stopped


@dataclass(frozen=True)
class RolloutPolicy:
    canary_members: int = 0  # 0: every member at once
    bake_seconds: float | None = 0.0  # None: the bake lasts until promoted

    @property
    def progressive(self) -> bool:
        return self.canary_members > 0


def start(
    policy: RolloutPolicy,
    *,
    first: str,
    alive: Iterable[str],
    stable: str | None,
    generation: int,
) -> Rollout:
    """The rollout of a release that ``first`` serves already (it went first)."""
    if not policy.progressive or stable is None:
        return Rollout(RolloutPhase.COMPLETE)
    others = sorted(member for member in set(alive) if member != first)
    return Rollout(
        phase=RolloutPhase.CANARY,
        stable=stable,
        canaries=(first, *others[: policy.canary_members - 1]),
        bake_seconds=policy.bake_seconds,
        since_generation=generation,
    )


def stable_release(desired: DesiredModel | None) -> str | None:
    """What serves everywhere now: the stable release during a rollout, else the release."""
    if desired is None:
        return None
    return desired.rollout.stable if desired.rollout.in_progress else desired.release


@dataclass(frozen=True)
class RollbackAim:
    """Where a rollback of one model goes, and what it leaves."""

    to: str | None  # the release to serve (None: nothing to go back to)
    away_from: str | None  # the release rolled back from, latched degraded (None: nothing left)
    said: str = ""  # when it stops a canary rollout: what it did, in words

    @property
    def stops_rollout(self) -> bool:
        return bool(self.said)


def rollback_aim(
    desired: DesiredModel | None,
    *,
    active: str | None,
    previous: str | None,
    to: str | None = None,
) -> RollbackAim:
    """The rollback a member that serves ``active`` (its own previous release: ``previous``)
    makes of the fleet's ``desired`` model, to ``to`` or to what served before.

    During a canary rollout (canary or baking), whatever this member is: to the rollout's
    stable release, leaving the canary's (the desired release). Else to the previous release
    (:meth:`~.fleet.DesiredModel.previous_for`), leaving ``active``."""
    if desired is not None and desired.rollout.in_progress:
        canary, stable = desired.release, desired.rollout.stable
        if canary is not None and stable is not None:
            target = to or stable
            if target == canary:  # back to the canary's own release: nothing is left
                return RollbackAim(target, None)
            where = f"the stable {stable}" if target == stable else target
            when = (
                "during its bake"
                if desired.rollout.phase is RolloutPhase.BAKING
                else "before its bake, while its canaries took it on"
            )
            said = f"rolled back the canary {canary} to {where} {when}"
            return RollbackAim(target, canary, said)
    if to is None:
        to = previous if desired is None else desired.previous_for(active, previous)
    return RollbackAim(to, active if active != to else None)


def advance(
    desired: DesiredModel, beats: Mapping[str, MemberBeat], now: datetime, *, by: str
) -> DesiredModel | None:
    """The next state of a rollout in progress, or None while it stays as it is."""
    rollout = desired.rollout
    release = desired.release
    if not rollout.in_progress or release is None:
        return None
    canaries = [beats[m] for m in rollout.canaries if m in beats and beats[m].alive(now)]
    for beat in canaries:
        why = _canary_trouble(desired, beat)
        if why is not None:
            return _rolled_back(desired, now, by=by, why=f"canary {beat.member}: {why}")
    if rollout.holds:
        return None  # paused: a canary in trouble still stops it (above), nothing moves it on
    replaced = _replace_lost(desired, beats, now, by=by)
    if replaced is not None:
        return replaced
    if not canaries:
        return None  # no live canary to judge by: wait for one
    if rollout.phase is RolloutPhase.CANARY:
        if all(beat.serves(desired.model, release) for beat in canaries):
            return desired.changed(
                by=by,
                at=now,
                trigger="rollout",
                reason=f"every canary serves {release}; baking {bake_text(rollout.bake_seconds)}",
                rollout=replace(rollout, phase=RolloutPhase.BAKING, baking_since=now),
            )
        return None
    since = rollout.baking_since or now
    if rollout.bake_seconds is None or now - since < timedelta(seconds=rollout.bake_seconds):
        return None  # None: it bakes until someone promotes it
    if not all(beat.overload in PASSING_VERDICTS for beat in canaries):
        return None  # a verdict we cannot read holds the bake; a breach ends it above
    return desired.changed(
        by=by,
        at=now,
        trigger="rollout",
        reason=f"{release} baked {bake_text(rollout.bake_seconds)} on {len(canaries)} "
        "canary(ies); "
        "every member follows",
        rollout=replace(rollout, phase=RolloutPhase.COMPLETE),
    )


def bake_text(bake: float | None) -> str:
    return "until promoted" if bake is None else f"{bake:g} s"


def _replace_lost(
    desired: DesiredModel, beats: Mapping[str, MemberBeat], now: datetime, *, by: str
) -> DesiredModel | None:
    """The rollout with each canary that went away replaced by a live member, back in
    ``canary``; stopped when too many went away; None when no canary is gone, or no member
    can take a gone one's place."""
    rollout = desired.rollout
    gone = [m for m in rollout.canaries if m not in beats or not beats[m].alive(now)]
    if not gone:
        return None
    taken = set(rollout.canaries) | set(rollout.lost)
    free = sorted(m for m, beat in beats.items() if beat.alive(now) and m not in taken)
    swaps = dict(zip(gone, free, strict=False))  # as many as there are members to take over
    if not swaps:
        return None
    lost = (*rollout.lost, *swaps)
    said = ", ".join(f"canary {old} is gone (no heartbeat for 3 beats)" for old in swaps)
    if len(lost) > LOST_PER_CANARY * len(rollout.canaries):
        why = (
            f"{said}; {len(lost)} canaries went away during this rollout "
            f"({', '.join(lost)}), more than {LOST_PER_CANARY} per canary: it is not moved to "
            "yet another member"
        )
        return _rolled_back(desired, now, by=by, why=why)
    took = ", ".join(f"{new} takes the place of {old}" for old, new in swaps.items())
    return desired.changed(
        by=by,
        at=now,
        trigger="rollout",
        reason=f"{said}: {took}; the bake of {desired.release} starts again once every canary "
        "serves it",
        rollout=replace(
            rollout,
            phase=RolloutPhase.CANARY,
            canaries=tuple(swaps.get(m, m) for m in rollout.canaries),
            baking_since=None,
            lost=lost,
        ),
    )


def _canary_trouble(desired: DesiredModel, beat: MemberBeat) -> str | None:
    state = beat.models.get(desired.model)
    if state is None or state.generation < desired.rollout.since_generation:
        return None  # it has not reported on this rollout yet
    if state.target == desired.release and state.state is MemberState.FAILED:
        return f"it failed to serve {desired.release}: {state.error}"
    if state.target == desired.release and state.state is MemberState.HELD:
        return f"it rolled {desired.release} back"
    if state.release == desired.release and beat.overload == "breach":
        return "GPU overload"
    return None


def _rolled_back(desired: DesiredModel, now: datetime, *, by: str, why: str) -> DesiredModel:
    rollout = desired.rollout
    assert desired.release is not None
    return desired.changed(
        by=by,
        at=now,
        trigger="rollout",
        reason=f"rollout of {desired.release} stopped: {why}",
        release=rollout.stable,
        previous=desired.release,
        # Nothing was stable (a first release, or one after an unload): the canaries unload it.
        unloaded=desired.release if rollout.stable is None else None,
        degraded=desired.latched(desired.release, now, f"rollout stopped: {why}"),
        rollout=replace(rollout, phase=RolloutPhase.ROLLED_BACK, note=why, paused=None),
    )
