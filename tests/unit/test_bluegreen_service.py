"""DeployService under ``blue-green``: two slots behind an ensemble alias, on a fake Triton.

The real store, staging area and SQLite run on ``tmp_path``; only Triton and the metrics are
fakes, so these reach what a real server will not do on cue (a slot that answers wrong, an
alias that fails to re-point, requests that never drain). Each test asserts what a user would
see: the operation, its steps and error code, the slots, the alias's target, the repository and
the record. The invariant under test throughout: nothing touches the serving slot or the alias
before the switch, and a failed switch is pointed back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from functools import partial
from pathlib import Path

import pytest

from controlplane.adapters.staging.fs import ALIAS_MARKER, MARKER_NAME
from controlplane.adapters.triton.overrides import alias_target
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    Step,
    StepStatus,
    Trigger,
    Unchanged,
)
from controlplane.domain.slots import SlotState
from controlplane.domain.smoke import SmokeSample
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.services.deploy import DeployService
from tests.support.fakes import (
    FakeMetrics,
    FakeTriton,
    LoadFails,
    LoadHangs,
    Parts,
    deploy_service,
    make_reconciler,
    started,
    started_rollback,
)
from tests.support.models import write_scale_release, write_sha256sums
from tests.support.polling import until
from tests.support.service_views import publish, record

MODEL = "scale"
BLUE = "scale__blue"
GREEN = "scale__green"
DEPLOY_STEPS = [
    "resolve",
    "fetch",
    "verify",
    "check",
    "headroom",
    "place",
    "load",
    "preflight",
    "switch",
    "record",
]
BEFORE_PLACE = ["resolve", "fetch", "verify"]
WARM = 3600.0  # retire window longer than any test: the old slot stays loaded
SOON = 0.05  # retire window (fake time) that ends as soon as the test lets time pass
DEADLINE = 5.0


def blue_green(retire_after: float = WARM, drain_timeout: float = 1.0) -> TrafficPolicy:
    return TrafficPolicy(
        strategy=Strategy.BLUE_GREEN, retire_after=retire_after, drain_timeout=drain_timeout
    )


def bg_service(tmp_path: Path) -> AbstractAsyncContextManager[tuple[DeployService, Parts]]:
    """A blue-green DeployService with the default test policy and metrics nobody set."""
    return deploy_service(tmp_path, traffic=blue_green(), metrics=FakeMetrics())


class SmokeRecordingTriton(FakeTriton):
    """FakeTriton that also keeps the sample each smoke inference was given."""

    def __init__(self) -> None:
        super().__init__()
        self.samples: list[tuple[str, SmokeSample | None]] = []

    async def smoke(self, model: str, sample: SmokeSample | None) -> dict[str, list[float]]:
        self.samples.append((model, sample))
        return await super().smoke(model, sample)


# --- read-outs ----------------------------------------------------------------------------


async def slot_state(parts: Parts, name: str) -> tuple[SlotState, str | None]:
    """A slot's state and release; a slot never recorded is ABSENT."""
    found = await parts.repos.serving.get(MODEL)
    for slot in found.slots if found else ():
        if slot.name == name:
            return slot.state, slot.release
    return SlotState.ABSENT, None


def alias_points_at(parts: Parts) -> str | None:
    """The slot the last alias config handed to Triton targets."""
    return alias_target(parts.triton.configs[MODEL])


def slot_loads(parts: Parts) -> int:
    return parts.triton.called("load", BLUE) + parts.triton.called("load", GREEN)


def placed_release(parts: Parts, slot: str) -> str | None:
    marker = parts.staging.read_marker(slot)
    return None if marker is None else marker.release


def repository_dirs(parts: Parts) -> list[str]:
    return sorted(p.name for p in parts.repository.iterdir())


def staging_left(parts: Parts) -> list[str]:
    return sorted(p.name for p in parts.staging_path.iterdir())


def step_names(operation: Operation) -> list[str]:
    return [step.name for step in operation.steps]


def step(operation: Operation, name: str) -> Step:
    (found,) = (s for s in operation.steps if s.name == name)
    return found


def detail(operation: Operation, name: str) -> Mapping[str, object]:
    return step(operation, name).detail


