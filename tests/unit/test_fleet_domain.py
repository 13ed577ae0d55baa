"""The fleet's desired state and its canary rollout, as pure rules: who should serve what, when a
fleet has converged, the stored shape of a record, and how a rollout moves (or stops).

Every test builds values by hand and reads the answer; time is whatever ``now`` the test passes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controlplane.domain.fleet import (
    MAX_KEEPALIVE,
    Claim,
    Degraded,
    DesiredModel,
    MemberBeat,
    MemberModel,
    MemberState,
    Pause,
    Rollout,
    RolloutPhase,
    beat_for_storage,
    beat_from_storage,
    converged,
    desired_for_storage,
    desired_from_storage,
    first_generation,
)
from controlplane.domain.generations import Generations
from controlplane.domain.refusals import BadValue, RefusalReason, reason_of
from controlplane.domain.rollout import (
    RollbackAim,
    RolloutPolicy,
    advance,
    rollback_aim,
    stable_release,
    start,
)
from controlplane.domain.turns import Progress, Turn

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
MODEL = "m"


def desired(
    release: str | None = "r2",
    *,
    generation: int = 5,
    rollout: Rollout | None = None,
    degraded: tuple[Degraded, ...] = (),
) -> DesiredModel:
    return DesiredModel(
        model=MODEL,
        generation=generation,
        release=release,
        previous="r1",
        set_by="a",
        set_at=T0,
        trigger="api",
        reason="deploy of r2 by api through a",
        degraded=degraded,
        rollout=rollout or Rollout(),
    )


def canary(
    *canaries: str,
    phase: RolloutPhase = RolloutPhase.CANARY,
    bake_seconds: float = 60.0,
    baking_since: datetime | None = None,
    since_generation: int = 5,
) -> Rollout:
    return Rollout(
        phase=phase,
        stable="r1",
        canaries=canaries,
        bake_seconds=bake_seconds,
        baking_since=baking_since,
        since_generation=since_generation,
    )


def serving(release: str | None, *, generation: int = 5, target: str | None = None) -> MemberModel:
    state = MemberState.SERVING if release is not None else MemberState.UNLOADED
    return MemberModel(release, state, target=target or release, generation=generation)


def beat(
    member: str,
    state: MemberModel | None = None,
    *,
    at: datetime = T0,
    overload: str | None = None,
) -> MemberBeat:
    return MemberBeat(
        member=member,
        incarnation=f"{member}-1",
        at=at,
        interval=10.0,
        version="1.0",
        models={} if state is None else {MODEL: state},
        overload=overload,
    )


def beats(*members: MemberBeat) -> dict[str, MemberBeat]:
    return {b.member: b for b in members}


DEAD = T0 - timedelta(seconds=31)  # 3 intervals of 10 s and a second: not alive at T0


# --- what each member should serve -----------------------------------------------------------


def test_during_a_canary_rollout_only_the_canaries_follow_the_new_release() -> None:
    for phase in (RolloutPhase.CANARY, RolloutPhase.BAKING):
        wanted = desired(rollout=canary("a", "b", phase=phase))

        assert wanted.target_for("a") == "r2"
        assert wanted.target_for("b") == "r2"
        assert wanted.target_for("c") == "r1"


def test_once_a_rollout_ends_every_member_follows_the_release() -> None:
    complete = desired(rollout=canary("a", phase=RolloutPhase.COMPLETE))
    stopped = desired("r1", rollout=canary("a", phase=RolloutPhase.ROLLED_BACK))

    assert [complete.target_for(m) for m in ("a", "c")] == ["r2", "r2"]
    assert [stopped.target_for(m) for m in ("a", "c")] == ["r1", "r1"]


def test_stable_release_is_what_serves_everywhere_now() -> None:
    assert stable_release(None) is None
    assert stable_release(desired()) == "r2"
    assert stable_release(desired(rollout=canary("a"))) == "r1"
    assert stable_release(desired(rollout=canary("a", phase=RolloutPhase.ROLLED_BACK))) == "r2"


# --- converged -------------------------------------------------------------------------------


def test_previous_is_the_fleets_while_the_member_serves_the_fleets_release() -> None:
    # r3 served here only (a deploy killed before it published): the fleet's r1 is previous.
    assert desired("r2").previous_for("r2", own="r3") == "r1"
    assert desired("r2").previous_for("r2", own=None) == "r1"  # a journal lost


def test_a_canary_s_previous_is_the_stable_release_of_its_rollout() -> None:
    # r2 was deployed over r5, another canary release that never baked: not r5, but r1.
    wanted = dataclasses.replace(desired(rollout=canary("a")), previous="r5")

    assert wanted.previous_for("r2", own="r5") == "r1"
    assert wanted.previous_for("r1", own="r0") == "r0"  # no canary: its own, as before


def test_previous_is_the_members_own_where_the_fleet_says_nothing_of_what_serves() -> None:
    assert desired("r2").previous_for("r4", own="r3") == "r3"  # not (yet) the fleet's release
    assert desired("r2").previous_for(None, own="r3") == "r3"
    first = dataclasses.replace(desired("r2"), previous=None)  # the fleet's first release
    assert first.previous_for("r2", own="r0") == "r0"


def test_converged_when_every_live_member_serves_its_target() -> None:
    wanted = desired(rollout=canary("a"))
    fleet = beats(beat("a", serving("r2")), beat("b", serving("r1")))

    assert converged(wanted, fleet, T0)
    assert not converged(wanted, beats(beat("a", serving("r1")), beat("b", serving("r1"))), T0)


def test_a_dead_member_does_not_hold_convergence_back() -> None:
    wanted = desired()
    fleet = beats(beat("a", serving("r2")), beat("gone", serving("r1"), at=DEAD))

    assert converged(wanted, fleet, T0)


def test_a_member_that_failed_or_still_converges_is_not_converged() -> None:
    wanted = desired()
    for state in (MemberState.FAILED, MemberState.CONVERGING, MemberState.HELD):
        member = MemberModel("r2", state, target="r2", generation=5)

        assert not converged(wanted, beats(beat("a", member)), T0), state


def test_with_no_live_member_nothing_is_converged() -> None:
    assert not converged(desired(), {}, T0)
    assert not converged(desired(), beats(beat("gone", serving("r2"), at=DEAD)), T0)


def test_unloaded_on_purpose_is_served_by_a_member_that_has_nothing() -> None:
    wanted = desired(None)

    assert converged(wanted, beats(beat("a"), beat("b", serving(None))), T0)
    assert not converged(wanted, beats(beat("a", serving("r1"))), T0)


# --- the stored shape ------------------------------------------------------------------------


def every_field_set() -> DesiredModel:
    """A record in which no field keeps its default, so a field left out of the stored shape
    cannot pass the round trip unnoticed."""
    return DesiredModel(
        model=MODEL,
        generation=7,
        release="r3",
        previous="r2",
        set_by="member-b",
        set_at=T0 + timedelta(microseconds=123456),
        trigger="watcher",
        reason="deploy of r3 by watcher through member-b",
        degraded=(
            Degraded("r0", T0 - timedelta(days=1), "rolled back from by alert"),
            Degraded("r1", T0 - timedelta(hours=1), "rollout stopped: canary a: GPU overload"),
        ),
        rollout=Rollout(
            phase=RolloutPhase.BAKING,
            stable="r2",
            canaries=("member-b", "member-a"),
            bake_seconds=90.5,
            baking_since=T0 - timedelta(seconds=30),
            since_generation=6,
            note="a note",
            lost=("member-c",),
            paused=Pause("cli through member-a", T0 - timedelta(seconds=5), "dashboards red"),
        ),
        claim=Claim(
            release="r4",
            revision='"etag-1"',
            member="member-a",
            incarnation="inc-7",
            at=T0 - timedelta(minutes=2),
            failed="preflight_failed: no OUTPUT0",
        ),
        turns=(
            Turn("member-c", "inc-9", T0 - timedelta(seconds=12), "r3"),
            Turn("member-d", "inc-2", T0 - timedelta(seconds=3), None),
        ),
    )


def non_default_fields(value: Any) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(value)
        if (f.default is not dataclasses.MISSING and getattr(value, f.name) == f.default)
        or (
            f.default_factory is not dataclasses.MISSING
            and getattr(value, f.name) == f.default_factory()
        )
    ]


def test_every_field_of_a_desired_state_survives_storage() -> None:
    record = every_field_set()
    # ``unloaded`` goes with a null release only: the unload's own round trip is below.
    assert non_default_fields(record) == ["unloaded"]
    assert non_default_fields(record.rollout) == []
    assert record.claim is not None
    assert non_default_fields(record.claim) == []

    stored = json.loads(json.dumps(desired_for_storage(record)))

    assert desired_from_storage(stored) == record


def test_an_unload_survives_storage_and_unloads_every_member() -> None:
    record = dataclasses.replace(desired(None), unloaded="r2")

    back = desired_from_storage(json.loads(json.dumps(desired_for_storage(record))))

    assert back == record
    assert back.unloads("a")
    assert back.unloads("b")


def hand_edited(**change: Any) -> dict[str, Any]:
    """A stored record of r2, then ``change`` written into it by hand."""
    stored: dict[str, Any] = json.loads(json.dumps(desired_for_storage(desired("r2"))))
    return {**stored, **change}


@pytest.mark.parametrize(
    "change",
    [
        {"release": None},  # what a member serves now, named by previous
        {"release": None, "previous": None},  # a first release: nothing before it
        {"release": None, "previous": None, "degraded": [{"release": "r2", "at": T0.isoformat()}]},
        {"release": None, "unloaded": 7},  # not a release name
    ],
)
def test_a_null_release_written_by_hand_is_refused_and_says_how_to_unload(
    change: dict[str, Any],
) -> None:
    """Found from outside with write access to the bucket: ``"release": null`` written into
    a record unloaded the model on every member. Only an unload's record may say null."""
    with pytest.raises((ValueError, TypeError)) as refused:
        desired_from_storage(hand_edited(**change))

    if "unloaded" not in change:
        assert str(refused.value).startswith("release is null but the record is no unload")
        assert f"unload it through any member's API (POST /v1/models/{MODEL}/unload)" in str(
            refused.value
        )


