"""Rolling updates on a GPU that does not give memory back, across a fleet behind HAProxy.

Each member's GPU stand-in follows what its Triton has loaded (16 GiB, 9 GiB a release: the
model fits once); a *leaking* one keeps an unloaded release's memory (``keep_unloaded``), as a
driver that never returned it would. Loading the new release there would run out of memory, so
the member must not: it stays out of rotation and the rollout stops at it, or, with
``memory.on_not_returned: restart-triton``, it restarts Triton (whose death frees what it held)
and goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.conftest import TritonFactory
from tests.support.fleet import Fleet, Member, running_fleet
from tests.support.polling import eventually
from tests.support.rolling_fleet import rolling_fleet, write_big_release
from tests.support.supervisor import TritonSupervisor
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton


def _steps(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["name"]: step for step in answer["operation"]["steps"]}


def _slot_ready(member: Member, model: str) -> list[str]:
    """The model's slots READY in ``member``'s Triton."""
    index = httpx.post(f"{member.triton.http_url}/v2/repository/index", json={}, timeout=10)
    return sorted(
        entry["name"]
        for entry in index.json()
        if entry["name"].startswith(f"{model}__") and entry.get("state") == "READY"
    )


def _stays_held(member: Member, model: str, *, seconds: float) -> None:
    """``member`` says it is held out of rotation for ``model`` at every look for ``seconds``."""
    series = f'controlplane_model_out_of_rotation{{model="{model}",reason="memory_not_returned"}}'
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        assert "memory_not_returned" in member.api.get("/readyz").text
        assert series in member.api.get("/metrics").text
        time.sleep(0.25)


@pytest.fixture
def fleet(
    pooled_tritons: Callable[[Path], RunningTriton], store: Path, tmp_path: Path
) -> Iterator[Fleet]:
    with running_fleet(
        pooled_tritons, store, tmp_path / "fleet", unique_model("leaking")
    ) as running:
        yield running


def test_memory_that_does_not_come_back_holds_that_member_out_and_the_rollout_stops_there(
    fleet: Fleet, store: Path, tmp_path: Path
) -> None:
    """m1 rolls to r2; m2 and m3 both leak, so whichever takes the next turn unloads r1, sees
    the memory stay taken, and stays out of rotation without loading anything; the other
    counts it as out and never leaves rotation, never unloads, and serves r1 on."""
    write_big_release(store, fleet.model, "r1", k=1.0)
    write_big_release(store, fleet.model, "r2", k=2.0)
    with rolling_fleet(fleet, tmp_path, 3) as rolling:
        first = rolling.deploy(rolling.members[0], "r1")
        assert first.status_code == 200, first.text
        rolling.haproxy.wait_until_up(timeout=30)
        for member in rolling.members[1:]:
            rolling.exporters[member.name].keep_unloaded = True
        with rolling.watched() as watch:
            rolling.start_deploy(rolling.members[0], "r2")

            def held() -> list[Member]:
                return [
                    m
                    for m in rolling.members[1:]
                    if "memory_not_returned" in m.api.get("/readyz").text
                ]

            eventually(lambda: len(held()) == 1, 120, "a leaking member held out of rotation")
            [stuck] = held()
            [other] = [m for m in rolling.members[1:] if m is not stuck]
            rolling.haproxy.wait_for_status(stuck.name, "DOWN", timeout=10)
            # Held, it does not try again (each try would drain and wait for the memory anew,
            # in and out of "draining"): over the fleet sync's first backoffs (2 s, 4 s) it
            # stays held, for /readyz as for the alert's series.
            _stays_held(stuck, rolling.model, seconds=8)
            # The other waits: one member out already (held), at most one at a time.
            watch.load.wait_for_answers(50)
            fleet_view = rolling.fleet.fleet()
        summary = watch.load.stop()

        assert summary.failures == (), summary.failures[:5]
        assert watch.rotation.max_out_at_once == 1, watch.rotation.timeline
        assert watch.rotation.left_rotation(other.name) == 0, watch.rotation.timeline
        assert other.answer(rolling.model) == 1.0
        assert len(_slot_ready(other, rolling.model)) == 1  # r1's slot, never unloaded
        assert _slot_ready(stuck, rolling.model) == []  # nothing loaded where memory is short
        assert rolling.members[0].answer(rolling.model) == 2.0

        # Said where operators look: the operation (with the figures), /readyz, the fleet.
        operations = stuck.api.get(f"/v1/operations?model={rolling.model}").json()["operations"]
        [failed] = [o for o in operations if o["status"] == "failed"]  # one try, no retries
        assert failed["error"]["code"] == "memory_not_returned", failed
        message = failed["error"]["message"]
        assert "the GPU memory r1 held did not come back" in message
        assert "GPU GPU-0 used 9.0 GiB before the unload and 9.0 GiB now" in message
        steps = {s["name"] for s in failed["steps"]}
        assert {"drain", "unload", "memory"} <= steps
        assert "load" not in steps
        view = stuck.api.get(f"/v1/models/{rolling.model}").json()
        assert view["out_of_rotation"]["reason"] == "memory_not_returned", view
        metrics = stuck.api.get("/metrics").text
        series = (
            f'controlplane_model_out_of_rotation{{model="{rolling.model}",'
            'reason="memory_not_returned"} 1.0'
        )
        assert series in metrics, [m for m in metrics.splitlines() if "out_of_rotation" in m]
        members = {m["member"]: m for m in fleet_view["members"]}
        assert "memory_not_returned" in str(members[stuck.name]["out_of_rotation"])
        assert members[other.name]["out_of_rotation"] is None


@pytest.fixture
def restartable(
    own_triton: TritonFactory,
    pooled_tritons: Callable[[Path], RunningTriton],
    store: Path,
    tmp_path: Path,
) -> Iterator[Fleet]:
    """Two members; the first one's Triton is started by the test (so it can be restarted),
    the second one's lent by the pool."""

    started: list[RunningTriton] = []

    def tritons(repository: Path) -> RunningTriton:
        triton = own_triton(repository) if not started else pooled_tritons(repository)
        started.append(triton)
        return triton

    with running_fleet(
        tritons,
        store,
        tmp_path / "fleet",
        unique_model("restart"),
    ) as running:
        yield running


