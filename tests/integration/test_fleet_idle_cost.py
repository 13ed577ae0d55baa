"""What an idle member asks of S3, counted at a proxy in front of moto's server, with 1 and with
20 models in the store, with the bucket's events on (the SNS fan-out, a queue of its own) and
off (polling).

The member runs with every interval shortened (poll 1 s, keepalive 3 s, full scan 8 s), so a
window of 48 s holds dozens of its cycles. Each request is put down to the cadence that makes
it, and the counts are then turned into requests per minute at the default intervals (poll
10 s, keepalive 60 s, full scan 300 s). The issue's targets, at the defaults:

* with the fan-out, at most 2 requests a minute, whatever the number of models;
* without, the keepalive plus one listing per model per poll at most. A poll lists the whole
  store in one paginated listing (one request for these small models, however many), and
  asks for the generations index with If-None-Match (a 304).

Nothing else may reach S3 at idle. SQS's long polls and SNS are counted apart: they are no S3
requests (3 a minute per member at SQS's price, a twelfth of a LIST's)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.support.fault_proxy import FaultProxy
from tests.support.fleet import Member, running_fleet
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import aws_env, notify_topic, sns_client, sqs_client, upload_release_dir
from tests.support.s3_fixtures import moto_endpoint, s3_bucket  # noqa: F401
from tests.support.s3_kinds import kind_of
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton
PREFIX = "models"
POLL, KEEPALIVE, FULL_SCAN = 1.0, 3.0, 8.0  # the member's, in the test
DEFAULT_POLL, DEFAULT_KEEPALIVE, DEFAULT_FULL_SCAN = 10.0, 60.0, 300.0
FORGET_EVERY = 900.0  # a look for departed members (LIST of the heartbeats), not shortened
WINDOW = 48.0
KINDS = {"beat PUT", "name check GET", "index GET", "desired LIST", "releases LIST"}


@dataclass(frozen=True)
class Idle:
    counts: Counter[str]  # S3 requests in the window, by what they are for
    others: int  # SQS and SNS requests in the window

    def per_minute_at_defaults(self, *, events: bool) -> float:
        """The window's S3 requests at the default intervals, per minute: each kind scaled by
        how much longer its cadence is there (the heartbeats' listing, every 900 s in both,
        counted at that rate: the window is too short to hold one reliably)."""
        scan = FULL_SCAN / DEFAULT_FULL_SCAN
        poll = POLL / DEFAULT_POLL
        by_poll = scan if events else poll  # with events, the quiet beats ask nothing
        cadence = {
            "beat PUT": KEEPALIVE / DEFAULT_KEEPALIVE,
            "name check GET": KEEPALIVE / DEFAULT_KEEPALIVE,
            "index GET": by_poll,
            "releases LIST": by_poll,
            "desired LIST": scan,
        }
        per_second = sum(n / WINDOW * cadence[kind] for kind, n in self.counts.items())
        return per_second * 60 + 60 / FORGET_EVERY


@pytest.fixture
def idle_member(
    pooled_tritons: Callable[[Path], RunningTriton],
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
) -> Iterator[Callable[[int, bool], Idle]]:
    s3, bucket = s3_bucket
    sqs, sns = sqs_client(moto_endpoint), sns_client(moto_endpoint)

    def count(models: int, events: bool) -> Idle:
        names = [unique_model(f"idle{n}") for n in range(models)]
        for name in names:  # every model in the store; the first one served
            built = write_scale_release(tmp_path / "releases", name, "r1", k=1.0)
            upload_release_dir(s3, bucket, PREFIX, built)
        env = {
            "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": str(POLL),
            "CONTROLPLANE_STORE__FULL_SCAN_SECONDS": str(FULL_SCAN),
            "CONTROLPLANE_FLEET__KEEPALIVE_SECONDS": str(KEEPALIVE),
        }
        if events:
            topic = notify_topic(s3, sns, bucket, PREFIX, f"idle-{bucket}")
            env["CONTROLPLANE_STORE__NOTIFICATIONS__SNS_TOPIC_ARN"] = topic
        with (
            FaultProxy(moto_endpoint) as proxy,
            running_fleet(
                pooled_tritons,
                tmp_path / "unused-local-store",
                tmp_path / "fleet",
                names[0],
                store_uri=f"s3://{bucket}/{PREFIX}",
                env={**aws_env(proxy.endpoint), **env},
            ) as fleet,
        ):
            member = fleet.add(f"{names[0]}-m1")
            answer = member.api.deploy(names[0], "r1")
            assert answer.status_code == 200, answer.text
            if events:
                eventually(lambda: _live(member), 30, "the member hearing its own queue")
            time.sleep(FULL_SCAN + 2 * POLL)  # settled: its start-up's reads are behind it
            start = len(proxy.requests)
            time.sleep(WINDOW)  # the window itself: nothing is asked of the member meanwhile
            seen = proxy.requests[start:]
        counts: Counter[str] = Counter()
        others = 0
        for request in seen:
            kind = kind_of(request, bucket)
            if kind is None:
                others += 1
            else:
                counts[kind] += 1
        return Idle(counts, others)

    try:
        yield count
    finally:
        sqs.close()
        sns.close()


def _live(member: Member) -> bool:
    health = member.api.get("/healthz").json()["store"]["notifications"]
    return bool(health["state"] == "live")


@pytest.mark.parametrize("models", [1, 20])
def test_with_the_fan_out_an_idle_member_asks_at_most_two_requests_a_minute(
    idle_member: Callable[[int, bool], Idle], models: int
) -> None:
    idle = idle_member(models, True)
    scans = WINDOW / FULL_SCAN + 1
    assert set(idle.counts) <= KINDS, idle
    assert idle.counts["releases LIST"] <= scans, idle  # one whole-store listing per scan
    assert idle.counts["desired LIST"] <= scans, idle
    assert idle.counts["index GET"] <= 2 * scans, idle  # the sync's check, the listing's
    assert idle.counts["beat PUT"] <= WINDOW / KEEPALIVE + 1, idle
    assert idle.per_minute_at_defaults(events=True) <= 2.0, idle
    assert idle.others > 0  # it did hear its queue all along (long polls)


@pytest.mark.parametrize("models", [1, 20])
def test_without_events_an_idle_member_asks_a_listing_per_model_per_poll_and_little_else(
    idle_member: Callable[[int, bool], Idle], models: int
) -> None:
    idle = idle_member(models, False)
    polls = WINDOW / POLL
    assert set(idle.counts) <= KINDS, idle
    # Each poll: one listing of the whole store (a page holds all these models' keys); the
    # desired state, a 304.
    assert idle.counts["releases LIST"] <= polls + 1, idle
    assert idle.counts["index GET"] <= polls + WINDOW / FULL_SCAN + 2, idle
    assert idle.counts["desired LIST"] <= WINDOW / FULL_SCAN + 1, idle
    # At the defaults: the keepalive, then per poll one listing and one GET answered 304,
    # and the rest (the records' listing, the name check, departed members) under 0.5.
    per_poll = 2 * 60 / DEFAULT_POLL
    assert idle.per_minute_at_defaults(events=False) <= 1 + per_poll + 0.5, idle
    assert idle.others == 0
