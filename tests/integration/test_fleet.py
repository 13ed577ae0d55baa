"""A fleet of real Tritons, each with its daemon, converging on one desired state in a shared
directory store: a deploy through any member reaches every member, a release that fails on the
member that received it reaches none, and members that were down or are new catch up."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import partial
from pathlib import Path

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.integration.test_alert_webhook import notification
from tests.integration.test_cli import cli
from tests.support.fleet import BEAT, Fleet, Member, running_fleet
from tests.support.gpu_exporter import GpuExporter
from tests.support.inference import LoadGenerator
from tests.support.models import write_scale_release, write_sha256sums
from tests.support.polling import eventually
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton


@pytest.fixture
def fleet(
    pooled_tritons: Callable[[Path], RunningTriton], store: Path, tmp_path: Path
) -> Iterator[Fleet]:
    with running_fleet(
        pooled_tritons, store, tmp_path / "fleet", unique_model("fleetmodel")
    ) as running:
        yield running


def test_a_deploy_through_one_member_reaches_every_member(fleet: Fleet, store: Path) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    first, second, third = (fleet.add() for _ in range(3))

    answer = first.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r1", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    states = {m["member"]: (m["release"], m["state"]) for m in answer.json()["fleet"]["members"]}
    assert states == {name: ("r1", "serving") for name in ("m1", "m2", "m3")}
    fleet.wait_serving(fleet.model, "r1", 1.0)

    # Through another member, under client load on a third: no request fails anywhere.
    with LoadGenerator(third.triton.grpc_url, fleet.model, clients=2) as load:
        load.wait_for_answers(5)
        answer = second.api.post(
            f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
        )
        assert answer.status_code == 200, answer.text
        load.wait_for_answers(5)
    assert [e for log in load.logs for e in log.errors] == []
    assert {a for log in load.logs for a in log.answers} == {1.0, 2.0}
    fleet.wait_serving(fleet.model, "r2", 2.0)

    view = fleet.fleet(via=third)
    assert [m["member"] for m in view["members"]] == ["m1", "m2", "m3"]
    assert all(m["alive"] for m in view["members"])
    model = view["models"][fleet.model]
    assert (model["desired"], model["converged"], model["phase"]) == ("r2", True, "complete")
    assert (model["set_by"], model["previous"]) == ("m2", "r1")
    # Each follower got there through its own operation, triggered by the fleet.
    operations = third.api.get(f"/v1/operations?model={fleet.model}").json()["operations"]
    assert [(o["release"], o["trigger"], o["status"]) for o in operations][:2] == [
        ("r2", "fleet", "succeeded"),
        ("r1", "fleet", "succeeded"),
    ]
    # Who and why: the member that ran it, and the one that set the desired state it followed.
    assert [(o["member"], o["set_by"]) for o in operations][:2] == [("m3", "m2"), ("m3", "m1")]
    assert ": deploy of r2 by api through m2 (operation " in operations[0]["reason"]
    history = cli(third.api.url, "history", fleet.model)
    assert history.returncode == 0, history.stderr
    assert "fleet (set by m2)" in history.stdout.splitlines()[1]

    # The CLI: the fleet as a table, and a rollback through one member that waits for all.
    table = cli(third.api.url, "fleet")
    assert table.returncode == 0, table.stderr
    assert f"{fleet.model:<24} r2" in table.stdout
    assert all(f"m{i}" in table.stdout for i in (1, 2, 3))
    back = cli(first.api.url, "rollback", fleet.model, "--wait", "--fleet", "-o", "json")
    assert back.returncode == 0, back.stderr
    assert f"fleet: every live member serves {fleet.model} r1" in back.stderr
    answer = json.loads(back.stdout)  # as the API's "wait": true, "fleet": true would answer
    assert (answer["operation"]["kind"], answer["operation"]["release"]) == ("rollback", "r1")
    assert (answer["fleet"]["desired"], answer["fleet"]["converged"]) == ("r1", True)
    assert {m["member"]: m["release"] for m in answer["fleet"]["members"]} == {
        name: "r1" for name in ("m1", "m2", "m3")
    }
    fleet.wait_serving(fleet.model, "r1", 1.0)
    assert [d["release"] for d in fleet.fleet()["models"][fleet.model]["degraded"]] == ["r2"]
    # Every member holds the fleet's latch: r2 is nobody's fallback now.
    for member in (first, second, third):
        eventually(
            partial(_degraded_is, member, fleet.model, ["r2"]), 30, f"{member.name} latched r2"
        )
    # A person deploys r2 again, through another member: every member lets the latch go, and
    # each one's fallback is the fleet's previous release.
    again = second.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert again.status_code == 200, again.text
    for member in (first, second, third):
        eventually(partial(_degraded_is, member, fleet.model, []), 30, f"{member.name} let r2 go")
        rollback = member.api.get(f"/v1/models/{fleet.model}").json()["rollback"]
        assert rollback["fallback"] == "r1", member.name


def test_the_member_that_moves_the_desired_state_wakes_the_others_long_before_their_poll(
    fleet: Fleet, store: Path
) -> None:
    """With a poll of 5 minutes, fleet deploys through either member are answered in seconds:
    the member that published wakes the others over their APIs (an address each advertises in
    its heartbeat), with no token, and they read the store at once."""
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    slow = {"CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": "300"}
    first, second = (fleet.add(extra_env=slow, token="fleet-secret") for _ in range(2))
    view = fleet.fleet()
    assert {m["member"]: m["url"] for m in view["members"]} == {
        "m1": first.api.url,
        "m2": second.api.url,
    }

    answer = first.api.post(
        f"/v1/models/{fleet.model}/deploy",
        {"release": "r1", "wait": True, "fleet": True, "fleet_timeout_seconds": 90},
    )
    assert answer.status_code == 200, answer.text
    assert fleet.fleet()["models"][fleet.model]["converged"] is True
    back = second.api.post(
        f"/v1/models/{fleet.model}/deploy",
        {"release": "r2", "wait": True, "fleet": True, "fleet_timeout_seconds": 90},
    )
    assert back.status_code == 200, back.text
    fleet.wait_serving(fleet.model, "r2", 2.0)

    # A wake needs no token (it carries nothing) and answers at once, however many come.
    for _ in range(20):
        woken = httpx.post(f"{first.api.url}/v1/fleet/wake", timeout=5)
        assert woken.status_code == 202, woken.text
        assert woken.json() == {"member": "m1", "woken": True}
    # The token still guards what changes anything.
    refused = httpx.post(f"{first.api.url}/v1/models/{fleet.model}/rollback", json={}, timeout=5)
    assert refused.status_code == 401, refused.text
    fleet.wait_serving(fleet.model, "r2", 2.0)


def test_two_daemons_given_one_member_name_are_told_so_until_one_goes(fleet: Fleet) -> None:
    first = fleet.add("twin")
    second = fleet.add("twin")
    bystander = fleet.add("m3")

    for member in (first, second):
        eventually(partial(_conflicted, fleet, member), 60, "the name conflict is seen")
        said = fleet.fleet(via=member)["name_conflict"]
        assert "CONTROLPLANE_FLEET__MEMBER" in said, said
        assert "controlplane_fleet_member_name_conflict 1.0" in member.api.get("/metrics").text
        status = cli(member.api.url, "status")  # no model named: said all the same
        assert "NAME CONFLICT: another daemon writes heartbeats as twin" in status.stderr
    assert "another daemon writes heartbeats as twin" in first.api.log()
    # Any member tells it: behind a Service an operator reaches any pod.
    eventually(partial(_sees_twin_conflict, fleet, bystander), 30, "m3 sees the conflict")
    table = cli(bystander.api.url, "fleet")
    assert "NAME CONFLICT on twin: another daemon writes heartbeats as twin" in table.stdout

    second.api.stop()
    eventually(lambda: not _conflicted(fleet, first), 60, "the conflict ends with the other")
    assert "controlplane_fleet_member_name_conflict 0.0" in first.api.get("/metrics").text
    eventually(lambda: not _sees_twin_conflict(fleet, bystander), 30, "and m3 sees it end")


def test_a_record_no_member_can_read_is_shown_to_operators(fleet: Fleet, store: Path) -> None:
    member = fleet.add()
    broken = store / "_controlplane" / "desired" / f"{fleet.model}.json"
    broken.parent.mkdir(parents=True, exist_ok=True)
    broken.write_text('{"model": "fleetmodel", "generation": ')  # a hand edit gone wrong

    [shown] = fleet.fleet(via=member)["unreadable_records"]
    assert shown["record"] == str(broken)
    assert "no member acts on this model until it is fixed" in shown["error"]
    table = cli(member.api.url, "fleet")
    assert table.returncode == 0, table.stderr
    assert f"REFUSED RECORD (not_json): the desired-state record {broken}" in table.stdout

    broken.unlink()
    assert fleet.fleet(via=member)["unreadable_records"] == []


def test_records_written_by_hand_with_nan_or_a_time_without_a_zone_are_listed_not_a_500(
    fleet: Fleet, store: Path
) -> None:
    """Records copied and edited by hand under _controlplane/: a heartbeat with a time
    without a zone or a NaN interval, a desired state baking since a time without a zone or
    for NaN seconds. GET /v1/fleet answered 500 internal_error and the fleet-sync job kept
    restarting; each is now an unreadable record, and the fleet goes on."""
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    member = fleet.add()
    assert member.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)
    records = store / "_controlplane"
    before = _fleet_sync(member)
    assert before["state"] == "running", before

    beat = json.loads((records / "members" / "m1.json").read_text())
    wanted = json.loads((records / "desired" / f"{fleet.model}.json").read_text())
    rolling = {"phase": "baking", "canaries": ["m1"], "stable": "r1", "bake_seconds": 5}
    broken = {
        "members/naive.json": {**beat, "member": "naive", "at": "2026-01-01T00:00:00"},
        "members/nan.json": {**beat, "member": "nan", "interval": math.nan},
        "desired/naive.json": {
            **wanted,
            "model": "naive",
            "rollout": {**rolling, "baking_since": "2026-01-01T00:00:00"},
        },
        "desired/nan.json": {
            **wanted,
            "model": "nan",
            "rollout": {**rolling, "baking_since": wanted["set_at"], "bake_seconds": math.nan},
        },
    }
    for name, record in broken.items():
        (records / name).write_text(json.dumps(record))  # Python writes NaN as it is: NaN

    _two_passes(member, fleet.model)
    view = member.api.get("/v1/fleet")
    assert view.status_code == 200, view.text
    listed = {r["record"]: r["error"] for r in view.json()["unreadable_records"]}
    assert sorted(listed) == sorted(str(records / name) for name in broken)
    assert "time without a zone" in listed[str(records / "members" / "naive.json")]
    assert "NaN" in listed[str(records / "desired" / "nan.json")]
    assert [m["member"] for m in view.json()["members"]] == ["m1"]

    # A deploy still works, and waits for the fleet (whose view holds the bad records).
    answer = member.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    fleet.wait_serving(fleet.model, "r2", 2.0)
    # The model's own record broken by hand: the member keeps serving what it has.
    (records / "desired" / f"{fleet.model}.json").write_text(
        json.dumps({**wanted, "generation": 1e400})  # JSON's 1e400 is infinity to Python
    )
    _two_passes(member, fleet.model)
    view = member.api.get("/v1/fleet")
    assert view.status_code == 200, view.text
    assert len(view.json()["unreadable_records"]) == len(broken) + 1
    assert member.api.get("/readyz").status_code == 200
    assert member.answer(fleet.model) == 2.0
    after = _fleet_sync(member)
    assert (after["state"], after["restarts"]) == ("running", before["restarts"]), after
    assert "unexpected error while answering a request" not in member.api.log()


def test_a_heartbeat_from_the_future_and_a_generation_put_back_are_said_not_followed(
    fleet: Fleet, store: Path
) -> None:
    """Found from outside: a dead member whose heartbeat was dated 2099 stayed alive for ever
    (every --fleet deploy waited on it to its timeout), and a desired state put back to an
    older generation (a restored backup, a lagging replica) moved the fleet back without a
    word. A beat lives by when it landed in the store (the file's mtime), whatever its date."""
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    member = fleet.add()
    records = store / "_controlplane"
    assert member.api.deploy(fleet.model, "r1").status_code == 200
    older = (records / "desired" / f"{fleet.model}.json").read_text()  # generation 1
    assert member.api.deploy(fleet.model, "r2").status_code == 200
    beat = json.loads((records / "members" / "m1.json").read_text())
    ahead = {**beat, "member": "ghost", "incarnation": "ghost-1", "at": "2099-01-01T00:00:00+00:00"}
    (records / "members" / "ghost.json").write_text(json.dumps(ahead))
    (records / "desired" / f"{fleet.model}.json").write_text(older)

    _two_passes(member, fleet.model)

    view = fleet.fleet(via=member)
    said = {r["record"].rsplit("/", 2)[-1]: r["error"] for r in view["unreadable_records"]}
    assert "went back from generation 2" in said[f"{fleet.model}.json"], said
    [ghost] = [m for m in view["members"] if m["member"] == "ghost"]
    assert ghost["clock_ahead_seconds"] > 70 * 365 * 86400, ghost  # said, not believed
    assert "its clock is" in cli(member.api.url, "fleet").stdout
    # Alive for three keepalives after it landed (and the timestamps' slack), then dead.
    eventually(
        lambda: not _alive(fleet, member)["ghost"],
        3 * BEAT + 2 + 10,
        "the ghost being seen dead three keepalives after its beat landed",
    )
    assert _alive(fleet, member) == {"m1": True, "ghost": False}
    view = fleet.fleet(via=member)
    assert view["models"][fleet.model]["desired"] == "r2"
    assert member.answer(fleet.model) == 2.0  # not moved back
    assert "went back from generation 2" in member.api.log()
    # A deploy writes a new generation over the one put back, and the fleet wait ends.
    answer = member.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r1", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    assert member.answer(fleet.model) == 1.0


def test_a_null_release_written_by_hand_unloads_nothing_while_the_other_models_converge(
    fleet: Fleet, store: Path
) -> None:
    """Found by attacking a fleet from outside with write access to the bucket:
    ``"release": null`` written into a model's desired-state record unloaded it on every
    member. Such a record is now malformed: listed, logged and ignored, each member keeps
    serving what it has, and the other models go on converging; an unload through the API
    still unloads everywhere."""
    other = f"{fleet.model}-b"
    for model in (fleet.model, other):
        write_scale_release(store, model, "r1", k=1.0)
    write_scale_release(store, other, "r2", k=2.0)
    first, second = fleet.add(), fleet.add()
    for model in (fleet.model, other):
        answer = first.api.post(
            f"/v1/models/{model}/deploy", {"release": "r1", "wait": True, "fleet": True}
        )
        assert answer.status_code == 200, answer.text
    record = store / "_controlplane" / "desired" / f"{fleet.model}.json"
    wanted = json.loads(record.read_text())
    edited = {**wanted, "release": None, "generation": wanted["generation"] + 1}
    record.write_text(json.dumps(edited))

    for member in (first, second):
        _two_passes(member, fleet.model)
        [shown] = fleet.fleet(via=member)["unreadable_records"]
        assert shown["record"] == str(record)
        assert "release is null but the record is no unload" in shown["error"], shown
        assert member.answer(fleet.model) == 1.0
        assert member.api.get(f"/v1/models/{fleet.model}").json()["active_release"] == "r1"
        assert "release is null but the record is no unload" in member.api.log()
    status = cli(first.api.url, "status", fleet.model)
    assert status.returncode == 0, status.stderr
    assert "fleet:     REFUSED RECORD" in status.stdout, status.stdout
    assert "release is null but the record is no unload" in status.stdout
    everything = cli(first.api.url, "status")  # what is wrong, on stderr above the models
    assert "REFUSED RECORD" in everything.stderr, everything.stderr

    # The other model follows a deploy, and an unload through the API, on every member.
    answer = second.api.post(
        f"/v1/models/{other}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    fleet.wait_serving(other, "r2", 2.0)
    answer = second.api.post(f"/v1/models/{other}/unload", {"wait": True, "fleet": True})
    assert answer.status_code == 200, answer.text
    assert {m["member"]: m["state"] for m in answer.json()["fleet"]["members"]} == {
        "m1": "unloaded",
        "m2": "unloaded",
    }
    for member in (first, second):
        assert member.api.get(f"/v1/models/{other}").json()["active_release"] is None
        assert member.answer(fleet.model) == 1.0


def test_a_desired_state_below_the_floor_is_refused_while_every_member_keeps_serving(
    fleet: Fleet, store: Path
) -> None:
    """Write access to the bucket can move a fleet back to an older release, signed or not, by
    writing it into the desired state. With the model's min_release above it, each member
    refuses it (release_below_floor, in its heartbeat and log) and keeps serving what it has;
    a deploy of it through the API is refused the same way."""
    for release, k in (("r1", 1.0), ("r2", 2.0), ("r3", 3.0)):
        write_scale_release(store, fleet.model, release, k=k)
    floor = f"models:\n  {fleet.model}:\n    min_release: r2\n"
    first, second = fleet.add(config=floor), fleet.add(config=floor)
    answer = first.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r3", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text

    refused = second.api.deploy(fleet.model, "r1")
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "release_below_floor"
    assert "sorts before the model's min_release 'r2'" in refused.json()["error"]["message"]

    record = store / "_controlplane" / "desired" / f"{fleet.model}.json"
    wanted = json.loads(record.read_text())
    downgrade = {
        **wanted,
        "release": "r1",
        "previous": "r3",
        "generation": wanted["generation"] + 1,
    }
    record.write_text(json.dumps(downgrade))

    def refused_by_both() -> bool:
        view = fleet.fleet(via=first)
        states = [m["models"].get(fleet.model) or {} for m in view["members"]]
        return len(states) == 2 and all(
            s.get("state") == "failed" and "release_below_floor" in (s.get("error") or "")
            for s in states
        )

    eventually(refused_by_both, 30, "both members refuse the release below the floor")
    for member in (first, second):
        assert member.answer(fleet.model) == 3.0
        assert member.api.get(f"/v1/models/{fleet.model}").json()["active_release"] == "r3"
        assert "sorts before the model's min_release 'r2'" in member.api.log()
    # At the floor, a deploy through the API moves the fleet on.
    answer = second.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    fleet.wait_serving(fleet.model, "r2", 2.0)


def _alive(fleet: Fleet, member: Member) -> dict[str, bool]:
    return {m["member"]: m["alive"] for m in fleet.fleet(via=member)["members"]}


def _two_passes(member: Member, model: str) -> None:
    """Until the member's fleet sync has read the store twice since now (each pass does all
    it does with what it read before the next one reads)."""
    seen: set[object] = set()

    def read_again() -> bool:
        seen.add(member.api.get(f"/v1/models/{model}").json()["fleet"]["last_read"])
        return len(seen) >= 3

    eventually(read_again, 30, f"{member.name} reading the fleet's records twice", every=0.1)


def _fleet_sync(member: Member) -> dict[str, object]:
    jobs = member.api.get("/healthz").json()["jobs"]
    [job] = [j for j in jobs if j["name"] == "fleet-sync"]
    return dict(job)


def _conflicted(fleet: Fleet, member: Member) -> bool:
    return fleet.fleet(via=member)["name_conflict"] is not None


def _sees_twin_conflict(fleet: Fleet, member: Member) -> bool:
    twins = [m for m in fleet.fleet(via=member)["members"] if m["member"] == "twin"]
    return bool(twins) and twins[0]["name_conflict"] is not None


def _degraded_is(member: Member, model: str, releases: list[str]) -> bool:
    rollback = member.api.get(f"/v1/models/{model}").json()["rollback"]
    return sorted(d["release"] for d in rollback["degraded"]) == releases


def test_a_release_that_fails_on_the_receiving_member_reaches_no_other(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "bad", k=3.0, fail_init=True)
    first, second = fleet.add(), fleet.add()
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)

    refused = cli(second.api.url, "deploy", fleet.model, "bad", "--wait", "--fleet")
    assert refused.returncode == 1
    assert "triton_load_failed" in refused.stderr
    view = fleet.fleet()
    assert view["models"][fleet.model]["desired"] == "r1"
    assert view["models"][fleet.model]["generation"] == 1
    # Nothing moved: both members keep serving r1, and the first never tried the bad release.
    fleet.wait_serving(fleet.model, "r1", 1.0)
    operations = first.api.get(f"/v1/operations?model={fleet.model}").json()["operations"]
    assert [o["release"] for o in operations] == ["r1"]


def test_a_member_that_cannot_serve_the_release_keeps_serving_and_reports_why(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    release = write_scale_release(store, fleet.model, "r2", k=2.0)
    (release / "1" / "weights.bin").write_bytes(b"\0" * 64 * 1024)  # r2 is the larger one
    write_sha256sums(release)
    first = fleet.add()
    small = sum(p.stat().st_size for p in release.rglob("*") if p.is_file()) - 1
    # This member refuses releases as large as r2: r2 serves everywhere else.
    tight = fleet.add(extra_env={"CONTROLPLANE_STORE__MAX_RELEASE_BYTES": str(small)})
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)

    answer = first.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert answer.status_code == 502, answer.text
    assert answer.json()["error"]["code"] == "member_failed"
    assert "m2: release_too_large" in answer.json()["error"]["message"]
    members = {m["member"]: m for m in answer.json()["fleet"]["members"]}
    assert (members["m1"]["release"], members["m1"]["state"]) == ("r2", "serving")
    assert (members["m2"]["release"], members["m2"]["state"]) == ("r1", "failed")
    assert tight.answer(fleet.model) == 1.0  # it keeps serving what it had
    assert fleet.fleet()["models"][fleet.model]["converged"] is False

    # It tries again, later each time: the second failure comes after a longer wait.
    def failures() -> list[dict[str, object]]:
        operations = tight.api.get(f"/v1/operations?model={fleet.model}").json()["operations"]
        return [o for o in operations if o["release"] == "r2" and o["status"] == "failed"]

    eventually(lambda: len(failures()) >= 3, 60, "three attempts at r2", every=0.2)
    times = sorted(datetime.fromisoformat(str(o["created_at"])) for o in failures())
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert gaps[1] > gaps[0]
    assert tight.answer(fleet.model) == 1.0


def test_the_cli_says_which_member_failed_and_exits_1_whether_or_not_the_release_serves_here(
    fleet: Fleet, store: Path
) -> None:
    """``deploy --wait --fleet`` when another member cannot serve the release: the CLI names
    that member and why, and exits 1, both on the first try (this member deploys it) and on a
    retry (it serves here already: the API answers ``unchanged``, with a ``message``), in the
    table and in JSON."""
    write_scale_release(store, fleet.model, "r1", k=1.0)
    release = write_scale_release(store, fleet.model, "r2", k=2.0)
    (release / "1" / "weights.bin").write_bytes(b"\0" * 64 * 1024)
    write_sha256sums(release)
    first = fleet.add()
    small = sum(p.stat().st_size for p in release.rglob("*") if p.is_file()) - 1
    fleet.add(extra_env={"CONTROLPLANE_STORE__MAX_RELEASE_BYTES": str(small)})
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)

    for attempt in ("first", "retry"):
        told = cli(
            first.api.url, "deploy", fleet.model, "r2", "--wait", "--fleet", "--timeout", "120"
        )
        assert told.returncode == 1, (attempt, told.stdout, told.stderr)
        assert "Traceback" not in told.stderr, (attempt, told.stderr)
        assert "error: member_failed: m2: release_too_large" in told.stderr, (attempt, told.stderr)
        if attempt == "retry":
            assert f"unchanged: {fleet.model} serves r2 already" in told.stdout, told.stdout

    machine = cli(first.api.url, "deploy", fleet.model, "r2", "--wait", "--fleet", "-o", "json")
    assert machine.returncode == 1, machine.stderr
    assert "Traceback" not in machine.stderr, machine.stderr
    answer = json.loads(machine.stdout)  # one document: the error beside the API's answer
    assert answer["error"]["code"] == "member_failed"
    assert answer["error"]["message"].startswith("m2: release_too_large")
    assert (answer["unchanged"], answer["release"]) == (True, "r2")
    members = {m["member"]: (m["release"], m["state"]) for m in answer["fleet"]["members"]}
    assert members == {"m1": ("r2", "serving"), "m2": ("r1", "failed")}