def test_restart_triton_frees_the_memory_that_did_not_come_back_and_the_rollout_completes(
    restartable: Fleet, store: Path, tmp_path: Path, triton_cache: Path
) -> None:
    """m1's GPU leaks; with memory.on_not_returned: restart-triton, m1 stops its Triton (a
    supervisor, as the kubelet would, starts it again; the stand-in frees what the dead
    process held), loads r2 once the memory is back, and the rollout goes on to m2."""
    fleet = restartable
    write_big_release(store, fleet.model, "r1", k=1.0)
    write_big_release(store, fleet.model, "r2", k=2.0)
    env = {"CONTROLPLANE_MEMORY__ON_NOT_RETURNED": "restart-triton"}
    with rolling_fleet(fleet, tmp_path, 2, **env) as rolling:
        leaking = rolling.members[0]
        first = rolling.deploy(leaking, "r1")
        assert first.status_code == 200, first.text
        rolling.haproxy.wait_until_up(timeout=30)
        exporter = rolling.exporters[leaking.name]
        kubelet = TritonSupervisor(leaking.triton, triton_cache, on_exit=exporter.release_kept)
        with kubelet, rolling.watched() as watch:
            exporter.keep_unloaded = True
            answer = rolling.deploy(leaking, "r2")
            rolling.haproxy.wait_until_up(timeout=30)
            watch.load.wait_for_answers(20)

    assert answer.status_code == 200, answer.text
    assert kubelet.errors == []
    assert kubelet.restarts == 1
    memory = _steps(answer.json())["memory"]["detail"]
    assert memory["restart_triton"]["restarted"] is True, memory
    watch.assert_each_left_once(m.name for m in rolling.members)
    for member in rolling.members:
        assert member.answer(rolling.model) == 2.0
