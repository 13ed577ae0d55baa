"""What release discovery asks of S3, counted: a member whose queue is its own (the fan-out: an
SNS topic, a queue per member) lists nothing on a quiet beat and lists the whole store, in one
request, every ``store.full_scan_seconds``, with 1 model or 20; a release is still heard within
a second, and one whose event is lost (the bucket's notification removed) or published while
the queue cannot be reached is found at the next full scan. A member on a queue the fleet
shares lists the store at every quiet beat, as before.

The daemon reaches S3 through a counting :class:`~tests.support.fault_proxy.FaultProxy` in
front of moto's server (its SQS and SNS through another proxy, or directly), so every S3
request it makes is seen and sorted by purpose, as bench/fleet_store.py sorts them. The beat
is short (0.5 s) and so are the full scans (4 s) so that the test runs in seconds; what a
member costs at the defaults follows from the counts per beat and per full scan."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import parse_qs

import pytest

from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.fault_proxy import FaultProxy, SeenRequest
from tests.support.polling import eventually
from tests.support.s3 import (
    aws_env,
    notify_queue,
    notify_topic,
    sns_client,
    sqs_client,
    upload_release,
)
from tests.support.s3_fixtures import moto_endpoint, s3_bucket  # noqa: F401

pytestmark = pytest.mark.triton
PREFIX = "models"
POLL = 0.5  # the watcher's beat (store.poll_interval_seconds)
FULL_SCAN = 4.0  # store.full_scan_seconds
SCANS = 3  # full scans a count spans
FILES = {"config.pbtxt": b'name: "m"\nbackend: "python"\n', "1/model.py": b"pass\n"}


@dataclass
class Member:
    """A daemon on ``s3://bucket/models`` whose S3 requests ``s3`` counts."""

    daemon: Daemon
    s3: FaultProxy
    direct: Any  # a client straight to moto, to publish
    bucket: str

    def publish(self, model: str, release: str) -> float:
        """Upload a release, SHA256SUMS last; the monotonic time of that last upload."""
        upload_release(self.direct, self.bucket, PREFIX, model, release, dict(FILES))
        return time.monotonic()

    def listed(self, model: str) -> list[str]:
        """The releases of ``model`` the watcher last listed (GET /v1/models: the watcher's
        catalog, no request to the store; GET /v1/models/{name} would list it)."""
        for found in self.daemon.get("/v1/models?limit=1000").json()["models"]:
            if found["name"] == model:
                return [release["name"] for release in found["releases"]]
        return []

    def full_scan(self) -> str | None:
        """When the watcher's last full scan ended."""
        at: str | None = self.daemon.get("/v1/models?limit=1").json()["as_of"]["store_full_scan"]
        return at

    def notifications(self) -> dict[str, Any]:
        found: dict[str, Any] = self.daemon.get("/healthz").json()["store"]["notifications"]
        return found

    def after_full_scans(self, count: int) -> None:
        """Return once ``count`` more full scans have ended (each seen ending)."""
        for n in range(count):
            last = self.full_scan()
            eventually(
                partial(self._scanned_since, last),
                FULL_SCAN * 3,
                f"full scan {n + 1} of {count}",
                every=0.02,
            )

    def _scanned_since(self, last: str | None) -> bool:
        return self.full_scan() != last


def purpose(seen: SeenRequest) -> str:
    """What an S3 request is for: a listing of the whole store (``store``), of one model's
    releases (``model``), anything under ``_controlplane/`` (``fleet``: another part's), or a
    read of a release's objects (``release files``)."""
    query = parse_qs(seen.query)
    if seen.method == "GET" and query.get("list-type") == ["2"]:
        prefix = (query.get("prefix") or [""])[0]
        if prefix.startswith(f"{PREFIX}/_controlplane/"):
            return "fleet LIST"
        return "store LIST" if prefix == f"{PREFIX}/" else "model LIST"
    key = seen.path.split("/", 2)[-1]
    if key.startswith(f"{PREFIX}/_controlplane/"):
        return f"fleet {seen.method}"
    return f"release files {seen.method}"


def counted(proxy: FaultProxy, since: int) -> Counter[str]:
    return Counter(purpose(seen) for seen in proxy.requests[since:])