def test_a_new_member_serves_the_desired_release_before_it_is_ready(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0, init_sleep=2.0)
    first = fleet.add()
    assert first.api.deploy(fleet.model, "r1").status_code == 200

    late = fleet.add("late", wait_ready=False)
    eventually(lambda: _ready(late), 120, "the new member is ready", every=0.05)
    # Ready means it serves what the fleet does: it answers at once.
    assert late.answer(fleet.model) == 1.0
    view = fleet.fleet(via=late)
    assert view["models"][fleet.model]["converged"] is True


def test_a_member_that_starts_during_a_long_load_beats_and_is_ready_on_the_current_release(
    fleet: Fleet, store: Path
) -> None:
    """Found from outside: a member that started while the fleet wanted a slow release wrote
    no heartbeat until that load ended, so a --fleet deploy meanwhile said "every live member
    serves" without it, and it turned ready on the release the fleet had left."""
    write_scale_release(store, fleet.model, "slow", k=1.0, init_sleep=8.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    first = fleet.add()
    assert first.api.deploy(fleet.model, "slow").status_code == 200
    late = fleet.add("late", wait_ready=False)
    eventually(lambda: _seen(fleet, first, "late") == "converging", 30, "late beating, loading")
    with ThreadPoolExecutor(1) as pool:
        readiness = pool.submit(_first_ready_answer, late, fleet.model, 120.0)

        answer = first.api.post(
            f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
        )

        assert answer.status_code == 200, answer.text
        members = {m["member"]: m for m in answer.json()["fleet"]["members"]}
        assert (members["late"]["release"], members["late"]["state"]) == ("r2", "serving")
        assert late.answer(fleet.model) == 2.0
        # Ready only once it serves what the fleet wants now, never on the release it left.
        assert readiness.result() == 2.0


def _seen(fleet: Fleet, via: Member, member: str) -> str | None:
    """What ``via``'s fleet view says of ``member`` for the fleet's model (None: not alive)."""
    for seen in fleet.fleet(via=via)["members"]:
        if seen["member"] == member and seen["alive"]:
            return str(seen["models"].get(fleet.model, {}).get("state", "starting"))
    return None


def _first_ready_answer(member: Member, model: str, timeout: float) -> float:
    """What ``member`` answers the moment its /readyz first says 200."""
    deadline = time.monotonic() + timeout
    while not _ready(member):
        assert time.monotonic() < deadline, f"{member.name} not ready after {timeout} s"
        time.sleep(0.05)
    return member.answer(model)


def _ready(member: Member) -> bool:
    try:
        return member.api.get("/readyz").status_code == 200
    except Exception:
        return False


# --- progressive rollout and automatic rollback --------------------------------------------

WINDOW, INTERVAL = 3.0, 0.5


def _rollback_config(model: str, *, canaries: int = 0, bake: float = 0.0) -> str:
    return (
        "rollback:\n"
        f"  window_seconds: {WINDOW}\n"
        f"  interval_seconds: {INTERVAL}\n"
        "  cpu_budget_seconds: 10\n"
        "models:\n"
        f"  {model}:\n"
        "    retire_after_seconds: 600\n"
        "    drain_timeout_seconds: 5\n"
        f"    rollout: {{canary_members: {canaries}, bake_seconds: {bake}}}\n"
    )


@pytest.fixture
def exporters() -> Iterator[dict[str, GpuExporter]]:
    """One GPU exporter per member (m1..m3), each at a healthy 0.30."""
    with GpuExporter() as m1, GpuExporter() as m2, GpuExporter() as m3:
        found = {"m1": m1, "m2": m2, "m3": m3}
        for exporter in found.values():
            exporter.set(gpu0=0.30)
        yield found


def _add_watched(fleet: Fleet, exporters: dict[str, GpuExporter], config: str) -> list[Member]:
    return [
        fleet.add(
            name,
            config=config,
            extra_env={"CONTROLPLANE_ROLLBACK__METRICS_URL": exporters[name].url},
        )
        for name in ("m1", "m2", "m3")
    ]


def _releases_seen(member: Member, model: str) -> set[str]:
    operations = member.api.get(f"/v1/operations?model={model}&limit=50").json()["operations"]
    return {o["release"] for o in operations if o["release"]}


def test_a_canary_rollout_bakes_on_one_member_before_the_others_follow(
    fleet: Fleet, store: Path, exporters: dict[str, GpuExporter]
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    bake = 4.0
    first, second, _third = _add_watched(
        fleet, exporters, _rollback_config(fleet.model, canaries=1, bake=bake)
    )
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)

    began = time.monotonic()
    answer = second.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    took = time.monotonic() - began
    assert answer.status_code == 200, answer.text
    assert answer.json()["fleet"]["phase"] == "complete"
    assert answer.json()["fleet"]["canaries"] == ["m2"]
    assert took >= bake  # the rest waited for the bake
    fleet.wait_serving(fleet.model, "r2", 2.0)
    # The publish step said which member was the canary.
    publish = [s for s in answer.json()["operation"]["steps"] if s["name"] == "publish"]
    assert publish[0]["detail"]["phase"] == "canary"


def test_a_canary_replaced_during_its_bake_hands_the_bake_to_a_live_member_which_ends_it(
    fleet: Fleet, store: Path
) -> None:
    """The canary's pod goes away mid-bake and a pod with another name comes in its place: a
    live member that was not a canary takes the canary's place, serves the release, bakes it
    the whole bake again, and then every member follows."""
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    bake = 8.0
    config = _rollback_config(fleet.model, canaries=1, bake=bake)
    first, second, third = (fleet.add(name, config=config) for name in ("m1", "m2", "m3"))
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)
    assert second.api.deploy(fleet.model, "r2").status_code == 200  # m2 goes first: the canary
    eventually(lambda: fleet.fleet()["models"][fleet.model]["phase"] == "baking", 30, "m2 baking")

    second.api.stop()  # its pod is gone; another takes its place, under a new name
    stopped = time.monotonic()
    fourth = fleet.add("m4", config=config)

    def complete() -> bool:
        return bool(fleet.fleet()["models"][fleet.model]["phase"] == "complete")

    eventually(complete, 60, "the rollout complete without its first canary")
    took = time.monotonic() - stopped
    model = fleet.fleet()["models"][fleet.model]
    assert (model["desired"], model["canaries"]) == ("r2", ["m1"])
    assert took >= bake  # m1 baked it the whole bake, from the start
    for member in (first, third, fourth):
        eventually(partial(_answers, member, fleet.model, 2.0), 60, f"{member.name} serves r2")
    # Who took over, and why, is on record.
    assert any(
        "canary m2 is gone" in (o.get("reason") or "")
        for o in first.api.get(f"/v1/operations?model={fleet.model}").json()["operations"]
    )