def test_a_release_and_an_unload_in_one_record_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^unloaded is 'r1' but release is 'r2'"):
        desired_from_storage(hand_edited(unloaded="r1"))


def test_a_claim_on_a_new_model_is_a_null_release_that_unloads_nothing() -> None:
    """The release watcher's claim on a model with no record yet (and a turn taken on it)
    writes a null release before any release: read, and nobody unloads for it."""
    first = first_generation(MODEL, by="a", at=T0, trigger="watcher", reason="")
    claimed = first.changed(
        by="a",
        at=T0,
        trigger="watcher",
        reason="a claimed r1",
        claim=Claim("r1", None, "a", "a-1", T0),
    )
    turned = first.changed(
        by="a",
        at=T0,
        trigger="turn",
        reason="a takes a turn",
        turns=(Turn("a", "a-1", T0, "r1"),),
    )

    for record in (claimed, turned):
        back = desired_from_storage(json.loads(json.dumps(desired_for_storage(record))))
        assert back == record
        assert (back.target_for("a"), back.unloads("a")) == (None, False)


def test_a_canary_rollout_with_nothing_stable_asks_the_others_nothing() -> None:
    rollout = dataclasses.replace(canary("a"), stable=None)
    wanted = desired(rollout=rollout)

    assert (wanted.target_for("b"), wanted.unloads("b")) == (None, False)
    assert (wanted.target_for("a"), wanted.unloads("a")) == ("r2", False)


def test_a_rollout_stopped_with_nothing_stable_unloads_the_canaries_in_a_record_that_reads() -> (
    None
):
    rollout = dataclasses.replace(canary("a"), stable=None)
    failed = MemberModel("r1", MemberState.FAILED, target="r2", generation=5, error="boom")

    after = advance(desired(rollout=rollout), beats(beat("a", failed)), T0, by="b")

    assert after is not None
    assert (after.release, after.unloaded, after.rollout.phase) == (
        None,
        "r2",
        RolloutPhase.ROLLED_BACK,
    )
    assert desired_from_storage(json.loads(json.dumps(desired_for_storage(after)))) == after
    assert after.unloads("a")
    assert after.unloads("b")


def test_a_record_without_rollout_or_claim_is_complete_and_unclaimed() -> None:
    record = desired()

    back = desired_from_storage(json.loads(json.dumps(desired_for_storage(record))))

    assert back == record
    assert back.rollout == Rollout(RolloutPhase.COMPLETE)
    assert back.claim is None


