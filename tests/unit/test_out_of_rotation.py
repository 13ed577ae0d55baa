"""A member out of rotation says so everywhere an operator looks: the rotation's own state by
kind, ``/metrics`` (``controlplane_model_out_of_rotation``), ``GET /v1/models/{name}``
(``out_of_rotation``) and ``controlplane status`` (the status page's tag:
test_status_page.py).

A rolling update drains a model inside ``Rotation.out``; memory that does not come back ends
the block with :class:`MemoryNotReturned`, which holds the member out. The tests drive that
block directly (the rolling update's own path is in tests/integration/test_rolling_single.py)
and read what each surface shows, over the real database, store and staging with a fake
Triton.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.adapters.telemetry import PrometheusTelemetry
from controlplane.api.schemas.model import model_json
from controlplane.cli.status import model_lines
from controlplane.domain.errors import MemoryNotReturned
from controlplane.domain.rotation import OutReason
from controlplane.services.deploy import DeployService
from controlplane.services.figures import FigureReader
from controlplane.services.rotation import Rotation
from controlplane.services.status import StatusService
from tests.support.fake_clock import FakeClock
from tests.support.fakes import (
    Parts,
    deploy_service,
    release_watcher,
    started,
    status_service,
)
from tests.support.models import write_scale_release

FAMILY = "controlplane_model_out_of_rotation"
WHY = "the GPU memory r1 held did not come back within 60 s of its unload"


def _hold(rotation: Rotation, model: str) -> None:
    """A rolling update of ``model`` that stops with ``memory_not_returned``."""
    with pytest.raises(MemoryNotReturned), rotation.out(model):
        raise MemoryNotReturned(WHY)


# --- the rotation ----------------------------------------------------------------------------


def test_a_rolling_update_is_out_as_draining_and_back_in_when_it_ends() -> None:
    rotation = Rotation()

    with rotation.out("m"):
        during = (rotation.kinds(), _reason(rotation, "m"), rotation.held("m"))

    assert during == ({"m": OutReason.DRAINING}, "draining m", None)
    assert (rotation.kinds(), _reason(rotation, "m"), rotation.why_out()) == ({}, None, None)


def test_a_member_back_in_rotation_tells_the_fleet_it_rejoins_for_the_balancers_time() -> None:
    """Back from a drain, or ready after a start (a member killed mid-update comes back that
    way): the fleet still counts it out for rejoin_seconds, the balancer's time to send it
    requests again, so that the next member does not leave meanwhile."""
    clock = FakeClock()
    ready = asyncio.Event()
    rotation = Rotation(ready, clock=clock, rejoin_seconds=1.5)

    starting = rotation.why_out()
    ready.set()
    seen = [rotation.why_out()]
    clock.advance(1.4)
    seen.append(rotation.why_out())
    clock.advance(0.2)
    seen.append(rotation.why_out())
    with rotation.out("m"):
        seen.append(rotation.why_out())
    clock.advance(1.0)
    seen.append(rotation.why_out())
    clock.advance(1.0)
    seen.append(rotation.why_out())

    assert starting == "starting"
    assert seen == ["rejoining", "rejoining", None, "draining m", "rejoining", None]


def test_memory_not_returned_holds_the_member_out_until_a_later_deploy_succeeds() -> None:
    rotation = Rotation()

    _hold(rotation, "m")
    with rotation.out("other"):
        both = rotation.kinds()
    rotation.release("other")  # a deploy of another model does not end the hold on m
    held = (rotation.kinds(), _reason(rotation, "m"), rotation.held("m"))
    rotation.release("m")

    assert both == {"m": OutReason.MEMORY_NOT_RETURNED, "other": OutReason.DRAINING}
    assert held == (
        {"m": OutReason.MEMORY_NOT_RETURNED},
        f"memory_not_returned: {WHY}",
        f"memory_not_returned: {WHY}",
    )
    assert (rotation.kinds(), _reason(rotation, "m"), rotation.why_out()) == ({}, None, None)


def test_any_other_failure_brings_the_member_back_at_once() -> None:
    rotation = Rotation()

    with pytest.raises(RuntimeError), rotation.out("m"):
        raise RuntimeError("the load failed; the old release was restored")

    assert rotation.kinds() == {}


# --- /metrics --------------------------------------------------------------------------------


def _reader(parts: Parts) -> FigureReader:
    return FigureReader(
        serving=parts.repos.serving,
        rollbacks=parts.repos.rollbacks,
        triton=parts.triton,
        clock=parts.clock,
        last_pass=lambda: None,
        jobs=dict,
        rotation=parts.rotation,
    )


async def _scrape(reader: FigureReader) -> str:
    telemetry = PrometheusTelemetry()
    body, _ = telemetry.render(await reader.gather())
    return body.decode()


def _samples(text: str) -> dict[tuple[str, str], float]:
    """(model, reason) -> value of the family's samples in a scrape's text."""
    [family] = [f for f in text_string_to_metric_families(text) if f.name == FAMILY]
    return {(s.labels["model"], s.labels["reason"]): s.value for s in family.samples}


async def _serving(service: DeployService, parts: Parts, *models: str) -> None:
    for model in models:
        write_scale_release(parts.store_path, model, "r1", k=1.0)
        await service.wait((await started(service, model, "r1")).id)


def test_metrics_show_each_model_that_keeps_the_member_out_and_why(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            await _serving(service, parts, "m", "n")
            reader = _reader(parts)
            before = await _scrape(reader)
            with parts.rotation.out("m"):
                draining = await _scrape(reader)
            _hold(parts.rotation, "m")
            held = await _scrape(reader)
            parts.rotation.release("m")  # a later deploy of m succeeded
            after = await _scrape(reader)

            assert f"# HELP {FAMILY} " in before  # documented even with no sample
            assert f"# TYPE {FAMILY} gauge" in before
            assert _samples(before) == {}
            assert _samples(draining) == {("m", "draining"): 1.0}
            assert _samples(held) == {("m", "memory_not_returned"): 1.0}
            assert _samples(after) == {}

    asyncio.run(scenario())


# --- GET /v1/models/{name}, controlplane status ------------------------------------------------


async def _status(service: DeployService, parts: Parts) -> StatusService:
    """Status as the daemon wires it: the reconcile loop's drift, the rotation, and the
    watcher's catalog (so a list is built again only when what it shows changed)."""
    watcher = release_watcher(service, parts)
    await watcher.scan()
    return status_service(
        service,
        parts,
        drift=parts.reconciler.drift_of,
        out_of_rotation=parts.rotation.out_of,
        catalog=watcher.catalog,
    )


