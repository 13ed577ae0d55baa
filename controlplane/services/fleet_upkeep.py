"""The fleet's upkeep, done by every member's sync pass: rollouts moved on, and what serves
before the fleet knew of it recorded.

Any member may do either (a compare-and-swap makes one of them win, and the others let it be),
so a rollout completes, and a fleet forms, even when the member that started it is gone.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from controlplane.domain.errors import ControlPlaneError, DesiredStateConflict
from controlplane.domain.fleet import DesiredModel, MemberBeat, first_generation
from controlplane.domain.rollout import advance
from controlplane.ports import Clock, DesiredStates, ModelRecord

log = logging.getLogger(__name__)


async def seed(
    records: DesiredStates,
    member: str,
    clock: Clock,
    here: dict[str, ModelRecord],
    desired: dict[str, DesiredModel],
) -> bool:
    """Models that serve here and that the fleet has no record of (a member upgraded from a
    version without a fleet) become the fleet's, so that the others know what already serves.
    ``desired`` gets each record written; whether any was."""
    wrote = False
    for model, record in sorted(here.items()):
        if model in desired or record.active_release is None:
            continue
        now = clock.now()
        new = first_generation(model, by=member, at=now, trigger="seed", reason="").changed(
            by=member,
            at=now,
            trigger="seed",
            reason=f"served on {member} before the fleet had a record of it",
            release=record.active_release,
            previous=record.previous_release,
        )
        try:
            await asyncio.to_thread(records.swap, new)
        except DesiredStateConflict:
            continue  # another member wrote one first: the next pass reads it
        except ControlPlaneError as exc:
            log.warning("%s: could not record it in the fleet's desired state: %s", model, exc)
            continue
        desired[model] = new
        wrote = True
        log.info(
            "%s: recorded %s in the fleet's desired state (it served here already)",
            model,
            record.active_release,
        )
    return wrote


async def advance_rollouts(
    records: DesiredStates,
    member: str,
    desired: dict[str, DesiredModel],
    now: datetime,
    *,
    own: MemberBeat,
) -> bool:
    """Move each rollout in progress on, judged by the members' heartbeats (``own``: this
    member as it is now, not as its last heartbeat said). True when one moved."""
    rolling = [wanted for wanted in desired.values() if wanted.rollout.in_progress]
    if not rolling:
        return False
    try:
        beats = await asyncio.to_thread(records.beats)
    except ControlPlaneError as exc:
        log.warning("cannot read the members' heartbeats to judge a rollout: %s", exc)
        return False
    beats[member] = own
    moved = False
    for wanted in rolling:
        after = advance(wanted, beats, now, by=member)
        if after is None:
            continue
        try:
            await asyncio.to_thread(records.swap, after)
        except DesiredStateConflict:
            continue  # another member advanced it first
        except ControlPlaneError as exc:
            log.warning("%s: could not advance its rollout: %s", wanted.model, exc)
            continue
        log.warning(
            "%s: rollout of %s is now %s: %s",
            wanted.model,
            wanted.release,
            after.rollout.phase.value,
            after.reason,
        )
        moved = True
    return moved


DEPARTED_AFTER = 3600.0  # s without a heartbeat after which a member is forgotten


async def forget_departed(records: DesiredStates, member: str, now: datetime) -> list[str]:
    """Delete the heartbeats of members not seen for :data:`DEPARTED_AFTER` s (pods replaced
    by a rollout are named anew, so the list would only grow); the names forgotten. Judged
    from when each record landed in the store, by one listing: reading every member's record
    here would cost each member a GET per member, a fleet's cost growing with its square. A
    record that cannot be parsed is judged alike; one the store gives no time for is kept."""
    try:
        heard = await asyncio.to_thread(records.heard_from)
    except ControlPlaneError as exc:
        log.warning("cannot list the members' heartbeats to forget departed ones: %s", exc)
        return []
    gone = [
        name
        for name, landed in heard.items()
        if name != member and landed is not None and (now - landed).total_seconds() > DEPARTED_AFTER
    ]
    for name in gone:
        try:
            await asyncio.to_thread(records.forget, name)
        except ControlPlaneError as exc:
            log.warning("cannot forget the departed member %s: %s", name, exc)
            continue
        log.info("forgot member %s: no heartbeat for over %.0f s", name, DEPARTED_AFTER)
    return gone
