"""This member's heartbeat in the fleet's records: written when due, or when it says something new.

Every member writes one every ``fleet.heartbeat_seconds`` (three missed and it is not alive), and
at once when what it says changes (what it serves and how, its GPU verdict, whether it is stale),
so a rollout sees a member converge without waiting for its next beat. It is not written more
often than that: each write is a temp file, an fsync and a rename in the shared store (on a local
store also inotify events for every member's watch), and the sync pass that asks for one runs
every poll interval, five times per beat at a 1 s poll.
"""

from __future__ import annotations

import asyncio
import logging

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.fleet import MemberBeat
from controlplane.ports import DesiredStates

log = logging.getLogger(__name__)


class HeartbeatWriter:
    def __init__(self, *, records: DesiredStates, interval: float) -> None:
        self._records = records
        self._interval = interval
        self.due_at = 0.0  # loop time when a heartbeat is due even if nothing changed
        self.last_error: str | None = None  # why the last write failed; None: it did not
        self._said: tuple[object, ...] | None = None  # what the last one written said

    async def write_if_due(self, beat: MemberBeat) -> None:
        if asyncio.get_running_loop().time() >= self.due_at or _said(beat) != self._said:
            await self.write(beat)

    async def write(self, beat: MemberBeat) -> None:
        try:
            await asyncio.to_thread(self._records.beat, beat)
        except ControlPlaneError as exc:
            if self.last_error is None:
                log.warning("cannot write this member's heartbeat: %s", exc)
            self.last_error = str(exc)
            return  # not written: due still, so the next look tries again
        self.due_at = asyncio.get_running_loop().time() + self._interval
        self._said = _said(beat)
        if self.last_error is not None:
            log.info("this member's heartbeat is written again")
        self.last_error = None


def _said(beat: MemberBeat) -> tuple[object, ...]:
    """What a heartbeat tells the fleet, its time apart."""
    return (beat.incarnation, beat.version, dict(beat.models), beat.overload, beat.stale)