def _answers(member: Member, model: str, value: float) -> bool:
    try:
        return member.answer(model) == value
    except Exception:
        return False


def test_a_breach_on_the_canary_rolls_it_back_and_the_release_reaches_no_other(
    fleet: Fleet, store: Path, exporters: dict[str, GpuExporter]
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    first, second, third = _add_watched(
        fleet, exporters, _rollback_config(fleet.model, canaries=1, bake=600)
    )
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)

    answer = second.api.deploy(fleet.model, "r2")  # this member goes first: the canary
    assert answer.status_code == 200, answer.text
    eventually(
        lambda: fleet.fleet()["models"][fleet.model]["phase"] == "baking", 30, "the canary baking"
    )
    assert [m.answer(fleet.model) for m in (first, second, third)] == [1.0, 2.0, 1.0]

    exporters["m2"].set(gpu0=0.99)
    eventually(
        lambda: fleet.fleet()["models"][fleet.model]["phase"] == "rolled_back",
        WINDOW + 30,
        "the rollout rolled back",
    )
    fleet.wait_serving(fleet.model, "r1", 1.0)
    model = fleet.fleet(via=third)["models"][fleet.model]
    assert model["desired"] == "r1"
    assert [d["release"] for d in model["degraded"]] == ["r2"]
    assert "m2" in (model["rollout_note"] or "")
    # The release never reached the members that were not canaries.
    assert "r2" not in _releases_seen(first, fleet.model)
    assert "r2" not in _releases_seen(third, fleet.model)