def test_every_field_of_a_heartbeat_survives_storage() -> None:
    record = MemberBeat(
        member="member-a",
        incarnation="inc-1",
        at=T0,
        interval=2.5,
        version="1.2.3",
        models={
            "m": MemberModel(
                "r2",
                MemberState.FAILED,
                target="r3",
                generation=9,
                error="boom",
                progress=Progress(
                    "load", (("turn", 0.5), ("drain", 5.25), ("unload", 0.3)), failed="x"
                ),
            ),
            "n": MemberModel(None, MemberState.UNLOADED),
        },
        overload="breach",
        stale=True,
        url="http://10.0.0.7:8080",
        name_conflict="another daemon writes heartbeats as member-a",
        out_of_rotation="draining m; memory_not_returned: m2",
    )
    # Every field but when it landed, which the store tells and the record never holds.
    assert non_default_fields(record) == ["landed"]
    assert non_default_fields(record.models["m"]) == []
    assert non_default_fields(record.models["m"].progress) == []

    stored = json.loads(json.dumps(beat_for_storage(record)))

    assert beat_from_storage(stored) == record


def stored_desired() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(desired_for_storage(every_field_set())))
    return loaded


@pytest.mark.parametrize("key", ["model", "generation", "release", "set_by", "set_at", "trigger"])
def test_a_desired_state_missing_a_required_field_is_refused(key: str) -> None:
    data = stored_desired()
    del data[key]

    with pytest.raises(KeyError):
        desired_from_storage(data)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"rollout": {"phase": "halfway"}}, ValueError),
        ({"generation": "seven"}, TypeError),
        ({"set_at": "yesterday"}, ValueError),
        ({"set_at": None}, ValueError),
        ({"degraded": [{"release": "r0", "at": None}]}, ValueError),
        ({"degraded": ["r0"]}, TypeError),
        ({"claim": {"release": "r4", "member": "a", "incarnation": "i", "at": "soon"}}, ValueError),
        ({"claim": {"release": "r4", "member": "a", "at": T0.isoformat()}}, KeyError),
        # Not objects where objects belong: refused as not ours, like any other bad record.
        ({"rollout": ["canary"]}, TypeError),
        ({"rollout": "canary"}, TypeError),
        ({"claim": ["r4"]}, TypeError),
        ({"claim": "r4"}, TypeError),
    ],
)
def test_a_desired_state_that_is_not_ours_is_refused(
    change: dict[str, Any], error: type[Exception]
) -> None:
    data = {**stored_desired(), **change}

    with pytest.raises(error):
        desired_from_storage(data)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"models": {"m": {"release": "r2", "state": "dancing"}}}, ValueError),
        ({"models": {"m": {"release": "r2"}}}, KeyError),
        ({"at": "now"}, ValueError),
        ({"interval": "often"}, TypeError),
        ({"models": ["m"]}, TypeError),
        ({"models": {"m": ["r2", "serving"]}}, TypeError),
    ],
)
def test_a_heartbeat_that_is_not_ours_is_refused(
    change: dict[str, Any], error: type[Exception]
) -> None:
    data = {**beat_for_storage(beat("a", serving("r2"))), **change}

    with pytest.raises(error):
        beat_from_storage(data)


NAIVE = "2026-01-01T12:00:00"  # a time without a zone, as a hand edit writes it
ROLLING: dict[str, Any] = {
    "phase": "baking",
    "stable": "r1",
    "canaries": ["a"],
    "bake_seconds": 60,
    "baking_since": T0.isoformat(),
    "since_generation": 5,
}
# Each a value a record read as JSON (Python's reader: NaN, Infinity and 1e400 are floats)
# may hold, which parsed before and then failed where it was used: a 500 from GET /v1/fleet,
# a restart of the fleet sync, or a NaN no JSON answer can carry.
BAD_DESIRED: dict[str, dict[str, Any]] = {
    "generation NaN": {"generation": math.nan},
    "generation Infinity": {"generation": math.inf},
    "generation negative": {"generation": -1},
    "generation huge": {"generation": 2**63},
    "generation a fraction": {"generation": 7.5},
    "generation a boolean": {"generation": True},
    "set_at without a zone": {"set_at": NAIVE},
    "set_at garbage": {"set_at": "yesterday at noon"},
    "set_at a number": {"set_at": 1767268800},
    "set_at out of range": {"set_at": "0001-01-01T00:00:00+05:00"},
    "release a number": {"release": 2},
    "previous a list": {"previous": ["r1"]},
    "model a list": {"model": ["m"]},
    "set_by null": {"set_by": None},
    "trigger a number": {"trigger": 1},
    "reason an object": {"reason": {"why": "x"}},
    "degraded an object": {"degraded": {"release": "r0"}},
    "degraded at without a zone": {"degraded": [{"release": "r0", "at": NAIVE}]},
    "degraded release a number": {"degraded": [{"release": 0, "at": T0.isoformat()}]},
    "baking_since without a zone": {"rollout": {**ROLLING, "baking_since": NAIVE}},
    "baking_since garbage": {"rollout": {**ROLLING, "baking_since": "soon"}},
    "bake_seconds NaN": {"rollout": {**ROLLING, "bake_seconds": math.nan}},
    "bake_seconds Infinity": {"rollout": {**ROLLING, "bake_seconds": math.inf}},
    "bake_seconds negative": {"rollout": {**ROLLING, "bake_seconds": -5}},
    "bake_seconds a string": {"rollout": {**ROLLING, "bake_seconds": "60"}},
    "since_generation NaN": {"rollout": {**ROLLING, "since_generation": math.nan}},
    "since_generation negative": {"rollout": {**ROLLING, "since_generation": -2}},
    "canaries a string": {"rollout": {**ROLLING, "canaries": "a"}},
    "canaries of numbers": {"rollout": {**ROLLING, "canaries": [1]}},
    "phase a list": {"rollout": {**ROLLING, "phase": ["baking"]}},
    "stable a number": {"rollout": {**ROLLING, "stable": 1}},
    "note a number": {"rollout": {**ROLLING, "note": 1}},
    "lost a string": {"rollout": {**ROLLING, "lost": "b"}},
    "paused a string": {"rollout": {**ROLLING, "paused": "yes"}},
    "paused a list": {"rollout": {**ROLLING, "paused": ["cli"]}},
    "paused at without a zone": {
        "rollout": {**ROLLING, "paused": {"by": "cli through a", "at": NAIVE}}
    },
    "paused by a number": {"rollout": {**ROLLING, "paused": {"by": 1, "at": T0.isoformat()}}},
    "paused reason a list": {
        "rollout": {
            **ROLLING,
            "paused": {"by": "cli through a", "at": T0.isoformat(), "reason": ["x"]},
        }
    },
    "claim at without a zone": {
        "claim": {"release": "r4", "member": "a", "incarnation": "i", "at": NAIVE}
    },
    "claim revision a number": {
        "claim": {
            "release": "r4",
            "member": "a",
            "incarnation": "i",
            "at": T0.isoformat(),
            "revision": 1,
        }
    },
}
BAD_BEATS: dict[str, dict[str, Any]] = {
    "at without a zone": {"at": NAIVE},
    "at garbage": {"at": "now"},
    "at NaN": {"at": math.nan},
    "interval NaN": {"interval": math.nan},
    "interval Infinity": {"interval": math.inf},
    "interval huge": {"interval": 1e300},
    "interval an integer beyond any float": {"interval": 10**400},
    "interval negative": {"interval": -5},
    "interval a boolean": {"interval": True},
    "member a number": {"member": 7},
    "incarnation null": {"incarnation": None},
    "version a number": {"version": 2},
    "overload a number": {"overload": 0.99},
    "stale a string": {"stale": "no"},
    "models a list": {"models": ["m"]},
    "a model's state a number": {"models": {"m": {"release": "r2", "state": 1}}},
    "a model's release a number": {"models": {"m": {"release": 2, "state": "serving"}}},
    "a model's generation NaN": {
        "models": {"m": {"release": "r2", "state": "serving", "generation": math.nan}}
    },
    "a model's generation negative": {
        "models": {"m": {"release": "r2", "state": "serving", "generation": -1}}
    },
    "a model's error a list": {
        "models": {"m": {"release": "r2", "state": "failed", "error": ["boom"]}}
    },
}


