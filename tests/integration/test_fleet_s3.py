"""A fleet on an S3 store (moto's server over loopback HTTP): three real Tritons and their
daemons share one bucket. One member reaches the bucket through a fault proxy, so that the
store can go away for it alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.integration.test_cli import cli
from tests.support.fault_proxy import FaultProxy
from tests.support.fleet import Fleet, Member, running_fleet
from tests.support.inference import LoadGenerator
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import aws_env, upload_release_dir
from tests.support.s3_fixtures import fault_proxy, moto_endpoint, s3_bucket  # noqa: F401
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton
PREFIX = "models"


@pytest.fixture
def fleet(
    pooled_tritons: Callable[[Path], RunningTriton],
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
) -> Iterator[Fleet]:
    client, bucket = s3_bucket
    model = unique_model("fleets3")
    releases = tmp_path / "releases"
    for release, k in (("r1", 1.0), ("r2", 2.0)):
        release_dir = write_scale_release(releases, model, release, k=k)
        upload_release_dir(client, bucket, PREFIX, release_dir)
    with running_fleet(
        pooled_tritons,
        tmp_path / "unused-local-store",
        tmp_path / "fleet",
        model,
        store_uri=f"s3://{bucket}/{PREFIX}",
        env=aws_env(moto_endpoint),
    ) as running:
        yield running


def test_a_fleet_on_s3_follows_every_deploy_through_any_member(
    fleet: Fleet,
    s3_bucket: tuple[Any, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """One story on one bucket (three Tritons take a while to start): a deploy through one
    member reaches all; another, under load on a third, fails no request; a release that fails
    on the member that received it reaches no other; a member killed mid-rollout converges; a
    new member is ready only once it serves the fleet's release."""
    client, bucket = s3_bucket
    releases = tmp_path / "releases"
    for release, k, broken in (("bad", 9.0, True), ("r3", 3.0, False)):
        release_dir = write_scale_release(
            releases, fleet.model, release, k=k, fail_init=broken, init_sleep=0.0 if broken else 3.0
        )
        upload_release_dir(client, bucket, PREFIX, release_dir)
    first, second, third = (fleet.add() for _ in range(3))

    answer = second.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r1", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    fleet.wait_serving(fleet.model, "r1", 1.0)
    view = fleet.fleet(via=third)
    assert [m["member"] for m in view["members"]] == ["m1", "m2", "m3"]
    assert view["models"][fleet.model]["converged"] is True
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"{PREFIX}/_controlplane/desired/{fleet.model}.json" in keys
    assert {f"{PREFIX}/_controlplane/members/m{i}.json" for i in (1, 2, 3)} <= keys
    assert [m["name"] for m in first.api.get("/v1/models").json()["models"]] == [fleet.model]

    with LoadGenerator(third.triton.grpc_url, fleet.model, clients=2) as load:
        load.wait_for_answers(5)
        answer = first.api.post(
            f"/v1/models/{fleet.model}/deploy", {"release": "r2", "wait": True, "fleet": True}
        )
        assert answer.status_code == 200, answer.text
        load.wait_for_answers(5)
    assert [e for log in load.logs for e in log.errors] == []
    fleet.wait_serving(fleet.model, "r2", 2.0)

    refused = second.api.deploy(fleet.model, "bad")
    assert refused.status_code == 422, refused.text
    assert fleet.fleet()["models"][fleet.model]["desired"] == "r2"
    assert all("bad" not in _releases_seen(m, fleet.model) for m in (first, third))

    assert first.api.deploy(fleet.model, "r3", wait=False).status_code == 202
    eventually(
        lambda: _following(third, fleet.model, "r3"), 60, "m3 following the fleet to r3", every=0.05
    )
    third.api.kill()
    fleet.start(third)
    fleet.wait_serving(fleet.model, "r3", 3.0)

    late = fleet.add("m4", wait_ready=False)
    eventually(lambda: _ready(late), 120, "the new member ready", every=0.05)
    assert late.answer(fleet.model) == 3.0
    assert fleet.fleet(via=late)["models"][fleet.model]["converged"] is True


def _releases_seen(member: Member, model: str) -> set[str]:
    operations = member.api.get(f"/v1/operations?model={model}&limit=50").json()["operations"]
    return {o["release"] for o in operations if o["release"]}


def _following(member: Member, model: str, release: str) -> bool:
    operations = member.api.get(f"/v1/operations?model={model}").json()["operations"]
    return any(
        o["release"] == release and o["trigger"] == "fleet" and o["status"] == "running"
        for o in operations
    )


def _ready(member: Member) -> bool:
    try:
        return member.api.get("/readyz").status_code == 200
    except httpx.HTTPError:
        return False


