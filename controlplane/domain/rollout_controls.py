"""A person's hand on a rollout: pause, resume, promote, abort (as Argo Rollouts has them).

Each control is a change of the model's desired-state record, a new generation written
compare-and-swap like every other change, with who, when and why recorded: every member sees
it the same way, including one that missed the wake, crashed or restarted.

* ``pause`` holds the update where it stands: the rollout does not move on
  (:func:`~.rollout.advance` makes no transition, a bake's clock does not run out into a
  promotion), no member starts towards a target it does not serve yet (it reports ``paused``)
  and none takes a rolling turn. Members already mid-operation finish it. A canary in trouble
  still stops the rollout: a pause holds progress, never a rollback. Anything still spreading
  can be paused: a canary rollout (``canary``, ``baking``), or a plain update that not every
  live member serves yet (all at once, or rolling turn by turn), so that a bad rolling update
  can be stopped between two members.
* ``resume`` lets it go on where it stood. The time paused does not count towards a bake
  (Argo's does not either): the bake has as long left as when it was paused.
* ``promote`` ends a canary rollout now (``canary`` or ``baking``): every member follows. It
  is the only way out of a bake of ``bake_seconds: null``.
* ``abort`` stops a canary rollout: back to the stable release everywhere (the canaries move
  back, the others never moved), ``rolled_back`` with a note of who and why. Unlike a rollback
  forced by trouble, the release is not latched degraded: a person stopped it, nothing showed
  it bad, so deploying it again later needs no other step.

Pure: standard library only. Each refusal is an error with its own code
(:mod:`~controlplane.domain.errors`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from controlplane.domain.errors import (
    NoRolloutInProgress,
    RolloutAlreadyPaused,
    RolloutNotPaused,
)
from controlplane.domain.fleet import (
    DesiredModel,
    MemberBeat,
    Pause,
    RolloutPhase,
    converged,
)


def who(trigger: str, member: str) -> str:
    """Who asked, as the record says it: ``cli through m1``."""
    return f"{trigger} through {member}"


def _why(reason: str) -> str:
    return f": {reason}" if reason else ""


def pause(
    desired: DesiredModel,
    beats: Mapping[str, MemberBeat],
    now: datetime,
    *,
    member: str,
    trigger: str,
    reason: str = "",
) -> DesiredModel:
    """``desired`` paused by ``trigger`` through ``member``; refused when nothing spreads."""
    rollout = desired.rollout
    if rollout.holds:
        assert rollout.paused is not None
        raise RolloutAlreadyPaused(
            f"the rollout of {desired.model} {desired.release} is paused already, by "
            f"{rollout.paused.by} at {rollout.paused.at.isoformat()}"
            f"{_why(rollout.paused.reason)}; resume it with controlplane rollout resume "
            f"{desired.model}"
        )
    spreading = rollout.in_progress or (
        rollout.phase is not RolloutPhase.ROLLED_BACK and not converged(desired, beats, now)
    )
    if not spreading:
        raise NoRolloutInProgress(
            f"nothing to pause: {_standing(desired)}, and every live member serves what it should"
        )
    by = who(trigger, member)
    return desired.changed(
        by=member,
        at=now,
        trigger=trigger,
        reason=f"rollout of {desired.release or 'the unload'} paused by {by}{_why(reason)}",
        rollout=replace(rollout, paused=Pause(by, now, reason)),
    )


def resume(
    desired: DesiredModel, now: datetime, *, member: str, trigger: str, reason: str = ""
) -> DesiredModel:
    """``desired`` going on where it was paused, its bake's clock moved by the time paused."""
    rollout = desired.rollout
    paused = rollout.paused
    if paused is None or not rollout.holds:
        raise RolloutNotPaused(
            f"the rollout of {desired.model} is not paused ({_standing(desired)}): nothing to "
            "resume"
        )
    since = rollout.baking_since
    if since is not None and rollout.phase is RolloutPhase.BAKING:
        since += max(timedelta(0), now - max(paused.at, since))
    return desired.changed(
        by=member,
        at=now,
        trigger=trigger,
        reason=f"rollout of {desired.release or 'the unload'} resumed by "
        f"{who(trigger, member)}{_why(reason)} (paused by {paused.by})",
        rollout=replace(rollout, paused=None, baking_since=since),
    )


def promote(
    desired: DesiredModel, now: datetime, *, member: str, trigger: str, reason: str = ""
) -> DesiredModel:
    """``desired`` with its canary rollout complete now: every member follows the release."""
    rollout = desired.rollout
    if not rollout.in_progress:
        raise NoRolloutInProgress(f"nothing to promote: {_standing(desired)}")
    return desired.changed(
        by=member,
        at=now,
        trigger=trigger,
        reason=f"{desired.release} promoted by {who(trigger, member)} during its "
        f"{rollout.phase.value} phase{_why(reason)}; every member follows",
        rollout=replace(rollout, phase=RolloutPhase.COMPLETE, paused=None),
    )


def abort(
    desired: DesiredModel, now: datetime, *, member: str, trigger: str, reason: str = ""
) -> DesiredModel:
    """``desired`` with its canary rollout stopped: back to the stable release everywhere
    (nothing stable: the canaries unload it), the release not latched degraded."""
    rollout = desired.rollout
    release = desired.release
    if not rollout.in_progress or release is None:
        raise NoRolloutInProgress(f"nothing to abort: {_standing(desired)}")
    note = f"aborted by {who(trigger, member)}{_why(reason)}"
    return desired.changed(
        by=member,
        at=now,
        trigger=trigger,
        reason=f"rollout of {release} {note}; back to "
        f"{rollout.stable or 'nothing (no release was stable)'}",
        release=rollout.stable,
        previous=release,
        unloaded=release if rollout.stable is None else None,
        rollout=replace(rollout, phase=RolloutPhase.ROLLED_BACK, note=note, paused=None),
    )


def _standing(desired: DesiredModel) -> str:
    """Where the model's rollout stands, for a refusal."""
    rollout = desired.rollout
    release = desired.release or "(unloaded)"
    if rollout.phase is RolloutPhase.ROLLED_BACK:
        return (
            f"the rollout of {desired.previous or 'its release'} was stopped ({rollout.note}); "
            f"every member goes back to {release}"
        )
    if rollout.in_progress:
        return f"{release} is in its {rollout.phase.value} phase"
    return (
        f"no canary rollout of {desired.model} is in progress (generation "
        f"{desired.generation}: every member follows {release})"
    )