def _phase_is(fleet: Fleet, phase: str) -> bool:
    return bool(fleet.fleet()["models"][fleet.model]["phase"] == phase)


def test_a_rollback_during_a_bake_through_any_member_goes_back_to_the_stable_release(
    fleet: Fleet, store: Path
) -> None:
    """Whichever member answers it, canary or not, a rollback while a canary bakes sends the
    fleet back to the stable release and latches the canary's: never to the answering
    member's own previous release, and never latching the stable release it serves."""
    for k, release in enumerate(("r1", "r2", "r3"), start=1):
        write_scale_release(store, fleet.model, release, k=float(k))
    config = _rollback_config(fleet.model, canaries=1, bake=600)
    first, second = (fleet.add(name, config=config) for name in ("m1", "m2"))
    assert first.api.deploy(fleet.model, "r1").status_code == 200  # a first release: everywhere
    fleet.wait_serving(fleet.model, "r1", 1.0)
    rollback = f"/v1/models/{fleet.model}/rollback"

    # Through the canary itself: r2 bakes on m2, which rolls it back, and waits for the fleet.
    assert second.api.deploy(fleet.model, "r2").status_code == 200  # m2 goes first: the canary
    eventually(partial(_phase_is, fleet, "baking"), 30, "r2 baking on m2")
    answer = second.api.post(rollback, {"wait": True, "fleet": True})
    assert answer.status_code == 200, answer.text
    operation = answer.json()["operation"]
    assert (operation["release"], operation["from_release"]) == ("r1", "r2")
    said = "rolled back the canary r2 to the stable r1 during its bake"
    assert operation["detail"]["rollout"] == said
    assert answer.json()["fleet"]["desired"] == "r1"
    fleet.wait_serving(fleet.model, "r1", 1.0)

    # m2 served r2 before r1: its own previous is r2 now. r3 bakes on m1, and m2, which is no
    # canary and serves the stable r1, answers the rollback.
    assert first.api.deploy(fleet.model, "r3").status_code == 200  # m1 goes first: the canary
    eventually(partial(_phase_is, fleet, "baking"), 30, "r3 baking on m1")
    assert [m.answer(fleet.model) for m in (first, second)] == [3.0, 1.0]
    answer = second.api.post(rollback, {"wait": True})
    assert answer.status_code == 200, answer.text
    operation = answer.json()["operation"]
    assert (operation["release"], operation["status"]) == ("r1", "succeeded")
    assert operation["detail"]["rollout"] == (
        "rolled back the canary r3 to the stable r1 during its bake"
    )
    fleet.wait_serving(fleet.model, "r1", 1.0)
    model = fleet.fleet()["models"][fleet.model]
    assert (model["desired"], model["phase"], model["set_by"]) == ("r1", "rolled_back", "m2")
    assert sorted(d["release"] for d in model["degraded"]) == ["r2", "r3"]
    assert "rolled back the canary r3 to the stable r1 during its bake" in model["rollout_note"]
    assert "r2" not in _releases_seen(first, fleet.model)  # m2's own previous went nowhere