def failed_with(operation: Operation, code: str) -> None:
    assert operation.status is OperationStatus.FAILED, operation
    assert operation.error is not None
    assert operation.error.code == code, operation.error


async def deploy_and_wait(service: DeployService, release: str) -> Operation:
    submitted = await started(service, MODEL, release, trigger=Trigger.API)
    return await service.wait(submitted.id)


async def deployed(service: DeployService, *releases: str) -> None:
    """Deploy ``releases`` in order, each one required to succeed."""
    for release in releases:
        op = await deploy_and_wait(service, release)
        assert op.status is OperationStatus.SUCCEEDED, op.error


async def retires(service: DeployService) -> list[Operation]:
    return [
        op for op in await service.list_operations(MODEL, 50) if op.kind is OperationKind.RETIRE
    ]


async def finished_retire(service: DeployService, parts: Parts) -> Operation:
    """The first retire operation, once it has finished and let go of the model (time
    passes meanwhile: the retire window, the drain)."""

    async def done() -> bool:
        finished = any(op.status.finished for op in await retires(service))
        return finished and parts.runner.holder(MODEL) is None

    async with parts.clock.autojump():
        await until(done, "a retire operation finished")
    (retired,) = (op for op in await retires(service) if op.status.finished)
    return retired


def republish(parts: Parts, release: str, edit: Callable[[Path], None]) -> None:
    """Publish ``release`` of the scale model changed by ``edit``, SHA256SUMS rewritten."""
    release_dir = write_scale_release(parts.store_path, MODEL, release, k=1.0)
    edit(release_dir)
    write_sha256sums(release_dir)


def append_to_config(text: str) -> Callable[[Path], None]:
    def edit(release_dir: Path) -> None:
        config = release_dir / "config.pbtxt"
        config.write_text(config.read_text(encoding="utf-8") + text, encoding="utf-8")

    return edit


def ship_smoke(text: str) -> Callable[[Path], None]:
    def edit(release_dir: Path) -> None:
        (release_dir / "smoke.json").write_text(text, encoding="utf-8")

    return edit


# --- deploy -------------------------------------------------------------------------------


def test_first_deploy_loads_blue_and_points_the_alias_at_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            write_scale_release(parts.store_path, MODEL, "r1", k=1.0, config_name="renamed-me")

            op = await deploy_and_wait(service, "r1")

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.kind is OperationKind.DEPLOY
            assert step_names(op) == DEPLOY_STEPS
            assert all(s.status is StepStatus.SUCCEEDED for s in op.steps)
            assert await slot_state(parts, BLUE) == (SlotState.ACTIVE, "r1")
            assert await slot_state(parts, GREEN) == (SlotState.ABSENT, None)
            # The alias: an empty version dir and the marker; Triton gets its config inline.
            assert repository_dirs(parts) == [MODEL, BLUE]
            assert (parts.repository / MODEL / "1").is_dir()
            assert (parts.repository / MODEL / ALIAS_MARKER).is_file()
            assert parts.staging.is_alias_dir(MODEL)
            # The slot: the release, renamed after the slot.
            assert (parts.repository / BLUE / MARKER_NAME).is_file()
            assert placed_release(parts, BLUE) == "r1"
            config = (parts.repository / BLUE / "config.pbtxt").read_text(encoding="utf-8")
            assert f'name: "{BLUE}"' in config
            assert "renamed-me" not in config
            assert (parts.repository / BLUE / "1" / "model.py").read_bytes() == (
                parts.store_path / MODEL / "r1" / "1" / "model.py"
            ).read_bytes()
            # Triton: the slot loaded from disk, then the alias with an override onto it.
            assert parts.triton.called("load", BLUE) == 1
            assert parts.triton.called("point_alias", MODEL) == 1
            assert parts.triton.configs[MODEL]["platform"] == "ensemble"
            assert alias_points_at(parts) == BLUE
            assert parts.triton.state(MODEL) == parts.triton.state(BLUE) == "READY"
            assert detail(op, "switch")["target"] == BLUE
            assert detail(op, "preflight")["smoke"] == "generated"
            assert detail(op, "preflight")["signature_changed"] is False
            assert (await record(parts)).active_release == "r1"
            assert (await record(parts)).previous_release is None
            assert staging_left(parts) == []
            assert parts.runner.holder(MODEL) is None
            assert await retires(service) == []

    asyncio.run(scenario())


