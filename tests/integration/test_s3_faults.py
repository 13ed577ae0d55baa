"""The S3 fault campaign: what a network can do to a deploy, with clients calling the model.

The real daemon reaches moto's S3 server through a :class:`FaultProxy` (``AWS_ENDPOINT_URL_S3``)
and deploys onto the real Triton. Each test publishes a new release, breaks the path to the
store in one way, and deploys while two clients infer through Triton and a
:class:`PlacementAudit` watches the repository. Whatever the fault, no inference fails, every
answer comes from the old release or the new one, and the repository only ever holds complete,
verified releases. Then each fault ends the way it should:

- throttling, 5xx, connections cut mid-body, latency, a byte flipped in a ranged part or in a
  whole object, and a 20 s outage: the new release serves, and the retries were logged and
  counted in /metrics;
- an object replaced mid-download: ``release_changed``, and the old release serves;
- a store down for good: ``store_unavailable`` within ``store.retry_seconds`` and a little,
  saying how long it tried and why, whether the outage begins mid-download or before the
  deploy's first check;
- a store away for less than ``store.retry_seconds`` when a deploy is asked: with ``wait`` it
  is waited out and the release serves; without, a 503 with ``Retry-After`` says to retry;
- a daemon stopped mid-download: its fetch threads stop at once and leave no temp file.

Releases carry 1.5 MiB of weights, fetched in 12 ranged parts (a 512 KiB threshold, 128 KiB
parts). They are published without CRC32 object checksums, as many S3-compatible stores and
older SDKs do, so the digest against ``SHA256SUMS`` is what catches a flipped byte.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon, start_daemon
from tests.support.fault_proxy import FaultProxy, SeenRequest
from tests.support.inference import LoadGenerator, infer_once
from tests.support.models import write_scale_release, write_sha256sums
from tests.support.placements import PlacementAudit
from tests.support.polling import eventually
from tests.support.s3 import aws_env, s3_client, upload_release_dir
from tests.support.s3_fixtures import fault_proxy, moto_endpoint  # noqa: F401

pytestmark = pytest.mark.triton
log = logging.getLogger(__name__)
PREFIX = "models"
KIB = 1024
CONFIG = """\
store:
  multipart_threshold_bytes: 524288
  part_size_bytes: 131072
  max_concurrency: 4
  poll_interval_seconds: 3600
model_defaults:
  retire_after_seconds: 600
"""
_models = itertools.count()


@dataclass
class Outcome:
    """What one deploy under a fault looked like from outside."""

    response: httpx.Response
    seconds: float
    answers: set[float]
    errors: list[str]
    violations: list[str]
    last_answers: list[float]

    @property
    def fetch(self) -> dict[str, Any]:
        steps = self.response.json()["operation"]["steps"]
        return dict(next(s for s in steps if s["name"] == "fetch")["detail"])

    @property
    def operation_id(self) -> str:
        return str(self.response.json()["operation"]["id"])


@dataclass
class Campaign:
    """One daemon, one model, one bucket behind one proxy; releases r1, r2, ... (k = n)."""

    daemon: Daemon
    proxy: FaultProxy
    publisher: Any
    bucket: str
    model: str
    triton: RunningTriton
    workdir: Path
    published: dict[str, dict[str, str]] = field(default_factory=dict)  # release -> digests
    _next: int = 1

    def publish(self, weights: int = 1536 * KIB) -> tuple[str, float]:
        """Upload the next release (files first, SHA256SUMS last); its name and its k."""
        number = self._next
        self._next += 1
        release, k = f"r{number}", float(number)
        root = write_scale_release(self.workdir / "src", self.model, release, k=k, checksums=False)
        (root / "1" / "weights.bin").write_bytes(os.urandom(weights))
        write_sha256sums(root)
        upload_release_dir(self.publisher, self.bucket, PREFIX, root)
        self.published[release] = {
            p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*")
            if p.is_file()
        }
        return release, k

    def key(self, release: str, rel: str = "") -> str:
        return f"{PREFIX}/{self.model}/{release}/{rel}"

    def serving(self) -> float:
        return infer_once(self.triton.grpc_url, self.model)

    def deploy(self, release: str) -> Outcome:
        """Deploy ``release`` with two clients inferring and the repository audited."""
        audit = PlacementAudit(self.daemon.repository, self.model)
        for name, digests in self.published.items():
            audit.expect(name, digests)
        with LoadGenerator(self.triton.grpc_url, self.model, clients=2, max_seconds=240) as load:
            load.wait_for_answers(3)
            with audit:
                started = time.monotonic()
                response = self.daemon.deploy(self.model, release)
                seconds = time.monotonic() - started
                load.wait_for_answers(3)
        return Outcome(
            response=response,
            seconds=seconds,
            answers={a for client in load.logs for a in client.answers},
            errors=[e for client in load.logs for e in client.errors],
            violations=audit.violations,
            last_answers=[client.answers[-1] for client in load.logs],
        )

    def retries(self) -> dict[str, float]:
        """``controlplane_store_retries_total`` by cause, from /metrics."""
        counts = {}
        for line in self.daemon.get("/metrics").text.splitlines():
            if line.startswith("controlplane_store_retries_total{"):
                labels, value = line.rsplit(" ", 1)
                counts[labels.split('cause="')[1].split('"')[0]] = float(value)
        return counts

    def retry_log(self, operation_id: str) -> list[dict[str, Any]]:
        """The daemon's retry warnings written for ``operation_id``."""
        lines = [json.loads(line) for line in self.daemon.log().splitlines() if line[:1] == "{"]
        return [
            entry
            for entry in lines
            if entry.get("operation_id") == operation_id and "trying again" in entry["message"]
        ]