def test_an_alert_on_a_member_that_is_no_canary_during_a_bake_rolls_the_canary_back(
    fleet: Fleet, store: Path
) -> None:
    """An alert sent to any member (Alertmanager calls one address for the whole fleet) while a
    canary bakes stops the bake: the fleet goes back to the stable release, and the canary's
    is latched; the member that received it serves the stable release already."""
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    config = _rollback_config(fleet.model, canaries=1, bake=600)
    first, second = (fleet.add(name, config=config) for name in ("m1", "m2"))
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)
    assert first.api.deploy(fleet.model, "r2").status_code == 200  # m1 goes first: the canary
    eventually(partial(_phase_is, fleet, "baking"), 30, "r2 baking on m1")

    alert = second.api.post("/v1/alerts", notification(model=fleet.model))
    assert alert.status_code == 200, alert.text
    eventually(partial(_phase_is, fleet, "rolled_back"), 30, "the bake stopped")
    fleet.wait_serving(fleet.model, "r1", 1.0)
    model = fleet.fleet()["models"][fleet.model]
    assert (model["desired"], model["set_by"]) == ("r1", "m2")
    assert [d["release"] for d in model["degraded"]] == ["r2"]
    last = second.api.get(f"/v1/models/{fleet.model}").json()["rollback"]["last"]
    assert (last["outcome"], last["from_release"], last["to_release"]) == ("fallback", "r2", "r1")
    # What it knew of the rollout when it acted (its fleet sync's last read), and what it
    # wrote for the fleet, read again as it wrote it.
    assert last["detail"]["rollout"].startswith("rolled back the canary r2 to the stable r1")
    said = "rolled back the canary r2 to the stable r1 during its bake"
    assert said in model["rollout_note"]
    for member in (first, second):  # r1 is nobody's latch; r2 is everybody's
        eventually(partial(_degraded_is, member, fleet.model, ["r2"]), 30, f"{member.name} r2")


