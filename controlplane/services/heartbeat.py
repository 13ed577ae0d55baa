"""This member's heartbeat in the fleet's records: written when due, or when it says something new.

Every member writes one at once when what it says changes (what it serves and how, its GPU
verdict, whether it is stale or in rotation), so a rollout sees a member converge without waiting,
and else every ``fleet.keepalive_seconds`` (60 s): an idle fleet writes one object per member per
keepalive, whatever the number of models. The others judge it alive for three keepalives after
the beat *landed*, by the store's timestamps (:attr:`MemberBeat.landed`), so the time a member
writes into its beat is never trusted for that. A beat is not written more often than the sync
pass asks: each write is a temp file, an fsync and a rename in a shared directory (with inotify
events for every member's watch) or one PutObject.

Two daemons given the same member name (a copied config, a fixed ``CONTROLPLANE_FLEET__MEMBER``
in a Deployment with several replicas) would write one heartbeat in turns, and the fleet would
see one member that flips between what two serve: a rollout could be taken as converged with one
of them behind. So every :data:`NAME_CHECK_BEATS` beats (30 s by default), before writing, the
writer reads the record under its name: one written by another incarnation since this one's last
write means another daemon uses the name. That is logged as an error and shown
(``name_conflict``: status, ``GET /v1/fleet``, ``controlplane_fleet_member_name_conflict``)
until a check finds the record its own again.
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import datetime

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.fleet import MemberBeat
from controlplane.ports import Clock, DesiredStates

log = logging.getLogger(__name__)
NAME_CHECK_BEATS = 6  # beats between looks at whether another daemon writes under this name
RETRY_SECONDS = 1.0  # after a write failed: the soonest the sync loop wakes to try again


class HeartbeatWriter:
    def __init__(
        self,
        *,
        records: DesiredStates,
        interval: float,
        clock: Clock,
        name_check: float | None = None,
    ) -> None:
        self._records = records
        self._clock = clock
        self._interval = interval
        self._name_check = NAME_CHECK_BEATS * interval if name_check is None else name_check
        self.due_at = -math.inf  # clock time when a heartbeat is due even if nothing changed
        self._retry_at = -math.inf  # before then a failed write is not tried between passes
        self.last_error: str | None = None  # why the last write failed; None: it did not
        self._said: tuple[object, ...] | None = None  # what the last one written said
        self._last_at: datetime | None = None  # the time the last one written carried
        self._check_at = -math.inf  # clock time of the next look at who writes as this member
        self.name_conflict: str | None = None  # another daemon writes as this member: who
        self._landed: datetime | None = None  # when the last write returned
        # The last stretch in which this member's beats did not land (a write that failed or
        # rode out an outage): (the last landed before, the first after). The others' beats
        # could not land then either, so they are not judged dead for it.
        self.gap: tuple[datetime, datetime] | None = None

    @property
    def wake_at(self) -> float:
        """Clock time at which the sync loop, between its passes, should wake to write: when
        the next beat is due, but never sooner than a second after a write failed (a store
        that refuses every write, a bucket that does not exist, is not asked again and again
        in a busy loop; the next pass still tries at once)."""
        return max(self.due_at, self._retry_at)

    async def write_if_due(self, beat: MemberBeat) -> None:
        if self._clock.monotonic() >= self.due_at or _said(beat) != self._said:
            await self.write(beat)

    async def write(self, beat: MemberBeat) -> None:
        if self._clock.monotonic() >= self._check_at:
            self._check_at = self._clock.monotonic() + self._name_check
            try:
                await self._check_name(beat)
            except ControlPlaneError as exc:  # a look that failed must not cost the beat
                log.debug("could not look at who writes as %s: %s", beat.member, exc)
        try:
            await asyncio.to_thread(self._records.beat, beat)
        except ControlPlaneError as exc:
            if self.last_error is None:
                log.warning("cannot write this member's heartbeat: %s", exc)
            self.last_error = str(exc)
            self._retry_at = self._clock.monotonic() + min(self._interval, RETRY_SECONDS)
            return  # not written: due still, so the next pass tries again
        self.due_at = self._clock.monotonic() + self._interval
        self._said = _said(beat)
        landed = self._clock.now()
        if (
            self._landed is not None
            and (landed - self._landed).total_seconds() > 2 * self._interval
        ):
            self.gap = (self._landed, landed)  # beats that did not land: the store was away
        self._landed = landed
        self._last_at = beat.at
        if self.last_error is not None:
            log.info("this member's heartbeat is written again")
        self.last_error = None

    async def _check_name(self, beat: MemberBeat) -> None:
        found = await asyncio.to_thread(self._records.beat_of, beat.member)
        taken = (
            found is not None
            and found.incarnation != beat.incarnation
            and self._last_at is not None
            and found.at > self._last_at
        )
        if not taken:
            if self.name_conflict is not None:
                log.info("no other daemon writes heartbeats as %s any more", beat.member)
            self.name_conflict = None
            return
        if found is None:  # for mypy: taken implies found
            return
        conflict = (
            f"another daemon writes heartbeats as {beat.member} (incarnation "
            f"{found.incarnation}, version {found.version or '?'}, at {found.at.isoformat()}); "
            "give each member its own name (CONTROLPLANE_FLEET__MEMBER; in Kubernetes the "
            "pod's name)"
        )
        if self.name_conflict is None:
            log.error("%s: the fleet cannot tell the two apart", conflict)
        self.name_conflict = conflict


def _said(beat: MemberBeat) -> tuple[object, ...]:
    """What a heartbeat tells the fleet, its time apart."""
    return (
        beat.incarnation,
        beat.version,
        dict(beat.models),
        beat.overload,
        beat.stale,
        beat.name_conflict,
        beat.out_of_rotation,
    )