def _assert_nothing_broke(outcome: Outcome, allowed: set[float]) -> None:
    assert outcome.errors == [], outcome.errors[:3]
    assert outcome.answers <= allowed, f"answers {outcome.answers}, expected within {allowed}"
    assert outcome.violations == [], outcome.violations[:3]


def _assert_served(campaign: Campaign, outcome: Outcome, old: float, new: float) -> None:
    assert outcome.response.status_code == 200, outcome.response.text
    _assert_nothing_broke(outcome, {old, new})
    assert outcome.last_answers == [new, new]
    assert campaign.serving() == new
    log.info(
        "served in %.1f s: retries %s, refetched %s",
        outcome.seconds,
        outcome.fetch["retries"],
        outcome.fetch["refetched"],
    )


@pytest.fixture(scope="class")
def campaign(
    triton: RunningTriton,
    moto_endpoint: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Campaign]:
    workdir = tmp_path_factory.mktemp("s3-faults")
    bucket = f"faults-{os.getpid()}"
    publisher = s3_client(moto_endpoint, checksums=False)
    publisher.create_bucket(Bucket=bucket)
    proxy = FaultProxy(moto_endpoint).start()
    daemon = start_daemon(
        triton=triton,
        store=workdir,
        workdir=workdir,
        store_uri=f"s3://{bucket}/{PREFIX}",
        extra_env=aws_env(proxy.endpoint),
        config=CONFIG,
    )
    here = Campaign(
        daemon, proxy, publisher, bucket, f"faults-{os.getpid()}-{next(_models)}", triton, workdir
    )
    try:
        release, _ = here.publish()
        assert daemon.deploy(here.model, release).status_code == 200
        yield here
    finally:
        daemon.stop()
        proxy.stop()
        publisher.close()


@pytest.fixture
def fresh(campaign: Campaign) -> Campaign:
    """The campaign with no fault left over from a test that failed halfway."""
    campaign.proxy.clear()
    campaign.proxy.latency = 0.0
    campaign.proxy.come_back()
    return campaign