@pytest.fixture
def start_member(
    daemons: DaemonFactory,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
    tmp_path: Any,
) -> Iterator[Callable[..., Member]]:
    """A member on a fresh bucket holding ``models`` models (one release each), with the
    notifications ``how`` says: ``topic`` (its own queue on an SNS topic) or ``queue`` (one
    queue the bucket sends to, as a fleet shares it). ``sqs_via``: a proxy its SQS calls go
    through (to make the queue unreachable)."""
    direct, bucket = s3_bucket
    sqs, sns = sqs_client(moto_endpoint), sns_client(moto_endpoint)
    proxies: list[FaultProxy] = []

    def start(how: str, models: int, sqs_via: FaultProxy | None = None) -> Member:
        for n in range(models):
            upload_release(direct, bucket, PREFIX, f"model-{n}", "r1", dict(FILES))
        s3 = FaultProxy(moto_endpoint).start()
        proxies.append(s3)
        env = {
            **aws_env(moto_endpoint),
            "AWS_ENDPOINT_URL_S3": s3.endpoint,
            "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": str(POLL),
            "CONTROLPLANE_STORE__FULL_SCAN_SECONDS": str(FULL_SCAN),
            "CONTROLPLANE_FLEET__MEMBER": f"discovery-{bucket}",
        }
        if sqs_via is not None:
            env["AWS_ENDPOINT_URL_SQS"] = sqs_via.endpoint
        if how == "topic":
            topic = notify_topic(direct, sns, bucket, PREFIX, f"discovery-{bucket}")
            env["CONTROLPLANE_STORE__NOTIFICATIONS__SNS_TOPIC_ARN"] = topic
        else:
            url = notify_queue(direct, sqs, bucket, f"discovery-{bucket}")
            env["CONTROLPLANE_STORE__NOTIFICATIONS__SQS_QUEUE_URL"] = url
        daemon = daemons(
            tmp_path / "unused-local-store",
            store_uri=f"s3://{bucket}/{PREFIX}",
            extra_env=env,
        )
        member = Member(daemon, s3, direct, bucket)
        eventually(lambda: member.notifications()["state"] == "live", 30, "the queue live")
        eventually(lambda: len(member.listed(f"model-{models - 1}")) == 1, 30, "the models")
        return member

    yield start
    for proxy in proxies:
        proxy.stop()
    sqs.close()
    sns.close()


@pytest.mark.parametrize("models", [1, 20])
def test_an_idle_member_with_a_queue_of_its_own_lists_the_store_once_a_full_scan(
    start_member: Callable[..., Member], models: int
) -> None:
    member = start_member("topic", models)
    member.after_full_scans(1)  # the one that follows the queue's first answer
    since, started = len(member.s3.requests), time.monotonic()

    member.after_full_scans(SCANS)

    seconds = time.monotonic() - started
    found = counted(member.s3, since)
    per_minute = {kind: round(n * 60 / seconds, 1) for kind, n in sorted(found.items())}
    print(f"\n{models} model(s), {seconds:.1f} s, beat {POLL} s: {dict(found)} = {per_minute}/min")
    # One request a full scan (the whole store in one page), none on the beats between them
    # (about FULL_SCAN / POLL = 8 of them a scan), and no release read.
    assert found["store LIST"] == SCANS, found
    assert found["model LIST"] == 0, found
    assert not [kind for kind in found if kind.startswith("release files")], found


def test_a_release_is_heard_at_once_and_one_whose_event_is_lost_at_the_next_full_scan(
    start_member: Callable[..., Member],
    moto_endpoint: str,  # noqa: F811
) -> None:
    with FaultProxy(moto_endpoint) as sqs_proxy:
        member = start_member("topic", 20, sqs_via=sqs_proxy)
        member.after_full_scans(1)

        # Heard: its model alone is listed, within a second.
        since = len(member.s3.requests)
        uploaded = member.publish("model-7", "r2")
        took = eventually(lambda: "r2" in member.listed("model-7"), 10, "r2 of model-7 listed")
        assert took < 1.0, f"{time.monotonic() - uploaded:.2f} s after the upload"
        assert counted(member.s3, since)["model LIST"] == 1

        # Published while the queue cannot be reached: every beat lists the store meanwhile,
        # and once the queue answers again the whole store is listed for what was missed.
        sqs_proxy.go_down()
        eventually(lambda: member.notifications()["state"] == "unreachable", 60, "queue lost")
        since = len(member.s3.requests)
        member.publish("model-3", "r2")
        eventually(lambda: "r2" in member.listed("model-3"), FULL_SCAN, "r2 of model-3 listed")
        beats = counted(member.s3, since)
        assert beats["model LIST"] == 0, beats
        sqs_proxy.come_back()
        eventually(lambda: member.notifications()["state"] == "live", 60, "the queue back")

        # Lost: the bucket no longer announces anything; the next full scan finds it.
        member.direct.put_bucket_notification_configuration(
            Bucket=member.bucket, NotificationConfiguration={}
        )
        member.after_full_scans(1)
        since = len(member.s3.requests)
        member.publish("model-12", "r2")
        eventually(
            lambda: "r2" in member.listed("model-12"), FULL_SCAN * 2, "r2 of model-12 listed"
        )
        found = counted(member.s3, since)
        assert found["model LIST"] == 0, found  # no event named it: a full scan found it
        assert 1 <= found["store LIST"] <= 2, found


def test_a_member_on_a_shared_queue_lists_the_store_at_every_quiet_beat(
    start_member: Callable[..., Member],
) -> None:
    """A queue several members may read hands each event to one of them: its silence says
    nothing about the models, so a quiet beat lists the whole store (one request now)."""
    member = start_member("queue", 20)
    since, started = len(member.s3.requests), time.monotonic()

    member.after_full_scans(SCANS * 2)

    seconds = time.monotonic() - started
    beats = seconds / POLL
    found = counted(member.s3, since)
    print(f"\nshared queue, 20 models, {seconds:.1f} s, beat {POLL} s: {dict(found)}")
    assert found["store LIST"] >= SCANS * 2, found
    assert found["store LIST"] >= beats / 2, (found, beats)  # a listing every beat, give or take
    assert found["model LIST"] == 0, found
