"""Wakes from other members need no token, so a flood of them must not become a flood of store
reads: the passes that answer them start at least a gap apart, and none is lost."""

from __future__ import annotations

import asyncio
import itertools

from controlplane.services.fleet_sync import PokeGap

GAP = 0.2


async def passes_under(pokes_every: float, seconds: float) -> list[float]:
    """Run a pass loop (each pass waits on the gap first) while a flood pokes; the loop times
    at which passes started."""
    loop = asyncio.get_running_loop()
    gap, woken, started = PokeGap(GAP), asyncio.Event(), []
    end = loop.time() + seconds

    async def flood() -> None:
        while loop.time() < end:
            gap.poked = True
            woken.set()
            await asyncio.sleep(pokes_every)

    async def passes() -> None:
        while loop.time() < end:
            try:
                async with asyncio.timeout(end - loop.time()):
                    await woken.wait()
            except TimeoutError:
                return  # the flood is over and every poke was answered
            await gap.spaced()
            woken.clear()
            started.append(loop.time())
            await asyncio.sleep(0)  # the pass itself

    await asyncio.gather(flood(), passes())
    return started


def test_a_flood_of_pokes_gives_passes_a_gap_apart() -> None:
    started = asyncio.run(passes_under(pokes_every=0.001, seconds=1.0))
    gaps = [b - a for a, b in itertools.pairwise(started)]
    assert len(started) <= 1.0 / GAP + 1, started
    assert all(g >= GAP * 0.95 for g in gaps), gaps
    assert len(started) >= 3, started  # spaced, not starved


def test_a_lone_poke_is_answered_at_once_and_one_during_the_gap_after_it() -> None:
    async def scenario() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        gap = PokeGap(GAP)
        gap.poked = True
        t0 = loop.time()
        await gap.spaced()  # the first: no wait
        first = loop.time() - t0
        gap.poked = True  # another right after: waits out the gap, is not dropped
        await gap.spaced()
        second = loop.time() - t0
        assert not gap.poked
        return first, second

    first, second = asyncio.run(scenario())
    assert first < GAP / 2
    assert second >= GAP * 0.95


def test_without_a_poke_nothing_waits() -> None:
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        gap = PokeGap(GAP)
        gap.poked = True
        await gap.spaced()
        t0 = loop.time()
        await gap.spaced()  # a pass for another reason (its own wake, the poll): at once
        return loop.time() - t0

    assert asyncio.run(scenario()) < GAP / 2
