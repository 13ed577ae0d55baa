"""This member's turns out of rotation, taken and given back in the fleet's desired state.

A rolling update takes a turn (:mod:`~controlplane.domain.turns`) before its member leaves
rotation and gives it back once the member serves again, so that at most
``rollout.max_unavailable`` members are out for one model at once. Taking one is a
compare-and-swap on the model's record: two members racing for the last free turn cannot both
win. Turns held by members that are not alive, or by an earlier process under the same name
(it was killed mid-update and restarted), are dropped by the member that takes a turn.

A member in rotation also counts the live members whose heartbeat says they are out of
rotation without a turn (starting again after a crash, held by memory that did not come back):
the load balancer sends them nothing either, so its leaving would put one more out. A member
that is out itself (starting) counts turns only: taking one adds nobody out, and two members
starting at once must not wait for each other.

Without a record of the model (its first deploy, or no fleet) there is nothing to share: the
turn is this member's at once. While the model's rollout is paused, a member that follows the
fleet takes no turn (it waits, as for a turn another member holds); a person's own deploy
through this member is no follower and goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from controlplane.domain.errors import (
    ControlPlaneError,
    DesiredStateConflict,
    FleetTimeout,
    Superseded,
)
from controlplane.domain.operations import Trigger
from controlplane.domain.turns import Turn
from controlplane.ports import Clock, DesiredStates
from controlplane.services.fleet_ledger import Member
from controlplane.services.rotation import Rotation
from controlplane.services.tracker import OperationTracker

log = logging.getLogger(__name__)
TURN_POLL = 0.5  # s between looks at whether a turn is free
GIVE_BACK_ATTEMPTS = 10


class FleetTurns:
    def __init__(
        self,
        *,
        records: DesiredStates,
        member: Member,
        clock: Clock,
        rotation: Rotation | None = None,
    ) -> None:
        self._records = records
        self._member = member
        self._clock = clock
        self._rotation = rotation or Rotation()

    @asynccontextmanager
    async def turn(
        self,
        tracker: OperationTracker,
        model: str,
        release: str | None,
        *,
        max_unavailable: int,
        timeout: float,
    ) -> AsyncIterator[None]:
        """Hold a turn for ``model`` (the ``turn`` step waits for one, up to ``timeout`` s),
        given back when the block ends, however it ends. An operation that follows the fleet
        (trigger ``fleet``) whose release the fleet no longer wants here is :class:`Superseded`
        instead: nothing has left rotation yet, and the member follows the new one."""
        follows = tracker.operation.trigger is Trigger.FLEET
        async with tracker.step("turn"):
            started = self._clock.monotonic()
            waited_for: list[str] = []
            while True:
                held = await self._try_take(model, release, max_unavailable, follows=follows)
                if held is None:
                    break
                if held and held != waited_for:
                    waited_for = held
                    log.info(
                        "%s: waiting for a turn out of rotation (held by %s)",
                        model,
                        ", ".join(held),
                        extra={"model": model, "operation_id": tracker.operation.id},
                    )
                if self._clock.monotonic() - started >= timeout:
                    raise FleetTimeout(
                        f"no turn out of rotation for {model} within {timeout:g} s: held by "
                        f"{', '.join(waited_for) or 'others'} (rollout.max_unavailable "
                        f"{max_unavailable}); this member keeps serving what it has"
                    )
                await self._clock.sleep(TURN_POLL)
            tracker.detail(
                waited_seconds=round(self._clock.monotonic() - started, 3),
                behind=waited_for,
                max_unavailable=max_unavailable,
            )
        try:
            yield
        finally:
            await asyncio.shield(self._give_back(model))

    async def others_alive(self) -> int:
        """Members of the fleet other than this one that are alive now (a fleet of one: 0)."""
        beats = await asyncio.to_thread(self._records.beats)
        now = self._clock.now()
        return sum(
            1 for name, beat in beats.items() if name != self._member.name and beat.alive(now)
        )

    async def _try_take(
        self, model: str, release: str | None, most: int, *, follows: bool
    ) -> list[str] | None:
        """None once this member holds a turn; else who holds the turns it waits for."""
        current = await asyncio.to_thread(self._records.read, model)
        if current is None:
            return None  # no record: no fleet to keep serving (a first deploy)
        me = self._member
        wanted = current.target_for(me.name)
        if follows and wanted != release:
            raise Superseded(
                f"the fleet wants {wanted or 'it unloaded'} here now (generation "
                f"{current.generation}), not {release}: following that instead, without "
                "leaving rotation for a release already replaced"
            )
        paused = current.rollout.paused
        if follows and current.rollout.holds and paused is not None:
            return [f"nobody: the rollout is paused by {paused.by}"]  # no turn until resumed
        beats = await asyncio.to_thread(self._records.beats)
        now = self._clock.now()
        alive = {name: beat.incarnation for name, beat in beats.items() if beat.alive(now)}
        live = [turn for turn in current.turns if turn.member != me.name and turn.held(alive)]
        out = [turn.member for turn in live]
        if self._rotation.why_out() is None:  # in rotation: leaving would add one more out
            out += sorted(
                f"{name} ({beat.out_of_rotation})"
                for name, beat in beats.items()
                if name != me.name
                and name not in out
                and beat.alive(now)
                and beat.out_of_rotation is not None
            )
        if len(out) >= most:
            return out
        mine = Turn(me.name, me.incarnation, now, release)
        dropped = [t.member for t in current.turns if t not in live and t.member != me.name]
        new = current.changed(
            by=me.name,
            at=now,
            trigger="turn",
            reason=f"{me.name} takes a turn out of rotation to update to {release}"
            + (f" (given up by {', '.join(dropped)}: not alive)" if dropped else ""),
            turns=(*live, mine),
        )
        try:
            await asyncio.to_thread(self._records.swap, new)
        except DesiredStateConflict:
            return [turn.member for turn in live]  # another change won: look again
        return None

    async def _give_back(self, model: str) -> None:
        me = self._member
        for _attempt in range(GIVE_BACK_ATTEMPTS):
            try:
                current = await asyncio.to_thread(self._records.read, model)
                if current is None or not any(t.member == me.name for t in current.turns):
                    return
                back = current.changed(
                    by=me.name,
                    at=self._clock.now(),
                    trigger="turn",
                    reason=f"{me.name} is back in rotation",
                    turns=tuple(t for t in current.turns if t.member != me.name),
                )
                await asyncio.to_thread(self._records.swap, back)
                return
            except DesiredStateConflict:
                continue
            except ControlPlaneError as exc:  # the next member to look drops it once we leave
                log.warning("%s: cannot give back this member's turn yet: %s", model, exc)
                await self._clock.sleep(TURN_POLL)
        log.warning("%s: could not give back this member's turn; it lapses with it", model)
