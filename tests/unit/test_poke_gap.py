"""Wakes from other members need no token, so a flood of them must not become a flood of store
reads: the passes that answer them start at least a gap apart, and none is lost."""

from __future__ import annotations

import asyncio
import itertools

from controlplane.timing import PokeGap, Wake, Woke
from tests.support.fake_clock import FakeClock

GAP = 0.2


async def passes_under(pokes_every: float, seconds: float) -> list[float]:
    """Run a pass loop (each pass waits on the gap first) while a flood pokes; the (fake) times
    at which passes started."""
    clock = FakeClock()
    gap, woken, started = PokeGap(GAP, clock), Wake(clock), []

    async def flood() -> None:
        while clock.monotonic() < seconds:
            gap.poked = True
            woken.set()
            await clock.sleep(pokes_every)

    async def passes() -> None:
        while clock.monotonic() < seconds:
            if await woken.sleep(seconds - clock.monotonic()) is not Woke.WAKE:
                return  # the flood is over and every poke was answered
            await gap.spaced()
            woken.clear()  # as the sync loop does: the pokes of the gap are this pass's
            started.append(clock.monotonic())
            await asyncio.sleep(0)  # the pass itself

    both = asyncio.gather(flood(), passes())
    await clock.run_for(seconds + GAP)
    await both
    return started


def test_a_flood_of_pokes_gives_passes_a_gap_apart() -> None:
    started = asyncio.run(passes_under(pokes_every=0.001, seconds=1.0))
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert len(started) <= 1.0 / GAP + 1, started
    assert all(g >= GAP - 1e-9 for g in gaps), gaps  # fake time: exact, but for rounding
    assert len(started) >= 3, started  # spaced, not starved


def test_a_lone_poke_is_answered_at_once_and_one_during_the_gap_after_it() -> None:
    async def scenario() -> tuple[float, float]:
        clock = FakeClock()
        gap = PokeGap(GAP, clock)
        gap.poked = True
        await gap.spaced()  # the first: no wait
        first = clock.monotonic()
        gap.poked = True  # another right after: waits out the gap, is not dropped
        second = asyncio.ensure_future(gap.spaced())
        await clock.sleeping()
        await clock.step()
        await second
        assert not gap.poked
        return first, clock.monotonic()

    assert asyncio.run(scenario()) == (0.0, GAP)


def test_without_a_poke_nothing_waits() -> None:
    async def scenario() -> int:
        clock = FakeClock()
        gap = PokeGap(GAP, clock)
        gap.poked = True
        await gap.spaced()
        await gap.spaced()  # a pass for another reason (its own wake, the poll): at once
        return clock.sleepers()

    assert asyncio.run(scenario()) == 0