def test_overload_on_one_member_brings_every_member_back_to_the_fallback(
    fleet: Fleet, store: Path, exporters: dict[str, GpuExporter]
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    first, _second, third = _add_watched(fleet, exporters, _rollback_config(fleet.model))
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    answer = first.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    fleet.wait_serving(fleet.model, "r2", 2.0)

    with LoadGenerator(first.triton.grpc_url, fleet.model, clients=2) as load:
        load.wait_for_answers(5)
        exporters["m3"].set(gpu0=0.99)  # only m3's GPUs are hot
        fleet.wait_serving(fleet.model, "r1", 1.0, timeout=WINDOW + 60)
        load.wait_for_answers(5)
    assert [e for log in load.logs for e in log.errors] == []
    model = fleet.fleet()["models"][fleet.model]
    assert (model["desired"], model["set_by"]) == ("r1", "m3")
    assert [d["release"] for d in model["degraded"]] == ["r2"]
    rollback = third.api.get(f"/v1/models/{fleet.model}").json()["rollback"]["last"]
    assert rollback["outcome"] == "fallback"
    assert "generation" in rollback["detail"]["fleet"]


def test_member_scope_rolls_back_only_the_member_that_saw_the_overload(
    fleet: Fleet, store: Path, exporters: dict[str, GpuExporter]
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    config = _rollback_config(fleet.model).replace("rollback:\n", "rollback:\n  scope: member\n")
    first, second, third = _add_watched(fleet, exporters, config)
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    answer = first.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text

    exporters["m3"].set(gpu0=0.99)
    eventually(lambda: third.answer(fleet.model) == 1.0, WINDOW + 30, "m3 back on r1")
    # It stays there (held), while the fleet still wants r2 and the others serve it.
    eventually(lambda: _member_state(fleet, "m3") == ("r1", "held"), 30, "m3 reporting it holds r1")
    assert fleet.fleet()["models"][fleet.model]["desired"] == "r2"
    assert [m.answer(fleet.model) for m in (first, second, third)] == [2.0, 2.0, 1.0]

    # Someone deploys r2 again (it serves on m1 already): a new decision, which m3 follows.
    exporters["m3"].set(gpu0=0.30)
    again = first.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
    )
    assert again.status_code == 200, again.text
    fleet.wait_serving(fleet.model, "r2", 2.0)


def _member_state(fleet: Fleet, member: str) -> tuple[str | None, str | None]:
    for found in fleet.fleet()["members"]:
        if found["member"] == member:
            state = found["models"].get(fleet.model) or {}
            return state.get("release"), state.get("state")
    return None, None


# --- crashes and races ------------------------------------------------------------------


def test_a_member_killed_during_a_rollout_converges_after_its_restart(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0, init_sleep=3.0)
    first, _second, third = (fleet.add() for _ in range(3))
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)

    assert first.api.deploy(fleet.model, "r2", wait=False).status_code == 202

    def following() -> bool:
        operations = third.api.get(f"/v1/operations?model={fleet.model}").json()["operations"]
        return any(
            o["release"] == "r2" and o["trigger"] == "fleet" and o["status"] == "running"
            for o in operations
        )

    eventually(following, 60, "m3 following the fleet to r2", every=0.05)
    third.api.kill()  # mid-load: the release half-placed or loading in its Triton
    fleet.start(third)
    fleet.wait_serving(fleet.model, "r2", 2.0)
    assert fleet.fleet()["models"][fleet.model]["converged"] is True