@pytest.mark.parametrize("shape", sorted(BAD_DESIRED))
def test_a_desired_state_with_a_value_that_would_fail_where_it_is_used_is_refused(
    shape: str,
) -> None:
    data = {**stored_desired(), **BAD_DESIRED[shape]}

    with pytest.raises((TypeError, ValueError)) as refused:
        desired_from_storage(data)

    field = next(iter(BAD_DESIRED[shape]))
    assert str(refused.value).startswith(field), refused.value


@pytest.mark.parametrize("shape", sorted(BAD_BEATS))
def test_a_heartbeat_with_a_value_that_would_fail_where_it_is_used_is_refused(
    shape: str,
) -> None:
    data = {**beat_for_storage(beat("a", serving("r2"))), **BAD_BEATS[shape]}

    with pytest.raises((TypeError, ValueError)) as refused:
        beat_from_storage(data)

    field = next(iter(BAD_BEATS[shape]))
    assert str(refused.value).startswith(field), refused.value


def test_a_time_with_another_zone_than_utc_is_read_as_the_same_moment() -> None:
    data = {**beat_for_storage(beat("a")), "at": "2026-01-01T13:00:00+01:00"}

    read = beat_from_storage(data)

    assert read.at == T0
    assert read.alive(T0)


@pytest.mark.parametrize("key", ["member", "incarnation", "at", "interval"])
def test_a_heartbeat_missing_a_required_field_is_refused(key: str) -> None:
    data = beat_for_storage(beat("a", serving("r2")))
    del data[key]

    with pytest.raises(KeyError):
        beat_from_storage(data)


# --- starting a rollout ----------------------------------------------------------------------


def test_no_canaries_when_the_policy_is_off_or_nothing_serves_yet() -> None:
    off = start(RolloutPolicy(), first="a", alive=["a", "b"], stable="r1", generation=6)
    first_release = start(
        RolloutPolicy(canary_members=1, bake_seconds=30),
        first="a",
        alive=["a", "b"],
        stable=None,
        generation=6,
    )

    assert off == Rollout(RolloutPhase.COMPLETE)
    assert first_release == Rollout(RolloutPhase.COMPLETE)
    assert not off.in_progress
    assert off.canaries == ()


def test_the_member_that_went_first_is_the_first_canary() -> None:
    rollout = start(
        RolloutPolicy(canary_members=1, bake_seconds=30),
        first="c",
        alive=["a", "b", "c"],
        stable="r1",
        generation=6,
    )

    assert rollout == Rollout(
        phase=RolloutPhase.CANARY,
        stable="r1",
        canaries=("c",),
        bake_seconds=30,
        since_generation=6,
    )


def test_the_other_canaries_are_live_members_chosen_the_same_way_by_every_member() -> None:
    policy = RolloutPolicy(canary_members=3, bake_seconds=30)
    orders = (
        ["e", "b", "first", "d", "a"],
        ["a", "b", "d", "e", "first", "a"],
        ["d", "a", "e", "b"],
    )

    chosen = {
        start(policy, first="first", alive=alive, stable="r1", generation=6).canaries
        for alive in orders
    }

    assert chosen == {("first", "a", "b")}


def test_fewer_live_members_than_canaries_wanted_makes_every_live_member_a_canary() -> None:
    rollout = start(
        RolloutPolicy(canary_members=5), first="a", alive=["b", "a"], stable="r1", generation=6
    )

    assert rollout.canaries == ("a", "b")


# --- advancing it: canary -> baking -> complete ----------------------------------------------


def test_not_a_rollout_in_progress_does_not_advance() -> None:
    fleet = beats(beat("a", serving("r2")))

    assert advance(desired(), fleet, T0, by="a") is None
    for phase in (RolloutPhase.COMPLETE, RolloutPhase.ROLLED_BACK):
        assert advance(desired(rollout=canary("a", phase=phase)), fleet, T0, by="a") is None


def test_canary_bakes_once_every_live_canary_serves_the_release() -> None:
    wanted = desired(rollout=canary("a", "b"))
    half = beats(beat("a", serving("r2")), beat("b", serving("r1")), beat("c", serving("r1")))
    both = beats(beat("a", serving("r2")), beat("b", serving("r2")), beat("c", serving("r1")))

    assert advance(wanted, half, T0, by="c") is None
    after = advance(wanted, both, T0, by="c")

    assert after is not None
    assert after.generation == 6
    assert after.rollout.phase is RolloutPhase.BAKING
    assert after.rollout.baking_since == T0
    assert (after.set_by, after.trigger) == ("c", "rollout")
    assert after.release == "r2"
    assert after.target_for("c") == "r1"


def test_a_dead_canary_is_not_waited_for() -> None:
    wanted = desired(rollout=canary("a", "b"))
    fleet = beats(beat("a", serving("r2")), beat("b", serving("r1"), at=DEAD))

    after = advance(wanted, fleet, T0, by="a")

    assert after is not None
    assert after.rollout.phase is RolloutPhase.BAKING