def test_a_held_model_says_why_in_status_and_the_cli_does_not_promise_a_repair(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            await _serving(service, parts, "m")
            status = await _status(service, parts)
            _hold(parts.rotation, "m")
            await parts.triton.unload("m")  # the rolling update had unloaded it
            await parts.reconciler.run_pass()  # leaves a held model alone

            answer = model_json(await status.get_model("m"))
            lines = model_lines(answer)
            [listed] = (await status.list_models()).models

            assert answer["out_of_rotation"] == {
                "reason": "memory_not_returned",
                "message": f"memory_not_returned: {WHY}",
            }
            assert listed.out_of_rotation == parts.rotation.out_of("m")
            assert f"  rotation:  out: memory_not_returned: {WHY}" in lines
            [drift] = [line for line in lines if line.startswith("  drift:")]
            assert drift == f"  drift:     not repaired: memory_not_returned: {WHY}"

    asyncio.run(scenario())


def test_a_member_in_rotation_shows_no_rotation_line_and_a_drift_the_loop_repairs(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path) as (service, parts):
            await _serving(service, parts, "m")
            status = await _status(service, parts)
            _hold(parts.rotation, "m")
            held = await status.list_models()  # a page of views is kept while nothing changes
            parts.rotation.release("m")  # a later deploy of m succeeded
            back = await status.list_models()
            await parts.triton.unload("m")  # Triton lost it: the loop repairs that
            await parts.reconciler.run_pass(wait=False)

            lines = model_lines(model_json(await status.get_model("m")))

            assert held.models[0].out_of_rotation is not None
            assert back.models[0].out_of_rotation is None
            assert not [line for line in lines if line.startswith("  rotation:")]
            [drift] = [line for line in lines if line.startswith("  drift:")]
            assert drift.endswith("(the reconcile loop repairs it)")

    asyncio.run(scenario())


def _reason(rotation: Rotation, model: str) -> str | None:
    out = rotation.out_of(model)
    return None if out is None else out.reason