def test_two_members_racing_to_set_the_desired_state_one_wins_and_the_other_is_told(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0, init_sleep=1.0)
    write_scale_release(store, fleet.model, "r3", k=3.0, init_sleep=2.0)
    first, second = fleet.add(), fleet.add()
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    fleet.wait_serving(fleet.model, "r1", 1.0)

    # Both start from generation 1; r2 loads faster and publishes first.
    with first.api.client() as one, second.api.client() as other, ThreadPoolExecutor(2) as pool:
        path = f"/v1/models/{fleet.model}/deploy"
        fast = pool.submit(one.post, path, json={"release": "r2", "wait": True})
        slow = pool.submit(other.post, path, json={"release": "r3", "wait": True})
        won, lost = fast.result(), slow.result()
    assert won.status_code == 200, won.text
    assert lost.status_code == 409, lost.text
    error = lost.json()["error"]
    assert error["code"] == "desired_state_conflict"
    assert "set by m1" in error["message"]
    # It says what happened here: the store's record is untouched, but this member served r3.
    assert "this request did not change the desired state" in error["message"]
    assert "This member (m2) served r3 before it lost the race" in error["message"]
    assert "goes back to what the fleet wants (r2)" in error["message"]
    # Nothing is lost: the loser's operation is on record, and the fleet serves the winner.
    steps = [s["name"] for s in lost.json()["operation"]["steps"]]
    assert steps[-1] == "publish"
    fleet.wait_serving(fleet.model, "r2", 2.0)
    assert fleet.fleet()["models"][fleet.model]["generation"] == 2


