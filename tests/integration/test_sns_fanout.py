"""The fan-out: the bucket's events go to one SNS topic, and each member makes, and subscribes,
an SQS queue of its own at start. Every member hears every release and every change of the
desired state, with the store polled every 300 s and no wake over HTTP possible (each member
advertises an address nobody answers at); heartbeats reach no queue. moto's S3, SNS and SQS
over HTTP deliver the events (S3 publishes to the topic, SNS sends to the queues), the real
Triton serves."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import pytest

from devtools.launcher import RunningTriton
from tests.support.fleet import Member, running_fleet
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import (
    MANIFEST,
    aws_env,
    notify_topic,
    queued,
    sns_client,
    sqs_client,
    subscribe_queue,
)
from tests.support.s3_fixtures import moto_endpoint, s3_bucket  # noqa: F401
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton
PREFIX = "models"
POLL = 300.0  # no member lists the store or reads the desired state by polling in the test
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: a wake sent there never arrives


def test_every_member_hears_each_release_and_each_change_of_the_desired_state(
    pooled_tritons: Callable[[Path], RunningTriton],
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
) -> None:
    s3, bucket = s3_bucket
    model = unique_model("fanout")
    sqs, sns = sqs_client(moto_endpoint), sns_client(moto_endpoint)
    try:
        topic = notify_topic(s3, sns, bucket, PREFIX, f"releases-{bucket}")
        ear = subscribe_queue(sqs, sns, topic, f"ear-{bucket}")  # hears what each member does
        with running_fleet(
            pooled_tritons,
            tmp_path / "unused-local-store",
            tmp_path / "fleet",
            model,
            store_uri=f"s3://{bucket}/{PREFIX}",
            env={
                **aws_env(moto_endpoint),
                "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": str(POLL),
                "CONTROLPLANE_STORE__NOTIFICATIONS__SNS_TOPIC_ARN": topic,
                "CONTROLPLANE_FLEET__ADVERTISE_URL": UNREACHABLE,
            },
        ) as fleet:
            members = [fleet.add(f"{model}-m{i}") for i in (1, 2, 3)]
            for member in members:  # each made its queue, named after it, and receives
                eventually(partial(_live, member), 30, f"{member.name} hearing its queue")
                assert _queue(member).endswith(f"/controlplane-{member.name}")
            assert {m["url"] for m in fleet.fleet()["members"]} == {UNREACHABLE}
            beats_before = _beats(s3, bucket)

            # A release uploaded, SHA256SUMS last: every member lists it within a second.
            built = write_scale_release(tmp_path / "releases", model, "r1", k=4.0)
            files = sorted(p for p in built.rglob("*") if p.is_file() and p.name != MANIFEST)
            for path in files:
                _put(s3, bucket, f"{model}/r1/{path.relative_to(built).as_posix()}", path)
            uploaded = time.monotonic()
            _put(s3, bucket, f"{model}/r1/{MANIFEST}", built / MANIFEST)
            heard = _heard(members, model, "r1", timeout=10.0)
            late = {name: round(at - uploaded, 3) for name, at in heard.items()}
            assert all(seconds < 1.0 for seconds in late.values()), late

            # A deploy through one member: its desired state reaches the others through the
            # bucket's event, not a wake (none can arrive) and not a poll (300 s).
            answer = members[0].api.deploy(model, "r1")
            assert answer.status_code == 200, answer.text
            deployed = time.monotonic()
            fleet.wait_serving(model, "r1", 4.0, timeout=60.0)
            took = time.monotonic() - deployed
            assert took < POLL / 10, f"the others served {took:.1f} s after the first"
            assert [_deploy_trigger(m, model) for m in members] == ["api", "fleet", "fleet"]

            # Heartbeats were written all along (a keepalive of 1 s), and none reached a queue.
            assert _beats(s3, bucket) != beats_before
            for member in members:
                eventually(partial(_drained, sqs, member), 30, f"{member.name}'s queue drained")
                assert _drops(member, "heartbeat") == []
        keys = _keys_heard(sqs, ear)
        assert f"{PREFIX}/{model}/r1/{MANIFEST}" in keys, keys
        assert f"{PREFIX}/_controlplane/desired/{model}.json" in keys, keys
        assert not [k for k in keys if "/_controlplane/members/" in k], keys
    finally:
        sqs.close()
        sns.close()


def _put(s3: Any, bucket: str, key: str, path: Path) -> None:
    s3.put_object(Bucket=bucket, Key=f"{PREFIX}/{key}", Body=path.read_bytes())


def _health(member: Member) -> dict[str, Any]:
    notifications: dict[str, Any] = member.api.get("/healthz").json()["store"]["notifications"]
    return notifications


def _live(member: Member) -> bool:
    return bool(_health(member)["state"] == "live")


def _queue(member: Member) -> str:
    return str(_health(member)["queue"])


def _drained(sqs: Any, member: Member) -> bool:
    return queued(sqs, _queue(member)) == 0


def _heard(members: Sequence[Member], model: str, release: str, timeout: float) -> dict[str, float]:
    """When each member first listed ``release`` among ``model``'s (the release watcher's last
    look at the store, as ``GET /v1/models`` shows it): the monotonic time, by member."""
    heard: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(heard) < len(members) and time.monotonic() < deadline:
        for member in members:
            if member.name not in heard and release in _listed(member, model):
                heard[member.name] = time.monotonic()
        time.sleep(0.01)
    missing = [m.name for m in members if m.name not in heard]
    assert not missing, f"{missing} did not list {release} within {timeout} s"
    return heard


def _listed(member: Member, model: str) -> list[str]:
    body = member.api.get("/v1/models?limit=1000").json()
    for found in body["models"]:
        if found["name"] == model:
            return [release["name"] for release in found["releases"]]
    return []


def _drops(member: Member, kind: str) -> list[str]:
    """The member's log lines about messages dropped as ``kind``."""
    return [
        line
        for line in member.api.log().splitlines()
        if "dropped a message" in line and f"({kind}:" in line
    ]


def _beats(s3: Any, bucket: str) -> dict[str, str]:
    """Each heartbeat record's ETag, by key."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/_controlplane/members/")
    return {item["Key"]: item["ETag"] for item in listed.get("Contents", [])}


def _deploy_trigger(member: Member, model: str) -> str:
    operations = member.api.get(f"/v1/operations?model={model}").json()["operations"]
    deploys = [o for o in operations if o["kind"] == "deploy"]
    assert len(deploys) == 1, (member.name, operations)
    ended = member.api.wait_operation(deploys[0]["id"])
    assert ended["status"] == "succeeded", (member.name, ended)
    trigger: str = ended["trigger"]
    return trigger


def _keys_heard(sqs: Any, url: str) -> list[str]:
    """The object keys of every S3 event in the queue (SNS's envelope unwrapped)."""
    keys: list[str] = []
    while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages"):
        for message in messages:
            body = json.loads(json.loads(message["Body"])["Message"])
            keys += [unquote_plus(r["s3"]["object"]["key"]) for r in body.get("Records", [])]
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    return keys
