"""The status page's data, from a watcher that sees a held overload to the rollback it marks:
the GPU history the watcher keeps (wall-clock times, a bounded span), the rollback records of
that span, and a daemon outside a fleet showing its own record as what should serve.

The rollback underneath is the real :class:`AutoRollback` over a fake Triton and a real SQLite
journal; the source is scripted and time a :class:`FakeClock`.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

from controlplane.api.page.render import content
from controlplane.domain.operations import Trigger
from controlplane.domain.rollback import RollbackOutcome, RollbackRecord
from controlplane.services.overload import HISTORY_POINTS, HISTORY_SECONDS, OverloadWatcher
from controlplane.services.overview import OverviewService
from tests.support.fakes import START, status_service
from tests.unit.test_auto_rollback import Rig, rig
from tests.unit.test_overload_watcher import ScriptedSource, _settled, _ticks, _watcher


def _overview(r: Rig, source: ScriptedSource) -> tuple[OverviewService, OverloadWatcher]:
    watcher = _watcher(r, source)
    status = status_service(r.service, r.parts)
    service = OverviewService(
        status=status,
        journal=r.parts.repos.operations,
        rollbacks=r.parts.repos.rollbacks,
        clock=r.parts.clock,
        overload=watcher,
        source="triton",
    )
    return service, watcher


def test_a_held_overload_is_on_the_plot_with_its_rollback(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            source = ScriptedSource(*([{"gpu0": 0.30}] * 5), {"gpu0": 0.99})
            overview, watcher = _overview(r, source)
            await _ticks(r, watcher, 5)
            await _ticks(r, watcher, 11)
            await _settled(r)

            seen = await overview.overview()

            [model] = seen.models
            assert (model.desired, model.desired_by, model.view.active_release) == (
                "r1",
                "member",
                "r1",
            )
            assert [(m.member, m.release) for m in model.members] == [("this daemon", "r1")]
            assert [latch.release for latch in model.latches] == ["r2"]
            assert [(op.kind.value, op.release) for op in model.operations] == [
                ("rollback", "r1"),
                ("deploy", "r2"),
                ("deploy", "r1"),
            ]
            [rollback] = model.rollbacks
            assert (rollback.trigger, rollback.to_release) == (Trigger.WATCHER, "r1")
            values = [point.value for point in seen.gpu.points]
            assert values == [0.30] * 5 + [0.99] * 11
            assert seen.gpu.threshold == 0.95
            assert seen.gpu.points[0].at == START + timedelta(seconds=0)
            assert seen.gpu.since <= rollback.at <= seen.gpu.until
            assert 'data-rollbacks="1"' in content(seen)
            assert 'data-samples="16"' in content(seen)

    asyncio.run(scenario())


def test_the_history_keeps_its_span_and_its_bound(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            overview, watcher = _overview(r, ScriptedSource({"gpu0": 0.5}))
            for _ in range(HISTORY_POINTS + 10):  # faster than any interval would sample
                await watcher.tick()
                r.parts.clock.advance(0.01)
            assert len(watcher.history()) == HISTORY_POINTS

            r.parts.clock.advance(HISTORY_SECONDS - 1)
            await watcher.tick()
            kept = watcher.history()
            assert kept[0].at >= r.parts.clock.now() - timedelta(seconds=HISTORY_SECONDS)
            assert len(kept) < HISTORY_POINTS

            r.parts.clock.advance(HISTORY_SECONDS + 1)
            assert watcher.history() == ()
            seen = await overview.overview()
            assert not seen.gpu.sampled
            assert seen.gpu.until - seen.gpu.since == timedelta(seconds=HISTORY_SECONDS)

    asyncio.run(scenario())


def test_a_source_without_gpus_leaves_the_plot_empty_and_says_why(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            overview, watcher = _overview(r, ScriptedSource({}))
            await _ticks(r, watcher, 3)

            seen = await overview.overview()

            assert [p.value for p in seen.gpu.points] == [None, None, None]
            assert not seen.gpu.sampled
            assert "no GPU" in seen.gpu.note
            assert seen.gpu.until - seen.gpu.since == timedelta(seconds=60)  # a minute at least
            assert "no GPU samples" in content(seen)

    asyncio.run(scenario())


def test_the_rollback_book_answers_the_rollbacks_since_a_time(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            book = r.parts.repos.rollbacks
            for minutes, model in ((1, "a"), (3, "b"), (5, "a"), (7, "c")):
                await book.save(
                    RollbackRecord(
                        id=f"rb{minutes}",
                        model=model,
                        at=START + timedelta(minutes=minutes),
                        trigger=Trigger.ALERT,
                        reason="test",
                        from_release="r2",
                        to_release="r1",
                        outcome=RollbackOutcome.FALLBACK,
                    )
                )

            found = await book.since(START + timedelta(minutes=3))
            assert [(x.id, x.model) for x in found] == [("rb3", "b"), ("rb5", "a"), ("rb7", "c")]
            newest = await book.since(START, limit=2)
            assert [x.id for x in newest] == ["rb5", "rb7"]  # the newest two, oldest first

    asyncio.run(scenario())


def test_operations_are_read_again_only_after_the_journal_saved_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            overview, _ = _overview(r, ScriptedSource({"gpu0": 0.1}))
            first = await overview.overview()
            again = await overview.overview()
            assert again.models[0].operations is first.models[0].operations

            await r.deploy("r1")
            moved = await overview.overview()
            assert moved.models[0].operations[0].release == "r1"
            assert len(moved.models[0].operations) == 3  # the last three, newest first

    asyncio.run(scenario())