def test_with_no_live_canary_and_no_member_to_take_over_the_rollout_waits() -> None:
    wanted = desired(rollout=canary("a", "b"))
    failed = MemberModel("r1", MemberState.FAILED, target="r2", generation=5, error="boom")
    fleet = beats(beat("a", serving("r2"), at=DEAD), beat("b", failed, at=DEAD))

    assert advance(wanted, fleet, T0, by="c") is None
    assert advance(wanted, {}, T0, by="c") is None


@pytest.mark.parametrize("phase", [RolloutPhase.CANARY, RolloutPhase.BAKING])
def test_a_canary_gone_is_replaced_by_the_first_live_member_and_the_bake_starts_again(
    phase: RolloutPhase,
) -> None:
    """The canary's pod went away (its heartbeat stopped; under Kubernetes a pod with another
    name took its place): the first live member by name that is not a canary takes over."""
    wanted = desired(rollout=canary("b", phase=phase, baking_since=T0))
    later = T0 + timedelta(seconds=50)
    fleet = beats(
        beat("b", serving("r2"), at=DEAD),
        beat("new-pod", serving("r1"), at=later),
        beat("a", serving("r1"), at=later),
    )

    after = advance(wanted, fleet, later, by="new-pod")

    assert after is not None
    assert after.generation == 6
    assert after.rollout.phase is RolloutPhase.CANARY
    assert (after.rollout.canaries, after.rollout.lost) == (("a",), ("b",))
    assert after.rollout.baking_since is None
    assert (after.release, after.rollout.stable) == ("r2", "r1")
    assert [after.target_for(m) for m in ("a", "b", "new-pod")] == ["r2", "r1", "r1"]
    assert after.reason.startswith("canary b is gone (no heartbeat for 3 beats): a takes the place")
    # The new canary serves it: the bake starts then, and lasts the whole bake.
    serves = beats(beat("a", serving("r2", generation=6), at=later), beat("new-pod", at=later))
    baking = advance(after, serves, later, by="a")
    assert baking is not None
    assert (baking.rollout.phase, baking.rollout.baking_since) == (RolloutPhase.BAKING, later)
    early, done = later + timedelta(seconds=59), later + timedelta(seconds=60)
    assert advance(baking, _at(serves, early), early, by="a") is None
    complete = advance(baking, _at(serves, done), done, by="a")
    assert complete is not None
    assert complete.rollout.phase is RolloutPhase.COMPLETE


def _at(fleet: dict[str, MemberBeat], at: datetime) -> dict[str, MemberBeat]:
    return {name: dataclasses.replace(b, at=at) for name, b in fleet.items()}


def test_a_canary_without_a_heartbeat_at_all_is_gone_too_and_the_live_ones_stay() -> None:
    wanted = desired(rollout=canary("a", "b", phase=RolloutPhase.BAKING, baking_since=T0))
    fleet = beats(beat("a", serving("r2")), beat("c", serving("r1")), beat("d", serving("r1")))

    after = advance(wanted, fleet, T0, by="c")

    assert after is not None
    assert (after.rollout.canaries, after.rollout.lost) == (("a", "c"), ("b",))


def test_a_member_that_was_a_canary_of_this_rollout_is_not_picked_again() -> None:
    """b went away and came back (a slow restart): it is not a canary any more, and serves the
    stable release; a's place goes to c."""
    rollout = dataclasses.replace(canary("a"), lost=("b",))
    fleet = beats(beat("a", at=DEAD), beat("b", serving("r1")), beat("c", serving("r1")))

    after = advance(desired(rollout=rollout), fleet, T0, by="b")

    assert after is not None
    assert (after.rollout.canaries, after.rollout.lost) == (("c",), ("b", "a"))


def test_a_rollout_whose_canaries_keep_going_away_is_stopped() -> None:
    rollout = dataclasses.replace(canary("c"), lost=("a", "b"))
    fleet = beats(beat("c", serving("r2"), at=DEAD), beat("d", serving("r1")))

    after = advance(desired(rollout=rollout), fleet, T0, by="d")

    assert after is not None
    assert after.rollout.phase is RolloutPhase.ROLLED_BACK
    assert (after.release, after.previous) == ("r1", "r2")
    assert after.is_degraded("r2")
    assert "3 canaries went away during this rollout (a, b, c)" in after.rollout.note
    assert [after.target_for(m) for m in ("c", "d")] == ["r1", "r1"]


def baking(bake_seconds: float = 60.0) -> DesiredModel:
    return desired(
        rollout=canary("a", phase=RolloutPhase.BAKING, bake_seconds=bake_seconds, baking_since=T0)
    )


@pytest.mark.parametrize("verdict", ["healthy", "no_gpu", None])
def test_a_bake_completes_after_bake_seconds_with_a_passing_verdict(verdict: str | None) -> None:
    wanted = baking()

    def fleet(at: datetime) -> dict[str, MemberBeat]:
        return beats(beat("a", serving("r2"), at=at, overload=verdict), beat("b", at=at))

    early, done = T0 + timedelta(seconds=59.9), T0 + timedelta(seconds=60)
    assert advance(wanted, fleet(early), early, by="b") is None
    after = advance(wanted, fleet(done), done, by="b")

    assert after is not None
    assert after.rollout.phase is RolloutPhase.COMPLETE
    assert after.generation == 6
    assert after.release == "r2"
    assert [after.target_for(m) for m in ("a", "b")] == ["r2", "r2"]


def test_an_unknown_verdict_holds_the_bake() -> None:
    wanted = baking()
    later = T0 + timedelta(hours=1)
    fleet = beats(beat("a", serving("r2"), at=later, overload="unknown"))

    assert advance(wanted, fleet, later, by="a") is None


# --- stopping it -----------------------------------------------------------------------------


TROUBLE = {
    "failed": beat(
        "a", MemberModel("r1", MemberState.FAILED, target="r2", generation=5, error="load failed")
    ),
    "held": beat("a", MemberModel("r1", MemberState.HELD, target="r2", generation=6)),
    "breach": beat("a", serving("r2"), overload="breach"),
}


