"""A fleet of real Tritons, each with its daemon, converging on one desired state in a shared
directory store: a deploy through any member reaches every member, a release that fails on the
member that received it reaches none, and members that were down or are new catch up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TritonFactory
from tests.support.fleet import Fleet, running_fleet
from tests.support.inference import LoadGenerator
from tests.support.models import write_scale_release
from tests.support.polling import eventually

pytestmark = pytest.mark.triton
MODEL = "fleetmodel"


@pytest.fixture
def fleet(own_triton: TritonFactory, store: Path, tmp_path: Path) -> Iterator[Fleet]:
    with running_fleet(own_triton, store, tmp_path / "fleet") as running:
        yield running


def test_a_deploy_through_one_member_reaches_every_member(fleet: Fleet, store: Path) -> None:
    write_scale_release(store, MODEL, "r1", k=1.0)
    write_scale_release(store, MODEL, "r2", k=2.0)
    first, second, third = (fleet.add() for _ in range(3))

    answer = first.api.post(
        f"/v1/models/{MODEL}/deploy", {"release": "r1", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    states = {m["member"]: (m["release"], m["state"]) for m in answer.json()["fleet"]["members"]}
    assert states == {name: ("r1", "serving") for name in ("m1", "m2", "m3")}
    fleet.wait_serving(MODEL, "r1", 1.0)

    # Through another member, under client load on a third: no request fails anywhere.
    with LoadGenerator(third.triton.grpc_url, MODEL, clients=2) as load:
        load.wait_for_answers(5)
        answer = second.api.post(
            f"/v1/models/{MODEL}/deploy", {"release": "r2", "wait": True, "fleet": True}
        )
        assert answer.status_code == 200, answer.text
        load.wait_for_answers(5)
    assert [e for log in load.logs for e in log.errors] == []
    assert {a for log in load.logs for a in log.answers} == {1.0, 2.0}
    fleet.wait_serving(MODEL, "r2", 2.0)

    view = fleet.fleet(via=third)
    assert [m["member"] for m in view["members"]] == ["m1", "m2", "m3"]
    assert all(m["alive"] for m in view["members"])
    model = view["models"][MODEL]
    assert (model["desired"], model["converged"], model["phase"]) == ("r2", True, "complete")
    assert (model["set_by"], model["previous"]) == ("m2", "r1")
    # Each follower got there through its own operation, triggered by the fleet.
    operations = third.api.get(f"/v1/operations?model={MODEL}").json()["operations"]
    assert [(o["release"], o["trigger"], o["status"]) for o in operations][:2] == [
        ("r2", "fleet", "succeeded"),
        ("r1", "fleet", "succeeded"),
    ]


def test_a_release_that_fails_on_the_receiving_member_reaches_no_other(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, MODEL, "r1", k=1.0)
    write_scale_release(store, MODEL, "bad", k=3.0, fail_init=True)
    first, second = fleet.add(), fleet.add()
    assert first.api.deploy(MODEL, "r1").status_code == 200
    fleet.wait_serving(MODEL, "r1", 1.0)

    answer = second.api.post(
        f"/v1/models/{MODEL}/deploy", {"release": "bad", "wait": True, "fleet": True}
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "triton_load_failed"
    view = fleet.fleet()
    assert view["models"][MODEL]["desired"] == "r1"
    assert view["models"][MODEL]["generation"] == 1
    # Nothing moved: both members keep serving r1, and the first never tried the bad release.
    fleet.wait_serving(MODEL, "r1", 1.0)
    operations = first.api.get(f"/v1/operations?model={MODEL}").json()["operations"]
    assert [o["release"] for o in operations] == ["r1"]


def test_a_new_member_serves_the_desired_release_before_it_is_ready(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, MODEL, "r1", k=1.0, init_sleep=2.0)
    first = fleet.add()
    assert first.api.deploy(MODEL, "r1").status_code == 200

    late = fleet.add("late", wait_ready=False)
    eventually(lambda: _ready(late), 120, "the new member is ready", every=0.05)
    # Ready means it serves what the fleet does: it answers at once.
    assert late.answer(MODEL) == 1.0
    view = fleet.fleet(via=late)
    assert view["models"][MODEL]["converged"] is True


def _ready(member: object) -> bool:
    from tests.support.fleet import Member

    assert isinstance(member, Member)
    try:
        return member.api.get("/readyz").status_code == 200
    except Exception:
        return False