class TestFaultsDuringADeploy:
    """One daemon for the class (class-scoped: only one daemon at a time may hold the session
    Triton's repository, and the tests after the class start their own)."""

    def test_throttling_is_retried_logged_and_counted_and_the_new_release_serves(
        self,
        fresh: Campaign,
    ) -> None:
        old = fresh.serving()
        release, new = fresh.publish()
        before = fresh.retries()
        fresh.proxy.fail_next(2, "503", fresh.key(release, "SHA256SUMS"))  # read before the fetch
        fresh.proxy.fail_next(8, "503", fresh.key(release, "1/weights.bin"))  # parts, in parallel

        outcome = fresh.deploy(release)

        _assert_served(fresh, outcome, old, new)
        assert fresh.retries()["throttled"] - before["throttled"] == 2 + 8
        logged = fresh.retry_log(outcome.operation_id)
        assert len(logged) == 2 + 8
        first = logged[0]
        assert first["level"] == "warning"
        assert first["cause"] == "throttled"
        assert first["key"].startswith(f"s3://{fresh.bucket}/{fresh.key(release)}")
        assert first["attempt"] == 1
        assert 0 <= first["retry_in_seconds"] <= 5
        assert 100 < first["gives_up_in_seconds"] <= 120
        assert outcome.fetch["retries"] == 8

    @pytest.mark.parametrize(
        ("kind", "cause"),
        [("500", "server_error"), ("drop_mid_body", "connection")],
        ids=["server-errors", "connections-cut-mid-body"],
    )
    def test_server_errors_and_cut_connections_are_retried_and_the_new_release_serves(
        self, fresh: Campaign, kind: Any, cause: str
    ) -> None:
        old = fresh.serving()
        release, new = fresh.publish()
        before = fresh.retries()
        fresh.proxy.fail_next(6, kind, fresh.key(release, "1/weights.bin"))

        outcome = fresh.deploy(release)

        _assert_served(fresh, outcome, old, new)
        assert fresh.retries()[cause] - before[cause] == 6
        assert outcome.fetch["retries"] == 6

    def test_latency_slows_the_fetch_but_the_new_release_serves(self, fresh: Campaign) -> None:
        old = fresh.serving()
        release, new = fresh.publish()
        fresh.proxy.latency = 0.3

        outcome = fresh.deploy(release)

        _assert_served(fresh, outcome, old, new)
        assert outcome.seconds > 0.3 * 4  # SHA256SUMS, listing, three rounds of parts at least

    @pytest.mark.parametrize(
        ("rel", "ranged"), [("1/weights.bin", True), ("1/model.py", False)], ids=["part", "whole"]
    )
    def test_a_byte_flipped_on_the_wire_is_fetched_again_and_the_new_release_serves(
        self, fresh: Campaign, rel: str, ranged: bool
    ) -> None:
        old = fresh.serving()
        release, new = fresh.publish()
        before = fresh.retries()
        fresh.proxy.fail_next(1, "flip", fresh.key(release, rel), ranged=ranged)

        outcome = fresh.deploy(release)

        _assert_served(fresh, outcome, old, new)
        assert outcome.fetch["refetched"] == 1
        assert fresh.retries()["corrupt"] - before["corrupt"] == 1
        assert fresh.proxy.gets(fresh.key(release, rel), ranged=ranged) == (24 if ranged else 2)

    def test_30_percent_of_the_parts_flipped_on_the_wire_are_fetched_again_and_it_serves(
        self, fresh: Campaign
    ) -> None:
        # Found from outside: with 30 % of the ranged GETs hit, each round of the whole
        # object had some part hit, and every deploy ended in 503 store_unavailable.
        old = fresh.serving()
        release, new = fresh.publish()
        weights = fresh.key(release, "1/weights.bin")
        fresh.proxy.fail_randomly(0.3, "flip", weights, ranged=True, seed=11)

        outcome = fresh.deploy(release)

        _assert_served(fresh, outcome, old, new)
        gets = fresh.proxy.gets(weights, ranged=True)
        assert outcome.fetch["refetched"] >= 1
        # 12 parts: two rounds of all of them, then only those whose fetches disagreed.
        assert 24 < gets < 4 * 12, gets
        assert outcome.fetch["bytes_fetched"] < 4 * outcome.fetch["bytes"]

    def test_an_object_replaced_mid_download_is_release_changed_and_the_old_release_serves(
        self,
        fresh: Campaign,
    ) -> None:
        old = fresh.serving()
        release, _ = fresh.publish()
        key = fresh.key(release, "1/weights.bin")

        def replace(_: SeenRequest) -> None:
            fresh.publisher.put_object(Bucket=fresh.bucket, Key=key, Body=os.urandom(1536 * KIB))

        fresh.proxy.on_get(key, replace, skip=3)  # after three of its twelve parts

        outcome = fresh.deploy(release)

        assert outcome.response.status_code == 409, outcome.response.text
        error = outcome.response.json()["error"]
        assert error["code"] == "release_changed"
        assert "changed during the download" in error["message"]
        _assert_nothing_broke(outcome, {old})
        assert fresh.serving() == old
        assert fresh.daemon.staging_leftovers() == []

    def test_a_20_s_outage_mid_download_is_waited_out_and_the_new_release_serves(
        self,
        fresh: Campaign,
    ) -> None:
        old = fresh.serving()
        release, new = fresh.publish()
        before = fresh.retries()
        fresh.proxy.on_get(
            fresh.key(release, "1/weights.bin"), lambda _: fresh.proxy.down_for(20.0), skip=2
        )

        outcome = fresh.deploy(release)

        _assert_served(fresh, outcome, old, new)
        assert outcome.seconds >= 20.0
        assert fresh.retries()["connection"] > before["connection"]