@pytest.mark.parametrize("phase", [RolloutPhase.CANARY, RolloutPhase.BAKING])
@pytest.mark.parametrize("trouble", sorted(TROUBLE))
def test_a_canary_in_trouble_rolls_the_fleet_back_and_latches_the_release(
    trouble: str, phase: RolloutPhase
) -> None:
    wanted = desired(rollout=canary("a", "b", phase=phase, baking_since=T0))
    fleet = beats(TROUBLE[trouble], beat("b", serving("r2")), beat("c", serving("r1")))

    after = advance(wanted, fleet, T0 + timedelta(seconds=1), by="c")

    assert after is not None
    assert after.generation == 6
    assert after.rollout.phase is RolloutPhase.ROLLED_BACK
    assert (after.release, after.previous) == ("r1", "r2")
    assert after.is_degraded("r2")
    assert after.degraded[-1].at == T0 + timedelta(seconds=1)
    assert "canary a" in after.rollout.note
    assert "canary a" in after.reason
    assert [after.target_for(m) for m in ("a", "b", "c")] == ["r1", "r1", "r1"]


def test_a_degraded_release_is_latched_once() -> None:
    earlier = Degraded("r2", T0 - timedelta(days=1), "rolled back before")
    wanted = desired(rollout=canary("a"), degraded=(earlier,))

    after = advance(wanted, beats(TROUBLE["failed"]), T0, by="a")

    assert after is not None
    assert after.degraded == (earlier,)


@pytest.mark.parametrize("trouble", ["failed", "held"])
def test_reports_older_than_the_rollout_are_not_held_against_it(trouble: str) -> None:
    wanted = desired(rollout=canary("a", since_generation=7), generation=7)

    assert advance(wanted, beats(TROUBLE[trouble]), T0, by="a") is None


def test_a_breach_reported_before_the_rollout_does_not_stop_it() -> None:
    old = beat("a", serving("r2", generation=4), overload="breach")
    wanted = desired(rollout=canary("a", phase=RolloutPhase.BAKING, baking_since=T0))

    after = advance(wanted, beats(old), T0 + timedelta(seconds=10), by="a")

    assert after is None  # still baking; not rolled back


def test_a_breach_on_a_canary_that_does_not_serve_the_release_yet_does_not_stop_it() -> None:
    wanted = desired(rollout=canary("a"))
    fleet = beats(beat("a", serving("r1", target="r2"), overload="breach"))

    assert advance(wanted, fleet, T0, by="a") is None


def test_trouble_on_a_member_that_is_not_a_canary_does_not_stop_the_rollout() -> None:
    wanted = desired(rollout=canary("b"))
    failed = MemberModel("r1", MemberState.FAILED, target="r2", generation=5, error="boom")
    fleet = beats(beat("a", failed, overload="breach"), beat("b", serving("r2")))

    after = advance(wanted, fleet, T0, by="b")

    assert after is not None
    assert after.rollout.phase is RolloutPhase.BAKING


def test_a_dead_canary_in_trouble_is_not_judged() -> None:
    wanted = desired(rollout=canary("a", "b"))
    failed = MemberModel("r1", MemberState.FAILED, target="r2", generation=5, error="boom")
    fleet = beats(beat("a", failed, at=DEAD), beat("b", serving("r2")))

    after = advance(wanted, fleet, T0, by="b")

    assert after is not None
    assert after.rollout.phase is RolloutPhase.BAKING


# --- a rollback during a rollout ---------------------------------------------------------------

BAKED = "rolled back the canary r2 to the stable r1 during its bake"


@pytest.mark.parametrize(
    ("member", "active", "own"),
    [
        ("c", "r1", "r0"),  # no canary: it serves the stable release, its own previous is older
        ("a", "r2", "r1"),  # the canary
        ("d", None, None),  # a member where nothing serves yet
    ],
)
def test_a_rollback_during_a_bake_goes_to_the_stable_release_whichever_member_answers(
    member: str, active: str | None, own: str | None
) -> None:
    wanted = desired(rollout=canary("a", phase=RolloutPhase.BAKING, baking_since=T0))

    aim = rollback_aim(wanted, active=active, previous=own)

    assert aim == RollbackAim("r1", "r2", BAKED)
    assert aim.stops_rollout


def test_a_rollback_before_the_bake_says_the_canaries_were_taking_it_on() -> None:
    wanted = desired(rollout=canary("a"))

    aim = rollback_aim(wanted, active="r1", previous="r0")

    assert (aim.to, aim.away_from) == ("r1", "r2")
    assert aim.said == (
        "rolled back the canary r2 to the stable r1 before its bake, while its canaries took it on"
    )


def test_a_rollback_to_a_named_release_during_a_rollout_still_leaves_the_canary_s() -> None:
    wanted = desired(rollout=canary("a", phase=RolloutPhase.BAKING))

    assert rollback_aim(wanted, active="r1", previous="r0", to="r0") == RollbackAim(
        "r0", "r2", "rolled back the canary r2 to r0 during its bake"
    )
    # Back to the canary's own release: it leaves nothing, and stops nothing.
    assert rollback_aim(wanted, active="r1", previous="r0", to="r2") == RollbackAim("r2", None)


def test_outside_a_rollout_a_rollback_goes_to_the_previous_and_leaves_what_serves() -> None:
    for done in (desired(), desired(rollout=canary("a", phase=RolloutPhase.COMPLETE))):
        assert rollback_aim(done, active="r2", previous="r9") == RollbackAim("r1", "r2")
        assert rollback_aim(done, active="r4", previous="r3") == RollbackAim("r3", "r4")
    assert rollback_aim(None, active="r2", previous="r9") == RollbackAim("r9", "r2")
    assert rollback_aim(None, active="r2", previous=None) == RollbackAim(None, "r2")
    assert rollback_aim(None, active="r2", previous="r1", to="r2") == RollbackAim("r2", None)


# --- generations -----------------------------------------------------------------------------


def test_the_first_write_is_generation_one_and_each_change_one_more() -> None:
    base = first_generation(MODEL, by="a", at=T0, trigger="api", reason="")
    one = base.changed(by="a", at=T0, trigger="api", reason="deploy", release="r1")
    two = one.changed(by="b", at=T0, trigger="api", reason="deploy", release="r2", previous="r1")

    assert (base.generation, base.release) == (0, None)
    assert (one.generation, one.release, one.set_by) == (1, "r1", "a")
    assert (two.generation, two.release, two.previous, two.set_by) == (2, "r2", "r1", "b")


