"""Rolling updates across a fleet of real Tritons behind a real load balancer (Debian's HAProxy).

The model fits once in each member's GPU (a stand-in exporter whose used memory follows what
that member's Triton has loaded: 16 GiB, 9 GiB a release), so ``auto`` rolls: one member out of
rotation at a time, drained, unloaded, loaded, back. Clients call the model through HAProxy all
along; what they see (failed calls, which release answered) and what HAProxy saw (who was out
of rotation, read from its stats socket) are what the tests check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.support.fleet import Fleet, Member, running_fleet
from tests.support.gpu_exporter import GIB
from tests.support.polling import eventually
from tests.support.rolling_fleet import GPU, RollingFleet, rolling_fleet, write_big_release
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton


@pytest.fixture
def fleet(
    pooled_tritons: Callable[[Path], RunningTriton], store: Path, tmp_path: Path
) -> Iterator[Fleet]:
    with running_fleet(
        pooled_tritons, store, tmp_path / "fleet", unique_model("rolling")
    ) as running:
        yield running


@pytest.fixture
def rolling(fleet: Fleet, store: Path, tmp_path: Path) -> Iterator[RollingFleet]:
    """Three members serving r1 (answers 1x; r2, 2x, in the store too), behind HAProxy,
    every member up."""
    write_big_release(store, fleet.model, "r1", k=1.0)
    write_big_release(store, fleet.model, "r2", k=2.0)
    with rolling_fleet(fleet, tmp_path, 3) as running:
        first = running.deploy(running.members[0], "r1")
        assert first.status_code == 200, first.text
        running.haproxy.wait_until_up(timeout=30)
        yield running


def _steps(answer: dict[str, Any]) -> list[str]:
    return [step["name"] for step in answer["operation"]["steps"]]


def test_a_rolling_rollout_takes_one_member_out_at_a_time_and_no_call_fails(
    rolling: RollingFleet,
) -> None:
    with rolling.watched() as watch:
        answer = rolling.deploy(rolling.members[1], "r2")
        assert answer.status_code == 200, answer.text
        rolling.haproxy.wait_until_up(timeout=30)
        watch.load.wait_for_answers(20)
    summary = watch.load.stop()

    watch.assert_each_left_once(m.name for m in rolling.members)
    for member in rolling.members:
        assert member.answer(rolling.model) == 2.0
    # Through the member that received it: it rolled first, said why, and took a turn.
    steps = _steps(answer.json())
    assert steps.index("fetch") < steps.index("drain") < steps.index("unload") < steps.index("load")
    headroom = next(s for s in answer.json()["operation"]["steps"] if s["name"] == "headroom")
    assert headroom["detail"]["strategy"] == "rolling"
    # Each member says how long each phase of its turn took.
    for member in answer.json()["fleet"]["members"]:
        rolled = member["rolling"]
        assert rolled is not None, member
        assert rolled["phase"] is None
        assert set(rolled["took"]) >= {"turn", "drain", "unload", "memory", "load"}, rolled
        assert rolled["took"]["drain"] >= 1.5  # rollout.unready_seconds, for HAProxy to notice
    assert summary.answers[1.0] > 0
    assert summary.answers[2.0] > 0
    wanted = rolling.fleet.fleet()["models"][rolling.model]
    assert wanted["turns"] == []  # every turn given back


def test_a_release_that_fails_to_load_goes_back_to_the_previous_on_that_member_only(
    rolling: RollingFleet, store: Path
) -> None:
    write_big_release(store, rolling.model, "bad", k=3.0, fail_init=True)
    through = rolling.members[0]
    with rolling.watched() as watch:
        answer = rolling.deploy(through, "bad")
        eventually(lambda: through.api.get("/readyz").status_code == 200, 30, "back in rotation")
        rolling.haproxy.wait_until_up(timeout=30)
        watch.load.wait_for_answers(20)
    summary = watch.load.stop()

    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "triton_load_failed"
    steps = _steps(answer.json())
    assert "restore" in steps
    assert summary.failures == (), summary.failures[:5]
    assert watch.rotation.left_rotation(through.name) == 1, watch.rotation.timeline
    for member in rolling.members[1:]:
        assert watch.rotation.left_rotation(member.name) == 0, watch.rotation.timeline
    for member in rolling.members:
        assert member.answer(rolling.model) == 1.0
    wanted = rolling.fleet.fleet()["models"][rolling.model]
    assert wanted["desired"] == "r1"  # the desired state did not move
    assert wanted["turns"] == []


def test_auto_updates_a_model_that_fits_twice_blue_green_with_no_member_leaving_rotation(
    fleet: Fleet, store: Path, tmp_path: Path
) -> None:
    write_big_release(store, fleet.model, "r1", k=1.0, hint=4 * GIB)
    write_big_release(store, fleet.model, "r2", k=2.0, hint=4 * GIB)
    with rolling_fleet(fleet, tmp_path, 2) as rolling:
        first = rolling.deploy(rolling.members[0], "r1")
        assert first.status_code == 200, first.text
        rolling.haproxy.wait_until_up(timeout=30)
        with rolling.watched() as watch:
            answer = rolling.deploy(rolling.members[0], "r2")
            assert answer.status_code == 200, answer.text
            watch.load.wait_for_answers(20)
        summary = watch.load.stop()

        assert summary.failures == (), summary.failures[:5]
        assert watch.rotation.max_out_at_once == 0, watch.rotation.timeline
        headroom = next(s for s in answer.json()["operation"]["steps"] if s["name"] == "headroom")
        assert headroom["detail"]["strategy"] == "blue-green"
        assert "drain" not in _steps(answer.json())
        for member in rolling.members:
            assert member.answer(rolling.model) == 2.0
        assert summary.answers[2.0] > 0


@pytest.mark.parametrize("trigger", ["watcher", "api"])
def test_a_rollback_of_a_rolling_model_takes_every_member_back_one_at_a_time(
    fleet: Fleet, store: Path, tmp_path: Path, trigger: str
) -> None:
    """r2 rolled out everywhere; then one member's GPU runs at 0.99 (the overload watcher
    rolls it back, and the fleet follows: rollback.scope fleet), or a person rolls back
    through one member: every member goes back to r1 one turn at a time, 0 failed calls."""
    write_big_release(store, fleet.model, "r1", k=1.0)
    write_big_release(store, fleet.model, "r2", k=2.0)
    overload = {
        "CONTROLPLANE_ROLLBACK__WINDOW_SECONDS": "2",
        "CONTROLPLANE_ROLLBACK__INTERVAL_SECONDS": "0.5",
    }
    with rolling_fleet(fleet, tmp_path, 3, **overload) as rolling:
        for release in ("r1", "r2"):
            answer = rolling.deploy(rolling.members[0], release)
            assert answer.status_code == 200, answer.text
        rolling.haproxy.wait_until_up(timeout=30)
        overloaded = rolling.members[1]
        with rolling.watched() as watch:
            if trigger == "watcher":
                rolling.exporters[overloaded.name].set(**{GPU: 0.99})
            else:
                with overloaded.api.client() as client:
                    asked = client.post(
                        f"/v1/models/{rolling.model}/rollback",
                        json={"wait": True, "fleet": True, "reason": "a person"},
                    )
                assert asked.status_code == 200, asked.text
            rolling.fleet.wait_serving(rolling.model, "r1", 1.0, timeout=180)
            eventually(
                lambda: rolling.fleet.fleet()["models"][rolling.model]["turns"] == [], 30, "turns"
            )
            rolling.haproxy.wait_until_up(timeout=30)
            watch.load.wait_for_answers(20)

        watch.assert_each_left_once(m.name for m in rolling.members)
        assert rolling.fleet.fleet()["models"][rolling.model]["desired"] == "r1"
        view = overloaded.api.get(f"/v1/models/{rolling.model}").json()
        assert [d["release"] for d in view["rollback"]["degraded"]] == ["r2"]
        if trigger == "watcher":
            last = view["rollback"]["last"]
            assert (last["outcome"], last["to_release"]) == ("fallback", "r1"), last
            budget = last["detail"]["fallback_budget"]
            assert budget["kind"] == "rolling", budget  # a load and the rolling waits


def _running_step(member: Member, model: str) -> str | None:
    """The step ``member`` runs now in an operation on ``model`` (None: none runs)."""
    if member.daemon is None or member.daemon.process.poll() is not None:
        return None
    try:
        listed = member.api.get(f"/v1/operations?model={model}").json()["operations"]
    except Exception:  # the daemon between two states
        return None
    for operation in listed:
        if operation["status"] == "running" and operation["steps"]:
            last = operation["steps"][-1]
            if last["finished_at"] is None:
                return str(last["name"])
    return None


@pytest.mark.parametrize("phase", ["drain", "load"])
def test_a_member_killed_during_its_turn_converges_and_no_second_member_leaves(
    rolling: RollingFleet, phase: str
) -> None:
    followers = rolling.members[1:]
    with rolling.watched() as watch:
        rolling.start_deploy(rolling.members[0], "r2")

        found: list[Member] = []

        def in_phase() -> bool:
            found.extend(m for m in followers if _running_step(m, rolling.model) == phase)
            return bool(found)

        eventually(in_phase, 90, f"a follower in its {phase} step", every=0.05)
        victim = found[0]
        victim.api.kill()
        rolling.restart(victim)
        rolling.fleet.wait_serving(rolling.model, "r2", 2.0, timeout=120)
        rolling.haproxy.wait_until_up(timeout=30)
        watch.load.wait_for_answers(20)
    summary = watch.load.stop()

    assert summary.failures == (), summary.failures[:5]
    assert watch.rotation.max_out_at_once == 1, watch.rotation.timeline
    # The turn the killed process held was given up: none is left once all serve r2.
    eventually(
        lambda: rolling.fleet.fleet()["models"][rolling.model]["turns"] == [], 30, "turns back"
    )
    members = {m["member"]: m for m in rolling.fleet.fleet()["members"]}
    assert members[victim.name]["out_of_rotation"] is None