def test_a_member_that_lost_its_journal_serves_on_without_a_failed_request(
    fleet: Fleet, store: Path
) -> None:
    """The journal (SQLite) is history, not what should serve: a member restarted without it
    (a new emptyDir) keeps serving, takes the fleet's release back, and fails no request."""
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    member = fleet.add()
    assert member.api.deploy(fleet.model, "r1").status_code == 200
    assert member.api.deploy(fleet.model, "r2").status_code == 200

    with LoadGenerator(member.triton.grpc_url, fleet.model, clients=2) as load:
        load.wait_for_answers(5)
        member.api.kill()
        member.api.database.unlink()
        for leftover in member.api.database.parent.glob(member.api.database.name + "-*"):
            leftover.unlink()  # its WAL and shared-memory files too
        fleet.start(member)
        eventually(lambda: _serves_r2(member, fleet.model), 60, "the member recording r2 again")
        load.wait_for_answers(5)
    assert [e for log in load.logs for e in log.errors] == []
    assert {a for log in load.logs for a in log.answers} == {2.0}
    assert fleet.fleet()["models"][fleet.model]["converged"] is True

    # What served before is the fleet's, which the journal's loss did not take: the view says
    # so, and a rollback "to previous" goes exactly where the view said.
    caught_up = partial(_caught_up, member, fleet.model)
    eventually(caught_up, 30, "the member's catch-up operation (trigger fleet) ending")
    assert member.api.get(f"/v1/models/{fleet.model}").json()["previous_release"] == "r1"
    rolled = member.api.post(f"/v1/models/{fleet.model}/rollback", {"to": "previous", "wait": True})
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["operation"]["release"] == "r1"
    assert member.answer(fleet.model) == 1.0


def _caught_up(member: Member, model: str) -> bool:
    """The fleet's catch-up has run and nothing runs now. Idle alone is not enough: the start-up
    reconcile records r2 before the fleet's sync starts its operation."""
    if member.api.get(f"/v1/models/{model}").json()["running_operation"] is not None:
        return False
    done = member.api.get(f"/v1/operations?model={model}").json()["operations"]
    return any(op["trigger"] == "fleet" and op["status"] == "succeeded" for op in done)


def _serves_r2(member: Member, model: str) -> bool:
    found: object = member.api.get(f"/v1/models/{model}").json().get("active_release")
    return found == "r2"