@pytest.mark.parametrize(
    "url",
    [
        "10.0.0.7:8080",
        "file:///etc/passwd",
        "http://user:secret@10.0.0.7:8080",
        "http://10.0.0.7:8080/v1/models",
        "http://10.0.0.7:8080?x=1",
        "http://10.0.0.7 :8080",
        "http://",
        "http://fd00::1:8080",  # IPv6 without brackets
        "http://[fd00::1",
        "http://h:80:90",
        "http://h:99999",
        "http://h:0",
        "http://host:notaport",
        "http://host:",
        "http://-host:8080",
        42,
        "http://" + "a" * 300,
    ],
)
def test_a_heartbeat_s_address_that_is_not_a_plain_api_address_is_not_used(url: object) -> None:
    """An address read from the store is one other members POST to: only http(s)://host:port
    is taken, and anything else leaves that member to be followed at its poll."""
    stored = json.loads(json.dumps(beat_for_storage(heartbeat_with_url("http://10.0.0.7:8080"))))
    stored["url"] = url
    assert beat_from_storage(stored).url is None


def test_a_heartbeat_without_an_address_is_read_as_one_that_cannot_be_woken() -> None:
    stored = json.loads(json.dumps(beat_for_storage(heartbeat_with_url(None))))
    del stored["url"]
    assert beat_from_storage(stored).url is None


def heartbeat_with_url(url: str | None) -> MemberBeat:
    return MemberBeat(member="a", incarnation="i", at=T0, interval=5.0, version="1", url=url)


@pytest.mark.parametrize(
    ("url", "taken"),
    [
        ("http://10.0.0.7:8080/", "http://10.0.0.7:8080"),
        ("https://controlplane-0.triton.ns.svc:8443", "https://controlplane-0.triton.ns.svc:8443"),
        ("http://[fd00::7]:8080", "http://[fd00::7]:8080"),
        ("http://[fd00::7]", "http://[fd00::7]"),
    ],
)
def test_a_plain_api_address_is_taken_as_written(url: str, taken: str) -> None:
    stored = json.loads(json.dumps(beat_for_storage(heartbeat_with_url(None))))
    stored["url"] = url
    assert beat_from_storage(stored).url == taken


# --- clocks and generations that go the wrong way ------------------------------------------


@pytest.mark.parametrize(
    ("offset", "alive"),
    [
        (0.0, True),
        (-30.0, True),  # three keepalives of 10 s back: the last beat that counts
        (-31.0, False),
        (30.0, True),  # a clock a little fast
        (31.0, False),  # dated further ahead than its window: no sign of life
    ],
)
def test_a_beat_known_only_by_its_own_date_is_alive_within_its_window(
    offset: float, alive: bool
) -> None:
    stamped = beat("b", at=T0 + timedelta(seconds=offset))

    assert stamped.alive(T0) is alive
    assert stamped.skew() is None  # not read from a store: nothing to tell a skew by


@pytest.mark.parametrize("writer_ahead", [-600.0, 0.0, 60.0, 600.0, 73 * 365 * 86400.0])
def test_a_beat_read_from_the_store_lives_by_when_it_landed_whatever_its_writers_clock(
    writer_ahead: float,
) -> None:
    """A member 10 minutes behind is alive while it beats; one ahead (or a beat dated 2099)
    is dead three keepalives after its last beat landed, not when its own date runs out."""
    landed = T0 - timedelta(seconds=5)
    written = dataclasses.replace(
        beat("b", at=landed + timedelta(seconds=writer_ahead)), landed=landed
    )

    assert written.alive(T0)
    # Three keepalives of 10 s, and 2 s for the store's timestamps, which are whole seconds.
    assert written.alive(landed + timedelta(seconds=32))
    assert not written.alive(landed + timedelta(seconds=32.5))
    assert written.skew() == writer_ahead
    assert written.seen == landed


def test_a_keepalive_claimed_beyond_the_bound_keeps_a_member_no_longer_than_the_bound() -> None:
    landed = T0
    claims = dataclasses.replace(beat("b", at=T0), interval=1e9, landed=landed)

    assert claims.alive(T0 + timedelta(seconds=3 * MAX_KEEPALIVE))
    assert not claims.alive(T0 + timedelta(seconds=3 * MAX_KEEPALIVE + 3))


def test_a_desired_state_that_went_back_is_not_followed_until_a_new_generation() -> None:
    generations = Generations()
    assert generations.screen({MODEL: desired("r2", generation=2)})[MODEL].release == "r2"

    put_back = {MODEL: desired("r1", generation=1)}
    assert "went back from generation 2" in generations.behind(put_back)[MODEL]
    assert generations.screen(put_back)[MODEL].release == "r2"  # kept

    written_over = {MODEL: desired("r1", generation=2)}  # a deploy over the one put back
    assert generations.behind(written_over) == {}
    assert generations.screen(written_over)[MODEL].release == "r1"
    assert generations.screen({}) == {}  # gone: forgotten
    assert generations.screen(put_back)[MODEL].release == "r1"  # written afresh, followed


def test_a_heartbeat_with_a_malformed_rolling_phase_is_refused() -> None:
    data = json.loads(json.dumps(beat_for_storage(MemberBeat("a", "i", T0, 1.0, "1"))))
    data["models"] = {"m": {"release": "r1", "state": "serving", "took": [["drain"]]}}

    with pytest.raises(ValueError, match=r"models.m.took\[0\] has 1 items"):
        beat_from_storage(data)


def test_a_rolling_progress_says_its_phase_and_how_long_each_took() -> None:
    assert Progress().summary == ""
    assert Progress("turn").summary == "waiting for its turn"
    assert Progress("drain", (("turn", 0.04),)).summary == "draining; turn 0.0 s"
    assert (
        Progress(None, (("drain", 5.12), ("load", 7.0))).summary == "done; drain 5.1 s, load 7.0 s"
    )
    failed = Progress(None, (("drain", 1.5), ("memory", 20.0)), failed="memory_not_returned")
    assert failed.summary == "failed (memory_not_returned); drain 1.5 s, memory 20.0 s"


# --- refusals: each bad record says why, as a label, and which field ---------------------------