def test_a_store_down_for_good_fails_within_retry_seconds_saying_why(
    daemons: DaemonFactory,
    tmp_path: Path,
    moto_endpoint: str,  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    triton: RunningTriton,
) -> None:
    retry_seconds = 4.0
    bucket = f"down-{os.getpid()}"
    publisher = s3_client(moto_endpoint, checksums=False)
    publisher.create_bucket(Bucket=bucket)
    try:
        daemon = daemons(
            tmp_path,
            store_uri=f"s3://{bucket}/{PREFIX}",
            extra_env=aws_env(fault_proxy.endpoint),
            config=CONFIG.replace("store:\n", f"store:\n  retry_seconds: {retry_seconds}\n"),
        )
        down = Campaign(
            daemon, fault_proxy, publisher, bucket, f"down-{os.getpid()}", triton, tmp_path
        )
        first, old = down.publish()
        assert daemon.deploy(down.model, first).status_code == 200
        release, _ = down.publish()
        went_down: list[float] = []

        def go_down(_: SeenRequest) -> None:
            went_down.append(time.monotonic())
            fault_proxy.go_down()

        fault_proxy.on_get(down.key(release, "1/weights.bin"), go_down, skip=2)

        outcome = down.deploy(release)
        failed_after = time.monotonic() - went_down[0]
    finally:
        publisher.close()

    assert outcome.response.status_code == 503, outcome.response.text
    error = outcome.response.json()["error"]
    assert error["code"] == "store_unavailable"
    assert f"over {int(retry_seconds)}." in error["message"]
    assert f"store.retry_seconds is {int(retry_seconds)} s" in error["message"]
    assert "last error (connection)" in error["message"]
    assert retry_seconds <= failed_after < retry_seconds + 4.0
    _assert_nothing_broke(outcome, {old})
    assert down.serving() == old
    assert daemon.staging_leftovers() == []


def test_a_daemon_stopped_mid_download_ends_its_fetch_at_once_and_leaves_no_temp_file(
    daemons: DaemonFactory,
    tmp_path: Path,
    moto_endpoint: str,  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    triton: RunningTriton,
) -> None:
    bucket = f"stop-{os.getpid()}"
    publisher = s3_client(moto_endpoint, checksums=False)
    publisher.create_bucket(Bucket=bucket)
    try:
        daemon = daemons(
            tmp_path,
            store_uri=f"s3://{bucket}/{PREFIX}",
            extra_env=aws_env(fault_proxy.endpoint),
            config=CONFIG,
        )
        slow = Campaign(
            daemon, fault_proxy, publisher, bucket, f"stop-{os.getpid()}", triton, tmp_path
        )
        release, _ = slow.publish(weights=6 * 1024 * KIB)
    finally:
        publisher.close()
    fault_proxy.latency = 1.0  # 48 parts over 4 threads: 12 s, if nothing stopped them
    weights = slow.key(release, "1/weights.bin")

    submitted = daemon.deploy(slow.model, release, wait=False)
    assert submitted.status_code == 202, submitted.text
    eventually(lambda: fault_proxy.gets(weights) >= 1, 30, "the download of the weights began")
    assert list(daemon.staging.rglob(".weights.bin.*.part")), "mid-download: a temp file"
    started = time.monotonic()
    exit_code = daemon.stop()
    stopped_in = time.monotonic() - started

    assert exit_code == -signal.SIGTERM  # uvicorn ends by the signal, after a clean shutdown
    assert stopped_in < 5.0, f"the daemon took {stopped_in:.1f} s to stop"
    assert fault_proxy.gets(weights) < 48  # the download did not run to its end
    assert list(daemon.staging.rglob("*.part")) == []
    assert daemon.staging_leftovers() == []


def _outage_campaigns(
    daemons: DaemonFactory,
    tmp_path: Path,
    endpoint: str,
    proxy: FaultProxy,
    triton: RunningTriton,
    *,
    retry_seconds: float,
    models: int,
) -> tuple[Daemon, list[Campaign]]:
    """A daemon on a fresh bucket behind ``proxy`` and ``models`` models of it, r1 published."""
    bucket = f"outage-{os.getpid()}-{next(_models)}"
    publisher = s3_client(endpoint, checksums=False)
    publisher.create_bucket(Bucket=bucket)
    daemon = daemons(
        tmp_path,
        store_uri=f"s3://{bucket}/{PREFIX}",
        extra_env=aws_env(proxy.endpoint),
        config=CONFIG.replace("store:\n", f"store:\n  retry_seconds: {retry_seconds}\n"),
    )
    campaigns = []
    for _ in range(models):
        model = f"outage-{os.getpid()}-{next(_models)}"
        campaign = Campaign(daemon, proxy, publisher, bucket, model, triton, tmp_path / model)
        campaign.publish()
        campaigns.append(campaign)
    return daemon, campaigns


