"""The overload watcher from samples to action, and the alert receiver from receipts to action.

The source is a scripted :class:`UtilizationSource` and time a :class:`FakeClock`, so each
scenario states exactly which sample arrived when; the rollback underneath is the real
:class:`AutoRollback` over a fake Triton.
"""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import UTC, datetime
from pathlib import Path

from controlplane.domain.alerts import Alert, AlertStatus, Receipt
from controlplane.domain.evaluator import Aggregate, EvaluatorConfig, Verdict
from controlplane.domain.operations import Trigger
from controlplane.domain.rollback import RollbackOutcome
from controlplane.services.alerts import AlertReceiver
from controlplane.services.overload import OverloadWatcher
from tests.support.polling import until
from tests.unit.test_auto_rollback import Rig, rig
from tests.unit.test_bluegreen_service import MODEL


class ScriptedSource:
    """Answers the queued readings in order; the last one repeats."""

    def __init__(self, *readings: dict[str, float] | None) -> None:
        self._readings: deque[dict[str, float] | None] = deque(readings)

    def then(self, *readings: dict[str, float] | None) -> None:
        self._readings.extend(readings)

    async def gpu_utilization(self) -> dict[str, float] | None:
        if len(self._readings) > 1:
            return self._readings.popleft()
        return self._readings[0]

    async def close(self) -> None:
        return None


def _watcher(r: Rig, source: ScriptedSource) -> OverloadWatcher:
    return OverloadWatcher(
        source=source,
        source_name="triton",
        rollback=r.rollback,
        clock=r.parts.clock,
        tasks=r.parts.tasks,
        config=EvaluatorConfig(threshold=0.95, window=10.0, interval=1.0),
        aggregate=Aggregate.ANY,
    )


async def _ticks(r: Rig, watcher: OverloadWatcher, seconds: int) -> list[Verdict]:
    verdicts = []
    for _ in range(seconds):
        verdicts.append((await watcher.tick()).verdict)
        r.parts.clock.advance(1.0)
    return verdicts


async def _settled(r: Rig) -> None:
    task = r.parts.tasks.get("overload-action")
    if task is not None:
        await task


def test_ten_seconds_above_the_line_rolls_back_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            watcher = _watcher(r, ScriptedSource({"gpu0": 0.99, "gpu1": 0.10}))

            verdicts = await _ticks(r, watcher, 11)
            await _settled(r)
            verdicts += await _ticks(r, watcher, 5)
            await _settled(r)

            assert Verdict.BREACH in verdicts
            assert verdicts.index(Verdict.BREACH) == 10  # the 11th sample covers 10 s
            last = await r.last()
            assert (last.trigger, last.outcome, last.to_release) == (
                Trigger.WATCHER,
                RollbackOutcome.FALLBACK,
                "r1",
            )
            assert "above 0.95 for 10 s" in last.reason
            assert (
                len(await r.parts.repos.operations.recent(MODEL, 50)) == 3
            )  # 2 deploys, 1 rollback

    asyncio.run(scenario())


def test_a_dip_at_second_nine_or_a_missing_reading_never_acts(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            high = {"gpu0": 0.99}
            source = ScriptedSource(*([high] * 9), {"gpu0": 0.50}, *([high] * 9), None, high)
            watcher = _watcher(r, source)

            verdicts = await _ticks(r, watcher, 21)
            await _settled(r)

            assert Verdict.BREACH not in verdicts
            assert verdicts[19] is Verdict.UNKNOWN  # the failed read holds
            view = watcher.view
            assert view is not None
            assert view.note == ""
            assert await r.parts.repos.rollbacks.last(MODEL) is None

    asyncio.run(scenario())


def test_a_source_without_gpus_is_unknown_and_says_why(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            watcher = _watcher(r, ScriptedSource({}))
            verdicts = await _ticks(r, watcher, 12)
            assert set(verdicts) == {Verdict.UNKNOWN}
            assert watcher.view is not None
            assert "no GPU" in watcher.view.note

    asyncio.run(scenario())


def _receiver(r: Rig) -> AlertReceiver:
    return AlertReceiver(
        book=r.parts.repos.alerts,
        rollback=r.rollback,
        clock=r.parts.clock,
        tasks=r.parts.tasks,
        model_label="model",
    )


def _alert(status: AlertStatus, **labels: str) -> Alert:
    return Alert(
        fingerprint="ab12",
        starts_at=datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
        status=status,
        labels={"alertname": "GpuOverload", **labels},
    )


def test_an_alert_acts_once_however_often_it_arrives(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            await r.serving_r2()
            receiver = _receiver(r)

            answers = await receiver.receive([_alert(AlertStatus.FIRING, model=MODEL)] * 3)
            answers += await receiver.receive([_alert(AlertStatus.RESOLVED, model=MODEL)])
            await until(lambda: _rolled_back(r), "the alert's rollback")

            assert [a.receipt for a in answers] == [
                Receipt.NEW,
                Receipt.DUPLICATE,
                Receipt.DUPLICATE,
                Receipt.RESOLVED,
            ]
            assert ((await r.last()).trigger, (await r.last()).to_release) == (Trigger.ALERT, "r1")
            kinds = [op.kind.value for op in await r.parts.repos.operations.recent(MODEL, 50)]
            assert kinds.count("rollback") == 1
            [stored] = await r.parts.repos.alerts.recent()
            assert (stored.alert.status, stored.receipts) == (AlertStatus.RESOLVED, 4)

    asyncio.run(scenario())


async def _rolled_back(r: Rig) -> bool:
    return await r.parts.repos.rollbacks.last(MODEL) is not None


def test_an_alert_naming_an_invalid_model_is_recorded_and_does_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with rig(tmp_path) as r:
            receiver = _receiver(r)
            [answer] = await receiver.receive([_alert(AlertStatus.FIRING, model="../etc")])
            assert answer.receipt is Receipt.NEW
            assert "nothing done" in answer.action
            assert await r.parts.repos.operations.recent(None, 50) == []
            assert len(await r.parts.repos.alerts.recent()) == 1

    asyncio.run(scenario())