def test_second_deploy_goes_to_green_and_keeps_blue_warm(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1")

            op = await deploy_and_wait(service, "r2")

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.from_release == "r1"
            assert step_names(op) == DEPLOY_STEPS
            assert await slot_state(parts, BLUE) == (SlotState.RETIRING, "r1")
            assert await slot_state(parts, GREEN) == (SlotState.ACTIVE, "r2")
            assert alias_points_at(parts) == GREEN
            assert placed_release(parts, GREEN) == "r2"
            assert placed_release(parts, BLUE) == "r1"  # still on disk, still loaded
            assert parts.triton.state(BLUE) == "READY"
            assert parts.triton.called("unload", BLUE) == 0
            assert (await record(parts)).active_release == "r2"
            assert (await record(parts)).previous_release == "r1"
            assert staging_left(parts) == []

    asyncio.run(scenario())


# --- rollback -----------------------------------------------------------------------------


def test_rollback_inside_the_retire_window_is_one_repoint(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1", "r2")
            loads_before = slot_loads(parts)
            alias_loads_before = parts.triton.called("point_alias", MODEL)

            submitted = await started_rollback(service, MODEL, to=None, trigger=Trigger.API)
            op = await service.wait(submitted.id)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.kind is OperationKind.ROLLBACK
            assert op.release == "r1"
            assert op.from_release == "r2"
            assert step_names(op) == ["switch", "record"]
            assert "repoint_ms" in detail(op, "switch")
            assert detail(op, "switch")["target"] == BLUE
            assert slot_loads(parts) == loads_before
            assert parts.triton.called("point_alias", MODEL) == alias_loads_before + 1
            assert alias_points_at(parts) == BLUE
            assert await slot_state(parts, BLUE) == (SlotState.ACTIVE, "r1")
            assert await slot_state(parts, GREEN) == (SlotState.RETIRING, "r2")
            assert (await record(parts)).active_release == "r1"
            assert (await record(parts)).previous_release == "r2"

    asyncio.run(scenario())


def test_rollback_after_the_retire_window_deploys_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(
            tmp_path, traffic=blue_green(retire_after=SOON), metrics=FakeMetrics()
        ) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1", "r2")
            await finished_retire(service, parts)

            submitted = await started_rollback(service, MODEL, to="r1", trigger=Trigger.API)
            op = await service.wait(submitted.id)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.kind is OperationKind.ROLLBACK
            assert step_names(op)[:3] == BEFORE_PLACE  # from the store again: no re-point
            assert step_names(op)[-7:] == DEPLOY_STEPS[3:]
            assert parts.triton.called("load", BLUE) == 2
            assert await slot_state(parts, BLUE) == (SlotState.ACTIVE, "r1")
            assert alias_points_at(parts) == BLUE
            assert (await record(parts)).active_release == "r1"

    asyncio.run(scenario())


# --- retire -------------------------------------------------------------------------------


def test_old_slot_is_retired_after_the_window(tmp_path: Path) -> None:
    async def scenario() -> None:
        metrics = FakeMetrics()
        async with deploy_service(
            tmp_path, traffic=blue_green(retire_after=SOON), metrics=metrics
        ) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1", "r2")

            op = await finished_retire(service, parts)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.trigger is Trigger.SCHEDULE
            assert op.release is None
            assert step_names(op) == ["drain", "unload"]
            assert detail(op, "drain") == {"slot": BLUE, "pending": 0, "timed_out": False}
            assert metrics.reads == [BLUE]
            assert parts.triton.called("unload", BLUE) == 1
            assert parts.triton.state(BLUE) == "UNAVAILABLE"
            assert await slot_state(parts, BLUE) == (SlotState.ABSENT, None)
            assert repository_dirs(parts) == [MODEL, GREEN]
            # Green serves on, untouched.
            assert await slot_state(parts, GREEN) == (SlotState.ACTIVE, "r2")
            assert alias_points_at(parts) == GREEN
            assert parts.triton.called("unload", GREEN) == 0
            assert (await record(parts)).active_release == "r2"
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


def test_drain_gives_up_at_its_timeout_and_unloads_anyway(tmp_path: Path) -> None:
    async def scenario() -> None:
        metrics = FakeMetrics()
        metrics.pending[BLUE] = 3
        drain_timeout = 1.0  # on the injected clock, which the test moves past it
        async with deploy_service(
            tmp_path,
            traffic=blue_green(retire_after=SOON, drain_timeout=drain_timeout),
            metrics=metrics,
        ) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1", "r2")
            await parts.clock.run_for(SOON)  # the retire window ends
            await until(lambda: BLUE in metrics.reads, "the drain read the pending gauge")
            await parts.clock.run_for(drain_timeout / 2)
            assert not any(op.status.finished for op in await retires(service))

            op = await finished_retire(service, parts)  # the drain's time runs out

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert detail(op, "drain") == {"slot": BLUE, "pending": 3, "timed_out": True}
            assert set(metrics.reads) == {BLUE}
            assert parts.triton.called("unload", BLUE) == 1
            assert await slot_state(parts, BLUE) == (SlotState.ABSENT, None)
            assert not (parts.repository / BLUE).exists()

    asyncio.run(scenario())


def test_a_deploy_during_a_retire_waits_for_it_instead_of_being_refused(tmp_path: Path) -> None:
    """Housekeeping must not fail a CI deploy: a tester's deploy got 409 while the daemon
    unloaded a retired slot (for as long as the drain and the unload took)."""

    async def scenario() -> None:
        metrics = FakeMetrics()
        metrics.pending[BLUE] = 3  # the retire drains until the test moves the clock
        async with deploy_service(
            tmp_path, traffic=blue_green(retire_after=SOON, drain_timeout=1.0), metrics=metrics
        ) as (service, parts):
            publish(parts, "r1", "r2", "r3")
            await deployed(service, "r1", "r2")
            await parts.clock.run_for(SOON)  # the retire window ends
            await until(lambda: BLUE in metrics.reads, "the retire draining the old slot")
            (retiring,) = await retires(service)
            assert parts.runner.holder(MODEL) == retiring.id

            deploy = asyncio.create_task(  # as the API asks: behind the daemon's housekeeping
                parts.client.start(
                    partial(service.deploy, MODEL, "r3", trigger=Trigger.API),
                    patience=service.behind_housekeeping(MODEL),
                )
            )
            await parts.clock.run_for(0.5)
            assert len(metrics.reads) >= 3  # the drain polled on
            assert not deploy.done()  # waiting behind the retire, not refused

            await parts.clock.run_for(0.6)  # the drain's second runs out
            async with asyncio.timeout(DEADLINE):
                submitted = await deploy
            assert not isinstance(submitted, Unchanged)
            op = await service.wait(submitted.id)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert (await service.get_operation(retiring.id)).status is OperationStatus.SUCCEEDED
            assert (await record(parts)).active_release == "r3"

    asyncio.run(scenario())


def test_third_deploy_frees_the_retiring_slot_first(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2", "r3")
            await deployed(service, "r1", "r2")
            assert await slot_state(parts, BLUE) == (SlotState.RETIRING, "r1")

            op = await deploy_and_wait(service, "r3")

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert step_names(op) == [*BEFORE_PLACE, "check", "free", *DEPLOY_STEPS[4:]]
            assert detail(op, "free") == {"slot": BLUE, "release": "r1"}
            assert parts.triton.called("unload", BLUE) == 1
            assert parts.triton.called("load", BLUE) == 2
            # The unload of r1 came before r3's load into the same slot.
            calls = parts.triton.calls
            assert calls.index(("unload", BLUE)) < len(calls) - calls[::-1].index(("load", BLUE))
            assert await slot_state(parts, BLUE) == (SlotState.ACTIVE, "r3")
            assert await slot_state(parts, GREEN) == (SlotState.RETIRING, "r2")
            assert placed_release(parts, BLUE) == "r3"
            assert alias_points_at(parts) == BLUE
            assert (await record(parts)).active_release == "r3"
            assert (await record(parts)).previous_release == "r2"
            assert staging_left(parts) == []

    asyncio.run(scenario())


# --- failures before the switch leave blue serving ----------------------------------------


async def assert_blue_serves_r1(parts: Parts) -> None:
    assert await slot_state(parts, BLUE) == (SlotState.ACTIVE, "r1")
    assert parts.triton.state(BLUE) == "READY"
    assert parts.triton.called("unload", BLUE) == 0
    assert placed_release(parts, BLUE) == "r1"
    assert alias_points_at(parts) == BLUE
    assert parts.triton.state(MODEL) == "READY"
    assert (await record(parts)).active_release == "r1"
    assert (await record(parts)).previous_release is None
    assert parts.runner.holder(MODEL) is None
    assert staging_left(parts) == []


def test_wrong_answer_in_preflight_takes_green_down(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1")
            alias_loads = parts.triton.called("point_alias", MODEL)
            parts.triton.smoke_failures[GREEN] = "wrong answer"

            op = await deploy_and_wait(service, "r2")

            failed_with(op, "preflight_failed")
            assert op.error is not None
            assert "wrong answer" in op.error.message
            assert step_names(op) == DEPLOY_STEPS[:8]
            assert step(op, "preflight").status is StepStatus.FAILED
            assert parts.triton.called("point_alias", MODEL) == alias_loads  # never re-pointed
            assert parts.triton.called("unload", GREEN) == 1
            assert parts.triton.state(GREEN) == "UNAVAILABLE"
            assert (await slot_state(parts, GREEN))[0] in (SlotState.UNAVAILABLE, SlotState.ABSENT)
            assert not (parts.repository / GREEN).exists()
            await assert_blue_serves_r1(parts)

    asyncio.run(scenario())


def test_green_that_fails_to_load_is_removed(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1")
            parts.triton.script_load(GREEN, LoadFails("initialize failed on purpose"))

            op = await deploy_and_wait(service, "r2")

            failed_with(op, "triton_load_failed")
            assert step_names(op) == DEPLOY_STEPS[:7]
            assert step(op, "load").status is StepStatus.FAILED
            assert parts.triton.called("point_alias", MODEL) == 1
            assert parts.triton.called("unload", GREEN) == 1
            assert (await slot_state(parts, GREEN))[0] in (SlotState.UNAVAILABLE, SlotState.ABSENT)
            assert repository_dirs(parts) == [MODEL, BLUE]
            await assert_blue_serves_r1(parts)

    asyncio.run(scenario())


def test_failed_repoint_is_pointed_back_at_blue(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1")
            parts.triton.script_load(MODEL, LoadFails("ensemble broken"))

            op = await deploy_and_wait(service, "r2")

            failed_with(op, "triton_load_failed")
            assert op.error is not None
            assert "ensemble broken" in op.error.message
            assert step_names(op) == DEPLOY_STEPS[:9]
            assert step(op, "switch").status is StepStatus.FAILED
            assert detail(op, "switch")["pointed_back_to"] == BLUE
            # First deploy, the failed re-point onto green, the point-back onto blue.
            assert parts.triton.called("point_alias", MODEL) == 3
            assert parts.triton.called("unload", GREEN) == 1
            assert (await slot_state(parts, GREEN))[0] in (SlotState.UNAVAILABLE, SlotState.ABSENT)
            assert not (parts.repository / GREEN).exists()
            await assert_blue_serves_r1(parts)

    asyncio.run(scenario())


def test_wrong_answer_through_the_alias_is_pointed_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1")
            parts.triton.smoke_failures[MODEL] = "alias answers wrong"

            op = await deploy_and_wait(service, "r2")

            failed_with(op, "preflight_failed")
            assert step(op, "switch").status is StepStatus.FAILED
            assert detail(op, "switch")["pointed_back_to"] == BLUE
            assert parts.triton.called("point_alias", MODEL) == 3
            assert not (parts.repository / GREEN).exists()
            await assert_blue_serves_r1(parts)

    asyncio.run(scenario())


# --- refused releases ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addition", "kind"),
    [
        ("model_transaction_policy { decoupled: true }\n", "decoupled"),
        ("sequence_batching { }\n", "sequence-batched"),
    ],
    ids=["decoupled", "sequence-batched"],
)
def test_release_an_alias_cannot_front_is_refused_before_placing(
    tmp_path: Path, addition: str, kind: str
) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            republish(parts, "r1", append_to_config(addition))

            op = await deploy_and_wait(service, "r1")

            failed_with(op, "strategy_unsupported")
            assert op.error is not None
            assert kind in op.error.message
            assert "inplace" in op.error.message
            assert not set(step_names(op)) & {"place", "load", "switch", "record"}
            assert repository_dirs(parts) == []
            assert [call for call in parts.triton.calls if call[0] == "load"] == []
            assert await slot_state(parts, BLUE) == (SlotState.ABSENT, None)
            assert staging_left(parts) == []
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


SMOKE = {
    "inputs": {"INPUT0": {"datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}},
    "expected": {"OUTPUT0": [1.0, 2.0]},
}


def test_shipped_smoke_sample_is_used_for_the_preflight(tmp_path: Path) -> None:
    async def scenario() -> None:
        triton = SmokeRecordingTriton()
        async with deploy_service(
            tmp_path, triton, traffic=blue_green(), metrics=FakeMetrics()
        ) as (service, parts):
            republish(parts, "r1", ship_smoke(json.dumps(SMOKE)))

            op = await deploy_and_wait(service, "r1")

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert detail(op, "preflight")["smoke"] == "smoke.json"
            # The same sample checks the slot, then the alias after the re-point.
            assert [model for model, _ in triton.samples] == [BLUE, MODEL]
            for _, sample in triton.samples:
                assert sample is not None
                assert sample.inputs["INPUT0"].data == (1.0, 2.0)
                assert sample.expected == {"OUTPUT0": (1.0, 2.0)}

    asyncio.run(scenario())


def test_malformed_smoke_sample_fails_the_deploy(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            republish(parts, "r2", ship_smoke('{"inputs": {"INPUT0": {"datatype": "FP32"'))
            await deployed(service, "r1")

            op = await deploy_and_wait(service, "r2")

            failed_with(op, "preflight_failed")
            assert op.error is not None
            assert "smoke.json" in op.error.message
            assert not set(step_names(op)) & {"place", "load", "switch", "record"}
            assert parts.triton.called("load", GREEN) == 0
            assert await slot_state(parts, GREEN) == (SlotState.ABSENT, None)
            assert repository_dirs(parts) == [MODEL, BLUE]
            await assert_blue_serves_r1(parts)

    asyncio.run(scenario())


# --- unload -------------------------------------------------------------------------------


def test_unload_takes_down_the_alias_and_both_slots(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2")
            await deployed(service, "r1", "r2")

            submitted = await service.unload(MODEL, trigger=Trigger.API)
            op = await service.wait(submitted.id)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert op.kind is OperationKind.UNLOAD
            for name in (MODEL, BLUE, GREEN):
                assert parts.triton.called("unload", name) == 1, name
                assert parts.triton.state(name) == "UNAVAILABLE", name
            assert repository_dirs(parts) == []
            assert await slot_state(parts, BLUE) == (SlotState.ABSENT, None)
            assert await slot_state(parts, GREEN) == (SlotState.ABSENT, None)
            assert (await record(parts)).active_release is None
            assert (await record(parts)).previous_release == "r2"
            assert staging_left(parts) == []
            assert parts.runner.holder(MODEL) is None

    asyncio.run(scenario())


# --- a load that never ends --------------------------------------------------------------------


def test_a_load_that_never_ends_is_abandoned_and_the_next_deploy_uses_a_spare_slot(
    tmp_path: Path,
) -> None:
    """Triton cannot stop an ``initialize()`` that never returns, and frees the name only when
    it restarts: the deploy ends at its timeout, and the next one loads into a spare."""

    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2", "r3")
            await deployed(service, "r1")
            parts.triton.script_load(GREEN, LoadHangs())

            hung = await deploy_and_wait(service, "r2")

            failed_with(hung, "triton_timeout")
            assert hung.error is not None
            assert f"Triton still holds {GREEN} LOADING" in hung.error.message
            assert parts.triton.called("abandon", GREEN) == 1
            assert parts.triton.state(GREEN) == "LOADING"  # nothing of Triton's was killed
            assert await slot_state(parts, GREEN) == (SlotState.FAILED, "r2")
            await assert_blue_serves_r1(parts)

            fixed = await deploy_and_wait(service, "r3")

            spare = f"{GREEN}-2"
            assert fixed.status is OperationStatus.SUCCEEDED, fixed.error
            assert detail(fixed, "place")["slot"] == spare
            assert alias_points_at(parts) == spare
            assert parts.triton.state(spare) == "READY"
            assert await slot_state(parts, spare) == (SlotState.ACTIVE, "r3")
            assert await slot_state(parts, BLUE) == (SlotState.RETIRING, "r1")
            assert (await record(parts)).active_release == "r3"
            assert placed_release(parts, spare) == "r3"

    asyncio.run(scenario())


def test_with_a_spare_slot_no_more_than_two_releases_are_ever_loaded(tmp_path: Path) -> None:
    """After a load that never ended the model has three slots. A tester saw all three loaded
    at once (one serving, two retiring): a deploy into the idle one must free the others."""

    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1", "r2", "r3", "r4")
            await deployed(service, "r1")
            parts.triton.script_load(GREEN, LoadHangs())
            failed_with(await deploy_and_wait(service, "r2"), "triton_timeout")
            await deployed(service, "r3")  # into the spare
            spare = f"{GREEN}-2"
            parts.triton.set_state(GREEN, "UNAVAILABLE", "Triton restarted")
            await make_reconciler(service, parts).run_pass()  # takes the failed slot down
            assert await slot_state(parts, GREEN) == (SlotState.ABSENT, None)
            assert await slot_state(parts, BLUE) == (SlotState.RETIRING, "r1")  # warm

            op = await deploy_and_wait(service, "r4")

            assert op.status is OperationStatus.SUCCEEDED, op.error
            assert detail(op, "place")["slot"] == GREEN
            assert detail(op, "free") == {"also": {BLUE: "r1"}}
            loaded = {n for n in (BLUE, GREEN, spare) if parts.triton.state(n) == "READY"}
            assert loaded == {GREEN, spare}
            assert await slot_state(parts, spare) == (SlotState.RETIRING, "r3")
            assert await slot_state(parts, BLUE) == (SlotState.ABSENT, None)
            assert alias_points_at(parts) == GREEN

    asyncio.run(scenario())


def test_an_unload_records_the_operation_s_own_trigger_not_reconcile(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with bg_service(tmp_path) as (service, parts):
            publish(parts, "r1")
            await deployed(service, "r1")

            op = await service.wait((await service.unload(MODEL, trigger=Trigger.CLI)).id)

            assert op.status is OperationStatus.SUCCEEDED, op.error
            blue = next(s for s in (await record(parts)).slots if s.name == BLUE)
            assert (blue.state, blue.trigger) == (SlotState.ABSENT, "cli")

    asyncio.run(scenario())


def test_keep_fallback_warm_never_retires_the_previous_release(tmp_path: Path) -> None:
    async def scenario() -> None:
        policy = TrafficPolicy(
            strategy=Strategy.BLUE_GREEN, retire_after=SOON, drain_timeout=1.0, keep_warm=True
        )
        async with deploy_service(tmp_path, traffic=policy, metrics=FakeMetrics()) as (
            service,
            parts,
        ):
            publish(parts, "r1", "r2")
            await deployed(service, "r1", "r2")
            await make_reconciler(service, parts).run_pass()  # nor does a reconcile beat

            assert not parts.bluegreen.retire_timers.scheduled(BLUE)  # no retire is even scheduled
            assert await retires(service) == []
            assert await slot_state(parts, BLUE) == (SlotState.RETIRING, "r1")
            assert parts.triton.state(BLUE) == "READY"
            op = await service.wait(
                (await started_rollback(service, MODEL, to=None, trigger=Trigger.API)).id
            )
            assert step_names(op) == ["switch", "record"]  # a re-point, no load

    asyncio.run(scenario())
