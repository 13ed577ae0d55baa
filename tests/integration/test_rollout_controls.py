"""Rollout controls on a fleet of three real Tritons with a canary, all through the CLI with
``-o json``: a pause holds (no member moves for longer than the bake), resume lets it complete,
promote ends a bake of no set length at once, abort brings the canary back while the others
never moved, and the aborted release can be deployed again.

One fleet serves the module (starting three daemons is the slow part); each test has a model of
its own, with its own rollout policy.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.test_cli import cli, document
from tests.integration.test_metrics import gauge, shows
from tests.support.fleet import Fleet, Member, running_fleet
from tests.support.models import write_scale_release
from tests.support.polling import eventually, throughout
from tests.support.triton_pool import TritonPool, unique_model

pytestmark = pytest.mark.triton

BAKE = 8.0  # the timed bake: long enough for a CLI call to pause it on a busy machine


@dataclass
class Models:
    timed: str  # bake_seconds: BAKE
    untimed: str  # bake_seconds: null, for promote
    aborted: str  # bake_seconds: null, for abort


def _config(models: Models) -> str:
    def policy(bake: str) -> str:
        return (
            "    retire_after_seconds: 600\n"  # the old slot stays warm: back in one re-point
            "    drain_timeout_seconds: 5\n"
            f"    rollout: {{canary_members: 1, bake_seconds: {bake}}}\n"
        )

    return (
        "models:\n"
        f"  {models.timed}:\n{policy(str(BAKE))}"
        f"  {models.untimed}:\n{policy('null')}"
        f"  {models.aborted}:\n{policy('null')}"
    )


@pytest.fixture(scope="module")
def models() -> Models:
    return Models(unique_model("timed"), unique_model("untimed"), unique_model("aborted"))


@pytest.fixture(scope="module")
def fleet(
    triton_pool: TritonPool, tmp_path_factory: pytest.TempPathFactory, models: Models
) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("rollout-controls")
    store = root / "store"
    store.mkdir()
    lent: list[RunningTriton] = []

    def lend(_unused_repository: Path) -> RunningTriton:
        lent.append(triton_pool.lend())
        return lent[-1]

    try:
        with running_fleet(
            lend, store, root / "fleet", models.timed, config=_config(models)
        ) as running:
            for name in ("m1", "m2", "m3"):
                running.add(name)
            yield running
    finally:
        triton_pool.give_back(lent)


def _first_release_everywhere(fleet: Fleet, model: str) -> None:
    """r1 (answers 1.0) on every member, r2 (answers 2.0) published beside it."""
    write_scale_release(fleet.store, model, "r1", k=1.0)
    write_scale_release(fleet.store, model, "r2", k=2.0)
    assert fleet.members[0].api.deploy(model, "r1").status_code == 200
    fleet.wait_serving(model, "r1", 1.0)


def _rollout(
    member: Member, control: str, model: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    return cli(member.api.url, "rollout", control, model, *extra, "-o", "json")


def _view(fleet: Fleet, model: str) -> dict[str, Any]:
    """``model`` across the fleet: its desired state and {member: its state of it}."""
    data = fleet.fleet()
    wanted: dict[str, Any] = data["models"][model]
    wanted["members"] = {
        m["member"]: m["models"].get(model, {}) for m in data["members"] if m["alive"]
    }
    return wanted


def _serves(fleet: Fleet, model: str) -> dict[str, str | None]:
    return {name: state.get("release") for name, state in _view(fleet, model)["members"].items()}


def _releases_seen(member: Member, model: str) -> set[str]:
    operations = member.api.get(f"/v1/operations?model={model}&limit=50").json()["operations"]
    return {o["release"] for o in operations if o["release"]}


def test_a_pause_holds_every_member_past_the_bake_and_resume_lets_it_complete(
    fleet: Fleet, models: Models
) -> None:
    model = models.timed
    m1, m2, m3 = fleet.members
    _first_release_everywhere(fleet, model)
    assert m2.api.deploy(model, "r2").status_code == 200  # m2 goes first: the canary

    paused = _rollout(m1, "pause", model, "--reason", "p99 up on the canary")

    assert paused.returncode == 0, paused.stderr
    answer = document(paused)
    assert answer["paused"]["by"] == "cli through m1"
    assert answer["paused"]["reason"] == "p99 up on the canary"
    assert answer["phase"] in ("canary", "baking"), answer  # not complete: paused in time
    phase = answer["phase"]

    # Longer than the whole bake: nobody moves and the rollout stays where it stood.
    def held() -> bool:
        view = _view(fleet, model)
        return (
            view["phase"] == phase
            and view["paused"] is not None
            and _serves(fleet, model) == {"m1": "r1", "m2": "r2", "m3": "r1"}
        )

    throughout(held, BAKE + 3, "the paused rollout held")
    for member in fleet.members:  # what silences ControlplaneFleetNotConverged for it
        exported = partial(shows, member.api, 1, "controlplane_fleet_rollout_paused", model=model)
        eventually(exported, 30, f"{member.name} exporting the pause")
    assert m1.answer(model) == 1.0
    assert m3.answer(model) == 1.0

    shown = cli(m3.api.url, "fleet", "-o", "json")
    assert document(shown)["models"][model]["paused"]["by"] == "cli through m1"
    status = document(cli(m3.api.url, "status", model, "-o", "json"))
    assert status["fleet"]["paused"]["reason"] == "p99 up on the canary", status
    again = _rollout(m2, "pause", model)
    assert again.returncode == 1
    assert document(again)["error"]["code"] == "rollout_already_paused"
    assert "cli through m1" in document(again)["error"]["message"]

    resumed = _rollout(m3, "resume", model, "--reason", "false alarm")

    assert resumed.returncode == 0, resumed.stderr
    assert document(resumed)["paused"] is None
    fleet.wait_serving(model, "r2", 2.0, timeout=BAKE + 60)
    eventually(lambda: _view(fleet, model)["phase"] == "complete", 30, "the rollout complete")
    assert _rollout(m1, "resume", model).returncode == 1  # nothing paused any more
    assert gauge(m1.api, "controlplane_fleet_rollout_paused", model=model) == 0


def test_promote_ends_a_bake_of_no_set_length_at_once(fleet: Fleet, models: Models) -> None:
    model = models.untimed
    m1, _m2, m3 = fleet.members
    _first_release_everywhere(fleet, model)
    assert m3.api.deploy(model, "r2").status_code == 200  # m3 goes first: the canary
    eventually(lambda: _view(fleet, model)["phase"] == "baking", 30, "the canary baking")
    assert _view(fleet, model)["bake_seconds"] is None  # until promoted
    throughout(
        lambda: _serves(fleet, model) == {"m1": "r1", "m2": "r1", "m3": "r2"},
        2.0,
        "the others on the stable release while it bakes",
    )

    began = time.monotonic()
    promoted = _rollout(m1, "promote", model, "--reason", "INC-42: looks good")

    assert promoted.returncode == 0, promoted.stderr
    answer = document(promoted)
    assert answer["phase"] == "complete"
    assert "promoted by cli through m1" in answer["reason"]
    fleet.wait_serving(model, "r2", 2.0, timeout=60)
    # A load on two members, and no bake: far less than any bake worth the name.
    assert time.monotonic() - began < 60
    refused = _rollout(m1, "promote", model)
    assert refused.returncode == 1
    assert document(refused)["error"]["code"] == "no_rollout_in_progress"


def test_abort_brings_the_canary_back_and_the_release_can_be_deployed_again(
    fleet: Fleet, models: Models
) -> None:
    model = models.aborted
    m1, m2, m3 = fleet.members
    _first_release_everywhere(fleet, model)
    assert m2.api.deploy(model, "r2").status_code == 200  # m2 goes first: the canary
    eventually(lambda: _view(fleet, model)["phase"] == "baking", 30, "the canary baking")

    aborted = _rollout(m1, "abort", model, "--reason", "wrong tokenizer")

    assert aborted.returncode == 0, aborted.stderr
    answer = document(aborted)
    assert answer["phase"] == "rolled_back"
    assert answer["desired"] == "r1"
    assert answer["rollout_note"] == "aborted by cli through m1: wrong tokenizer"
    assert answer["degraded"] == []  # a person stopped it: not latched
    fleet.wait_serving(model, "r1", 1.0, timeout=60)
    # The others never moved: no operation of theirs ever went to r2.
    assert "r2" not in _releases_seen(m1, model) | _releases_seen(m3, model)

    # Deployed again by name, it starts a new rollout with no other step; promoted, it serves.
    again = m2.api.post(f"/v1/models/{model}/deploy", {"release": "r2", "wait": True})
    assert again.status_code == 200, again.text
    eventually(lambda: _view(fleet, model)["phase"] == "baking", 30, "the canary baking again")
    assert _rollout(m3, "promote", model).returncode == 0
    fleet.wait_serving(model, "r2", 2.0, timeout=60)