def test_a_deploy_with_wait_rides_out_a_store_outage_and_one_without_is_told_to_retry(
    daemons: DaemonFactory,
    tmp_path: Path,
    moto_endpoint: str,  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    triton: RunningTriton,
) -> None:
    # Found from outside: a CI pipeline's deploy with "wait": true, asked while S3 was away
    # for 15 s, was answered 503 store_unavailable at once: the check before the operation
    # is recorded (describe) gave up after the scans' few seconds.
    daemon, (waited, told) = _outage_campaigns(
        daemons, tmp_path, moto_endpoint, fault_proxy, triton, retry_seconds=30.0, models=2
    )
    try:
        answers: dict[str, httpx.Response] = {}

        def deploy_and_wait() -> None:
            with daemon.client() as client:
                answers["waited"] = client.post(
                    f"/v1/models/{waited.model}/deploy", json={"release": "r1", "wait": True}
                )

        fault_proxy.down_for(15.0)
        went_down = time.monotonic()
        worker = threading.Thread(target=deploy_and_wait)
        worker.start()
        refused = daemon.deploy(told.model, "r1", wait=False)
        refused_after = time.monotonic() - went_down
        worker.join(timeout=120)
        waited_for = time.monotonic() - went_down
    finally:
        waited.publisher.close()

    assert not worker.is_alive()
    answer = answers["waited"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["operation"]["status"] == "succeeded"
    assert waited_for >= 15.0  # it waited the outage out
    assert waited.serving() == 1.0

    assert refused.status_code == 503, refused.text
    assert int(refused.headers["Retry-After"]) > 0
    error = refused.json()["error"]
    assert error["code"] == "store_unavailable"
    assert f"the store s3://{told.bucket}/{PREFIX} is away" in error["message"]
    assert "nothing was started" in error["message"]
    assert "Retry in a few seconds" in error["message"]
    assert refused_after < 10.0  # the scans' few seconds, not store.retry_seconds
    assert "operation_id" not in refused.json()  # a refusal: no operation was recorded
    assert daemon.deploy(told.model, "r1").status_code == 200  # and the retry, once it is back


def test_a_store_that_answers_nothing_is_refused_within_seconds_not_minutes(
    daemons: DaemonFactory,
    tmp_path: Path,
    moto_endpoint: str,  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    triton: RunningTriton,
) -> None:
    """Found from outside: S3 behind a partition that drops packets (connections taken, never
    answered) made a deploy without wait answer 503 after 120 s, botocore's 60 s read timeout
    twice, where the docs promise a few seconds; the CLI's status gave up on the daemon."""
    daemon, (hung,) = _outage_campaigns(
        daemons, tmp_path, moto_endpoint, fault_proxy, triton, retry_seconds=60.0, models=1
    )
    try:
        fault_proxy.go_silent()
        started = time.monotonic()
        answer = daemon.deploy(hung.model, "r1", wait=False)
        took = time.monotonic() - started
    finally:
        fault_proxy.come_back()
        hung.publisher.close()

    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "store_unavailable"
    assert int(answer.headers["Retry-After"]) > 0
    assert took < 20.0, took  # one attempt's read timeout past the 5 s budget, at most
    assert daemon.deploy(hung.model, "r1").status_code == 200  # and the retry, once it is back


def test_a_deploy_with_wait_gives_up_after_retry_seconds_when_the_store_stays_away(
    daemons: DaemonFactory,
    tmp_path: Path,
    moto_endpoint: str,  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    triton: RunningTriton,
) -> None:
    retry_seconds = 10.0
    daemon, (down,) = _outage_campaigns(
        daemons, tmp_path, moto_endpoint, fault_proxy, triton, retry_seconds=retry_seconds, models=1
    )
    try:
        fault_proxy.go_down()
        started = time.monotonic()
        answer = daemon.deploy(down.model, "r1")
        took = time.monotonic() - started
    finally:
        fault_proxy.come_back()
        down.publisher.close()

    assert answer.status_code == 503, answer.text
    assert int(answer.headers["Retry-After"]) > 0
    error = answer.json()["error"]
    assert error["code"] == "store_unavailable"
    assert f"store.retry_seconds is {int(retry_seconds)} s" in error["message"]
    assert "last error (connection)" in error["message"]
    assert retry_seconds <= took < retry_seconds + 4.0
    assert daemon.get(f"/v1/models/{down.model}").json().get("active_release") is None
    assert daemon.staging_leftovers() == []