TURN = {"member": "member-c", "incarnation": "inc-9", "at": T0.isoformat(), "release": "r3"}
# (a change to a stored desired state, the reason it is refused for, the field at fault)
REFUSED_DESIRED: dict[str, tuple[dict[str, Any], RefusalReason, str]] = {
    "an unknown rollout phase": (
        {"rollout": {**ROLLING, "phase": "halfway"}},
        RefusalReason.UNKNOWN_VALUE,
        "rollout.phase",
    ),
    "a newer schema": ({"schema": 2}, RefusalReason.UNKNOWN_VALUE, "schema"),
    "set_at without a zone": ({"set_at": NAIVE}, RefusalReason.TIME_WITHOUT_ZONE, "set_at"),
    "set_at not a time": ({"set_at": "soon"}, RefusalReason.NOT_A_TIME, "set_at"),
    "a turn taken at a time without a zone": (
        {"turns": [{**TURN, "at": NAIVE}]},
        RefusalReason.TIME_WITHOUT_ZONE,
        "turns[0].at",
    ),
    "a turn of a member no daemon is named": (
        {"turns": [{**TURN, "member": "../x"}]},
        RefusalReason.INVALID_NAME,
        "turns[0].member",
    ),
    "a turn without its holder's process": (
        {"turns": [{k: v for k, v in TURN.items() if k != "incarnation"}]},
        RefusalReason.MISSING_FIELD,
        "incarnation",
    ),
    "a latch set at a time without a zone": (
        {"degraded": [{"release": "r0", "at": NAIVE, "reason": "x"}]},
        RefusalReason.TIME_WITHOUT_ZONE,
        "degraded[0].at",
    ),
    "a latch of a release that spells a path": (
        {"degraded": [{"release": "../r0", "at": T0.isoformat()}]},
        RefusalReason.INVALID_NAME,
        "degraded[0].release",
    ),
    "a release that spells a path": (
        {"release": "../../etc"},
        RefusalReason.INVALID_NAME,
        "release",
    ),
    "a model name with the slots' __": ({"model": "m__blue"}, RefusalReason.INVALID_NAME, "model"),
    "a canary named with a slash": (
        {"rollout": {**ROLLING, "canaries": ["a/b"]}},
        RefusalReason.INVALID_NAME,
        "rollout.canaries[0]",
    ),
    "generation NaN": ({"generation": math.nan}, RefusalReason.WRONG_TYPE, "generation"),
    "generation negative": ({"generation": -1}, RefusalReason.OUT_OF_RANGE, "generation"),
    "bake_seconds Infinity": (
        {"rollout": {**ROLLING, "bake_seconds": math.inf}},
        RefusalReason.OUT_OF_RANGE,
        "rollout.bake_seconds",
    ),
}


@pytest.mark.parametrize("shape", sorted(REFUSED_DESIRED))
def test_a_refused_desired_state_says_why_and_in_which_field(shape: str) -> None:
    change, reason, field = REFUSED_DESIRED[shape]
    data = {**stored_desired(), **change}

    with pytest.raises((TypeError, ValueError, KeyError)) as refused:
        desired_from_storage(data)

    assert reason_of(refused.value) == (reason, field)


def test_an_unknown_phase_or_state_is_refused_naming_the_values_known() -> None:
    with pytest.raises(BadValue) as phase:
        desired_from_storage({**stored_desired(), "rollout": {**ROLLING, "phase": "halfway"}})
    with pytest.raises(BadValue) as state:
        beat_from_storage(
            {**beat_for_storage(beat("a")), "models": {"m": {"release": "r2", "state": "dancing"}}}
        )

    assert str(phase.value) == (
        "rollout.phase is 'halfway', not one of complete, canary, baking, rolled_back"
    )
    assert str(state.value).startswith("models.m.state is 'dancing', not one of serving,")


@pytest.mark.parametrize(
    ("change", "reason", "field"),
    [
        ({"at": NAIVE}, RefusalReason.TIME_WITHOUT_ZONE, "at"),
        ({"schema": 2}, RefusalReason.UNKNOWN_VALUE, "schema"),
        ({"member": "a b"}, RefusalReason.INVALID_NAME, "member"),
        ({"models": {"../m": {"state": "serving"}}}, RefusalReason.INVALID_NAME, "models"),
        (
            {"models": {"m": {"release": "r..2", "state": "serving"}}},
            RefusalReason.INVALID_NAME,
            "models.m.release",
        ),
        ({"interval": math.nan}, RefusalReason.OUT_OF_RANGE, "interval"),
    ],
)
def test_a_refused_heartbeat_says_why_and_in_which_field(
    change: dict[str, Any], reason: RefusalReason, field: str
) -> None:
    with pytest.raises((TypeError, ValueError)) as refused:
        beat_from_storage({**beat_for_storage(beat("a", serving("r2"))), **change})

    assert reason_of(refused.value) == (reason, field)


def test_what_a_newer_daemon_may_say_of_itself_is_read_as_written() -> None:
    """A GPU verdict or a rolling phase this version does not know is shown, never acted on as
    something else: refusing it would hide every upgraded member during an upgrade."""
    data = beat_for_storage(beat("a", serving("r2"), overload="thermal"))
    data["models"]["m"]["phase"] = "warmup"

    read = beat_from_storage(data)

    assert read.overload == "thermal"
    assert read.models["m"].progress.phase == "warmup"


def test_a_put_back_record_is_followed_once_a_person_deploys_over_it() -> None:
    """Read at generation 10, put back to 5: a deploy through the API writes 6 over the copy
    (counting from the store), set after the 10 read before: followed, though lower. What the
    daemons write over the copy on their own (a turn, a rollout's step) is not."""
    newest = dataclasses.replace(desired("r10", generation=10), set_at=T0)
    generations = Generations()
    generations.screen({MODEL: newest})
    put_back = dataclasses.replace(desired("r5", generation=5), set_at=T0 - timedelta(days=3))
    assert generations.screen({MODEL: put_back})[MODEL].release == "r10"

    turn = dataclasses.replace(put_back, generation=6, set_at=T0 + timedelta(1), trigger="turn")
    assert generations.screen({MODEL: turn})[MODEL].release == "r10"
    assert "went back from generation 10" in generations.behind({MODEL: turn})[MODEL]

    deployed = dataclasses.replace(
        put_back, generation=6, release="r11", set_at=T0 + timedelta(1), trigger="api"
    )
    assert generations.behind({MODEL: deployed}) == {}
    assert generations.screen({MODEL: deployed})[MODEL].release == "r11"


def test_a_model_whose_record_is_refused_is_not_forgotten() -> None:
    """A hand edit gone wrong hides the record; the backup put back after it is still judged
    against the newest read before."""
    generations = Generations()
    generations.screen({MODEL: desired("r2", generation=2)})

    generations.screen({}, refused={MODEL})
    put_back = {MODEL: desired("r1", generation=1)}

    assert generations.screen(put_back)[MODEL].release == "r2"