def test_a_member_that_loses_the_store_keeps_serving_shows_stale_and_catches_up(
    fleet: Fleet,
    fault_proxy: FaultProxy,  # noqa: F811
) -> None:
    first, second = fleet.add(), fleet.add()
    cut_off = fleet.add(extra_env=aws_env(fault_proxy.endpoint))
    answer = first.api.post(
        f"/v1/models/{fleet.model}/deploy", {"release": "r1", "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text

    fault_proxy.go_down()
    eventually(
        lambda: cut_off.api.get(f"/v1/models/{fleet.model}").json()["fleet"]["stale"] is True,
        30,
        "the cut-off member saying it is stale",
    )
    metrics = cut_off.api.get("/metrics").text
    assert "controlplane_fleet_stale 1.0" in metrics
    # No fleet view rather than an old one: it cannot read the heartbeats.
    assert "controlplane_fleet_model_converged{" not in metrics
    assert "controlplane_fleet_members{" not in metrics
    status = cli(cut_off.api.url, "status", fleet.model)
    assert "STALE since" in status.stdout, status.stdout
    last_read = cut_off.api.get("/v1/fleet")  # what it read last, said to be stale
    assert last_read.status_code == 200, last_read.text
    assert last_read.json()["stale"] is True
    assert last_read.json()["models"][fleet.model]["desired"] == "r1"
    assert first.api.deploy(fleet.model, "r2").status_code == 200
    eventually(lambda: second.answer(fleet.model) == 2.0, 60, "the other members following")
    # Still serving what it had, nothing unloaded, and ready: it serves.
    for _ in range(10):
        assert cut_off.answer(fleet.model) == 1.0
    assert cut_off.api.get("/readyz").status_code == 200
    # The others see it as not alive (its heartbeats cannot land): converged counts live ones.
    members = {m["member"]: m["alive"] for m in fleet.fleet()["members"]}
    assert members == {"m1": True, "m2": True, "m3": False}
    seen = first.api.get("/metrics").text
    assert 'controlplane_fleet_members{state="down"} 1.0' in seen
    assert 'controlplane_fleet_members{state="alive"} 2.0' in seen

    fault_proxy.come_back()
    fleet.wait_serving(fleet.model, "r2", 2.0)
    assert cut_off.api.get(f"/v1/models/{fleet.model}").json()["fleet"]["stale"] is False
    assert "controlplane_fleet_stale 0.0" in cut_off.api.get("/metrics").text
    eventually(lambda: fleet.fleet()["models"][fleet.model]["converged"], 30, "converged")
    eventually(
        lambda: (
            f'controlplane_fleet_model_converged{{model="{fleet.model}"}} 1.0'
            in cut_off.api.get("/metrics").text
        ),
        30,
        "the member back in the store seeing the model converged",
    )


def test_a_fleet_wait_whose_member_loses_the_store_waits_it_out_and_concludes_nothing(
    fleet: Fleet,
    fault_proxy: FaultProxy,  # noqa: F811
    s3_bucket: tuple[Any, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Found from outside: the member a `deploy --wait --fleet` went through lost the store
    right after its publish, and the wait answered "every live member serves" from a view of
    itself alone while the others still served the old release."""
    _publish_slow(s3_bucket, tmp_path, fleet.model)
    first, second = fleet.add(), fleet.add()
    through = fleet.add(extra_env=aws_env(fault_proxy.endpoint))
    assert _fleet_deploy(first.api.http, fleet.model, "r1").status_code == 200

    with _waiting_for_slow(through, fleet.model) as waited:
        assert len(through.api.get("/v1/fleet").json()["members"]) == 3  # read once, whole
        fault_proxy.go_down()  # published: the others are loading it (6 s) as the store goes
        eventually(lambda: _fleet_stale(through), 30, "the member seeing the store gone")
        stale = through.api.get("/v1/fleet").json()
        assert stale["models"][fleet.model]["converged"] is False  # it cannot know
        assert {m["member"] for m in stale["members"]} == {"m1", "m2", "m3"}  # as last read
        assert not waited.done()
        fault_proxy.come_back()

    _every_member_serves_slow(waited.result(timeout=120))
    assert first.answer(fleet.model) == second.answer(fleet.model) == 5.0


def test_a_fleet_wait_across_an_outage_of_the_whole_store_waits_for_the_others_to_beat(
    fleet: Fleet,
    fault_proxy: FaultProxy,  # noqa: F811
    s3_bucket: tuple[Any, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Found from outside: the store away for every member for longer than three beats, and
    the first read after it found the others' beats old: the wait through one member said
    "every live member serves" while the others still served the old release."""
    _publish_slow(s3_bucket, tmp_path, fleet.model)
    members = [fleet.add(extra_env=aws_env(fault_proxy.endpoint)) for _ in range(3)]
    through = members[-1]
    assert _fleet_deploy(through.api.http, fleet.model, "r1").status_code == 200

    with _waiting_for_slow(through, fleet.model) as waited:
        fault_proxy.down_for(5.0)  # 5 beats: every member's last beat is old when it is back

    _every_member_serves_slow(waited.result(timeout=120))
    assert [m.answer(fleet.model) for m in members] == [5.0, 5.0, 5.0]


def test_a_member_whose_store_fails_while_it_follows_keeps_converging_and_the_wait_rides_it_out(
    fleet: Fleet,
    fault_proxy: FaultProxy,  # noqa: F811
) -> None:
    """Found by CI: the store away for one member while it fetched what the fleet had just
    published, for longer than its retries: it reported ``failed``, and the fleet wait through
    another member answered ``member_failed`` for an outage. A transient failure is not the
    release's: the member says it is still converging (and why), and tries again soon."""
    first = fleet.add()
    follower = fleet.add(
        extra_env={**aws_env(fault_proxy.endpoint), "CONTROLPLANE_STORE__RETRY_SECONDS": "1"}
    )
    assert _fleet_deploy(first.api.http, fleet.model, "r1").status_code == 200
    fault_proxy.fail_always("drop", key=f"/{fleet.model}/r2/")  # its files only: not the records

    def converging_after_an_outage() -> bool:
        seen = follower.api.get(f"/v1/models/{fleet.model}").json()["fleet"]
        assert seen["state"] != "failed", seen
        return seen["state"] == "converging" and "store_unavailable" in str(seen["error"])

    with first.api.client() as waiting, ThreadPoolExecutor(1) as pool:
        waited = pool.submit(_fleet_deploy, waiting, fleet.model, "r2")
        eventually(converging_after_an_outage, 60, "m2 converging, the outage its note")
        assert not waited.done()
        assert follower.answer(fleet.model) == 1.0  # it serves what it had
        fault_proxy.clear()
        answered = waited.result(timeout=120)

    assert answered.status_code == 200, answered.text
    seen = {m["member"]: (m["release"], m["state"]) for m in answered.json()["fleet"]["members"]}
    assert seen == {"m1": ("r2", "serving"), "m2": ("r2", "serving")}, answered.text
    assert follower.answer(fleet.model) == 2.0


def _publish_slow(bucket_of: tuple[Any, str], tmp_path: Path, model: str) -> None:
    """Release ``slow`` (answers 5x), whose load takes 6 s: the others are still loading it
    when the member a deploy went through has done."""
    client, bucket = bucket_of
    slow = write_scale_release(tmp_path / "slow", model, "slow", k=5.0, init_sleep=6.0)
    upload_release_dir(client, bucket, PREFIX, slow)


def _fleet_deploy(http: httpx.Client, model: str, release: str) -> httpx.Response:
    body = {"release": release, "wait": True, "fleet": True}
    return http.post(f"/v1/models/{model}/deploy", json=body)


@contextmanager
def _waiting_for_slow(through: Member, model: str) -> Iterator[Future[httpx.Response]]:
    """A fleet deploy of ``slow`` through ``through``, waited for on a thread (on a client of
    its own: one httpx client is not shared across threads); entered once it serves there."""
    with through.api.client() as waiting, ThreadPoolExecutor(1) as pool:
        waited = pool.submit(_fleet_deploy, waiting, model, "slow")
        eventually(lambda: _done_here(through, model, "slow"), 60, "slow serving here")
        yield waited
        waited.result(timeout=120)  # before its client closes


def _every_member_serves_slow(answered: httpx.Response) -> None:
    assert answered.status_code == 200, answered.text
    seen = {m["member"]: (m["release"], m["state"]) for m in answered.json()["fleet"]["members"]}
    assert seen == {name: ("slow", "serving") for name in ("m1", "m2", "m3")}, answered.text


def _done_here(member: Member, model: str, release: str) -> bool:
    [last] = member.api.get(f"/v1/operations?model={model}&limit=1").json()["operations"]
    return bool(last["release"] == release and last["status"] == "succeeded")


def _fleet_stale(member: Member) -> bool:
    return member.api.get("/v1/fleet").json()["store_error"] is not None


def test_a_new_member_that_cannot_reach_the_store_is_not_ready_and_says_why(
    fleet: Fleet,
) -> None:
    first = fleet.add()
    assert first.api.deploy(fleet.model, "r1").status_code == 200
    lost = fleet.add(extra_env=aws_env("http://127.0.0.1:9"), wait_ready=False)

    def refused() -> bool:
        try:
            answer = lost.api.get("/readyz")
        except httpx.HTTPError:
            return False
        return answer.status_code == 503 and "desired state" in answer.json()["error"]["message"]

    eventually(refused, 60, "the member saying why it is not ready")
    assert lost.api.get("/healthz").status_code == 200
    status = lost.api.get(f"/v1/models/{fleet.model}")
    assert status.status_code == 404  # it knows nothing of the model: it never read the store
