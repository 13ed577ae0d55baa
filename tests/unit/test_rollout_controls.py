"""A person's hand on a rollout, as pure rules: pause holds it (its bake's clock too), resume
lets it go on with the bake it had left, promote ends it now, abort takes the fleet back to
the stable release without latching the release; each refused, with its code, when there is
nothing to act on.

Values are built by hand (the helpers of ``test_fleet_domain``); time is the ``now`` passed.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from controlplane.domain import rollout_controls
from controlplane.domain.errors import (
    ModelNotFound,
    NoRolloutInProgress,
    RolloutAlreadyPaused,
    RolloutNotPaused,
)
from controlplane.domain.fleet import (
    DesiredModel,
    MemberBeat,
    Pause,
    RolloutPhase,
    desired_for_storage,
    desired_from_storage,
)
from controlplane.domain.rollout import RolloutPolicy, advance, start
from controlplane.services.rollout_controls import Control, RolloutControls
from tests.unit.test_fleet_domain import MODEL, T0, beat, beats, canary, desired, serving
from tests.unit.test_fleet_ledger import Rig, scenario

WHO = {"member": "b", "trigger": "cli"}
BAKING = canary("a", phase=RolloutPhase.BAKING, bake_seconds=60.0, baking_since=T0)


def fleet_at(at: datetime) -> dict[str, MemberBeat]:
    """A canary bakes r2 while b and c keep the stable r1, each beating at ``at``."""
    return beats(
        beat("a", serving("r2"), at=at),
        beat("b", serving("r1"), at=at),
        beat("c", serving("r1"), at=at),
    )


FLEET = fleet_at(T0)


def test_a_pause_is_a_new_generation_that_says_who_paused_it_when_and_why() -> None:
    wanted = desired(rollout=BAKING)
    now = T0 + timedelta(seconds=10)

    after = rollout_controls.pause(wanted, FLEET, now, reason="dashboards red", **WHO)

    assert after.generation == wanted.generation + 1
    assert (after.set_by, after.set_at, after.trigger) == ("b", now, "cli")
    assert after.rollout.paused == Pause("cli through b", now, "dashboards red")
    assert after.rollout.holds
    assert "paused by cli through b: dashboards red" in after.reason
    # It changes nothing of what each member should serve.
    assert [after.target_for(m) for m in "abc"] == [wanted.target_for(m) for m in "abc"]
    assert desired_from_storage(json.loads(json.dumps(desired_for_storage(after)))) == after


def test_a_paused_bake_does_not_run_out_into_a_promotion() -> None:
    wanted = desired(rollout=BAKING)
    paused = rollout_controls.pause(wanted, FLEET, T0 + timedelta(seconds=10), **WHO)

    long_after = T0 + timedelta(hours=5)
    later = fleet_at(long_after)
    assert advance(wanted, later, long_after, by="c") is not None  # unpaused: it completes
    assert advance(paused, later, long_after, by="c") is None


def test_a_paused_canary_rollout_does_not_start_its_bake_nor_replace_a_lost_canary() -> None:
    wanted = desired(rollout=canary("a"))
    paused = rollout_controls.pause(wanted, FLEET, T0, **WHO)
    assert advance(wanted, FLEET, T0, by="c") is not None  # a serves r2: it would bake

    assert advance(paused, FLEET, T0, by="c") is None
    gone = beats(beat("b", serving("r1")), beat("c", serving("r1")))  # a has gone away
    assert advance(paused, gone, T0, by="c") is None


def test_a_canary_in_trouble_still_stops_a_paused_rollout() -> None:
    paused = rollout_controls.pause(desired(rollout=BAKING), FLEET, T0, **WHO)
    failed = dict(FLEET)
    failed["a"] = beat("a", serving("r2"), overload="breach")

    after = advance(paused, failed, T0, by="c")

    assert after is not None
    assert after.rollout.phase is RolloutPhase.ROLLED_BACK
    assert after.release == "r1"
    assert not after.rollout.holds
    assert after.rollout.paused is None


def test_resume_gives_the_bake_the_time_it_had_left_when_paused() -> None:
    # Paused 10 s into a 60 s bake, resumed 100 s later: 50 s of bake are left.
    paused = rollout_controls.pause(
        desired(rollout=BAKING), FLEET, T0 + timedelta(seconds=10), **WHO
    )
    resumed = rollout_controls.resume(paused, T0 + timedelta(seconds=110), **WHO)

    assert resumed.rollout.paused is None
    assert not resumed.rollout.holds
    assert resumed.rollout.baking_since == T0 + timedelta(seconds=100)
    assert "resumed by cli through b" in resumed.reason
    at_159, at_160 = T0 + timedelta(seconds=159), T0 + timedelta(seconds=160)
    assert advance(resumed, fleet_at(at_159), at_159, by="c") is None
    done = advance(resumed, fleet_at(at_160), at_160, by="c")
    assert done is not None
    assert done.rollout.phase is RolloutPhase.COMPLETE


def test_resume_of_a_rollout_paused_before_its_bake_keeps_it_where_it_stood() -> None:
    paused = rollout_controls.pause(desired(rollout=canary("a")), FLEET, T0, **WHO)

    resumed = rollout_controls.resume(paused, T0 + timedelta(seconds=30), **WHO)

    assert resumed.rollout.phase is RolloutPhase.CANARY
    assert resumed.rollout.baking_since is None
    after = advance(resumed, FLEET, T0 + timedelta(seconds=30), by="c")
    assert after is not None
    assert after.rollout.phase is RolloutPhase.BAKING


def test_a_plain_update_that_has_not_reached_every_member_can_be_paused() -> None:
    # No canary: r2 is the release for all; c has not moved yet (a rolling update's turn).
    wanted = desired()
    spreading = beats(beat("a", serving("r2")), beat("b", serving("r2")), beat("c", serving("r1")))

    after = rollout_controls.pause(wanted, spreading, T0, **WHO)

    assert after.rollout.phase is RolloutPhase.COMPLETE
    assert after.rollout.holds


def test_nothing_to_pause_when_every_member_serves_what_it_should() -> None:
    everywhere = beats(beat("a", serving("r2")), beat("b", serving("r2")))

    with pytest.raises(NoRolloutInProgress) as refused:
        rollout_controls.pause(desired(), everywhere, T0, **WHO)

    assert refused.value.code == "no_rollout_in_progress"
    assert "nothing to pause" in refused.value.message


def test_a_rollout_stopped_is_not_paused_it_goes_back_to_the_stable_release() -> None:
    stopped = desired(rollout=canary("a", phase=RolloutPhase.ROLLED_BACK))

    with pytest.raises(NoRolloutInProgress):
        rollout_controls.pause(stopped, FLEET, T0, **WHO)


def test_a_second_pause_says_who_paused_it_first() -> None:
    paused = rollout_controls.pause(desired(rollout=BAKING), FLEET, T0, reason="look", **WHO)

    with pytest.raises(RolloutAlreadyPaused) as refused:
        rollout_controls.pause(paused, FLEET, T0, member="c", trigger="api")

    assert refused.value.code == "rollout_already_paused"
    assert "by cli through b" in refused.value.message
    assert "look" in refused.value.message


def test_resume_of_a_rollout_nobody_paused_is_refused() -> None:
    with pytest.raises(RolloutNotPaused) as refused:
        rollout_controls.resume(desired(rollout=BAKING), T0, **WHO)

    assert refused.value.code == "rollout_not_paused"


def test_promote_ends_a_bake_now_paused_or_not() -> None:
    for wanted in (
        desired(rollout=BAKING),
        desired(rollout=canary("a")),
        rollout_controls.pause(desired(rollout=BAKING), FLEET, T0, **WHO),
    ):
        after = rollout_controls.promote(wanted, T0, reason="looks good", **WHO)

        assert after.rollout.phase is RolloutPhase.COMPLETE
        assert after.rollout.paused is None
        assert [after.target_for(m) for m in "abc"] == ["r2", "r2", "r2"]
        assert "promoted by cli through b" in after.reason
        assert "looks good" in after.reason


def test_a_bake_of_no_set_length_waits_for_promote() -> None:
    policy = RolloutPolicy(canary_members=1, bake_seconds=None)
    rollout = start(policy, first="a", alive=["a", "b"], stable="r1", generation=6)
    baking = advance(desired(rollout=rollout), FLEET, T0, by="c")
    assert baking is not None
    assert baking.rollout.phase is RolloutPhase.BAKING
    assert "baking until promoted" in baking.reason

    year = T0 + timedelta(days=365)
    assert advance(baking, fleet_at(year), year, by="c") is None
    promoted = rollout_controls.promote(baking, T0 + timedelta(days=365), **WHO)
    assert promoted.rollout.phase is RolloutPhase.COMPLETE
    assert desired_from_storage(json.loads(json.dumps(desired_for_storage(baking)))) == baking


def test_nothing_to_promote_or_abort_outside_a_canary_rollout() -> None:
    for rollout in (canary(phase=RolloutPhase.COMPLETE), canary(phase=RolloutPhase.ROLLED_BACK)):
        for control in (rollout_controls.promote, rollout_controls.abort):
            with pytest.raises(NoRolloutInProgress) as refused:
                control(desired(rollout=rollout), T0, **WHO)
            assert refused.value.code == "no_rollout_in_progress"


def test_abort_sends_the_canaries_back_to_the_stable_release_and_latches_nothing() -> None:
    paused = rollout_controls.pause(desired(rollout=BAKING), FLEET, T0, **WHO)

    after = rollout_controls.abort(paused, T0, reason="wrong tokenizer", member="c", trigger="api")

    assert after.release == "r1"
    assert after.previous == "r2"
    assert [after.target_for(m) for m in "abc"] == ["r1", "r1", "r1"]
    assert after.rollout.phase is RolloutPhase.ROLLED_BACK
    assert after.rollout.note == "aborted by api through c: wrong tokenizer"
    assert after.rollout.paused is None
    assert after.degraded == ()
    assert not after.is_degraded("r2")
    assert after.unloaded is None
    assert desired_from_storage(json.loads(json.dumps(desired_for_storage(after)))) == after


def test_abort_with_nothing_stable_unloads_the_canaries() -> None:
    first = replace(canary("a"), stable=None)

    after = rollout_controls.abort(desired(rollout=first), T0, **WHO)

    assert after.release is None
    assert after.unloaded == "r2"
    assert after.unloads("a")


# --- through a member: the service that writes them ---------------------------------------


def test_a_control_that_loses_the_race_is_applied_to_what_won_and_wakes_the_fleet(
    tmp_path: Path,
) -> None:
    """Another member moved the rollout on (canary to baking) inside the pause's swap: the
    pause is applied again to the record that won, and this member and its peers are woken."""

    async def body(r: Rig) -> tuple[DesiredModel, int]:
        r.records.desired[MODEL] = desired(rollout=canary("a"))

        def moved_on() -> DesiredModel:  # another member starts the bake
            after = advance(r.records.desired[MODEL], FLEET, T0, by="c")
            assert after is not None
            return after

        r.records.meanwhile(moved_on)
        controls = RolloutControls(ledger=r.ledger, clock=r.clock)
        written = await controls.apply(MODEL, Control.PAUSE, trigger="api", reason="why not")
        return written, r.woken

    written, woken = scenario(tmp_path, body)

    assert written.rollout.phase is RolloutPhase.BAKING  # the winner's phase, kept
    assert written.rollout.paused is not None
    assert written.rollout.paused.by == "api through a"
    assert written.generation == 7  # 5, the advance's 6, the pause's 7
    assert woken == 1


def test_a_control_of_a_model_the_fleet_has_no_record_of_is_model_not_found(
    tmp_path: Path,
) -> None:
    async def body(r: Rig) -> ModelNotFound:
        controls = RolloutControls(ledger=r.ledger, clock=r.clock)
        with pytest.raises(ModelNotFound) as refused:
            await controls.apply(MODEL, Control.PROMOTE, trigger="cli")
        return refused.value

    refused = scenario(tmp_path, body)

    assert refused.code == "model_not_found"
    assert f"controlplane deploy {MODEL} RELEASE" in refused.message
