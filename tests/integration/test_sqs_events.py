"""S3 event notifications through SQS: a release uploaded is served at once, with polling five
minutes apart; junk in the queue is dropped and stops nothing; a message stays in the queue
until the daemon has handled it. moto's S3 and SQS over HTTP deliver the bucket's events (S3
sends them to the queue itself), the real Triton serves."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.support.daemon import Daemon, start_daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.queue_junk import JUNK
from tests.support.s3 import (
    MANIFEST,
    aws_env,
    notify_queue,
    queued,
    s3_client,
    sqs_client,
)
from tests.support.s3_fixtures import moto_endpoint  # noqa: F401

pytestmark = pytest.mark.triton
PREFIX = "models"
_models = itertools.count()


@dataclass
class Heard:
    """A daemon on an S3 store whose bucket notifies an SQS queue; polling every 300 s."""

    daemon: Daemon
    s3: Any
    sqs: Any
    bucket: str
    queue_url: str
    workdir: Path
    start: Any  # () -> Daemon: the same daemon started again

    def upload(self, model: str, release: str, k: float) -> float:
        """Publish a release as a publisher must (files, then SHA256SUMS); return the
        monotonic time of the SHA256SUMS upload."""
        built = write_scale_release(self.workdir / "releases", model, release, k=k)
        files = sorted(p for p in built.rglob("*") if p.is_file())
        for path in [p for p in files if p.name != MANIFEST]:
            self.put(f"{model}/{release}/{path.relative_to(built).as_posix()}", path.read_bytes())
        uploaded = time.monotonic()
        self.put(f"{model}/{release}/{MANIFEST}", (built / MANIFEST).read_bytes())
        return uploaded

    def put(self, key: str, body: bytes, *, prefix: str = PREFIX) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=f"{prefix}/{key}", Body=body)


@pytest.fixture(scope="module")
def heard(
    triton: RunningTriton,
    moto_endpoint: str,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Heard]:
    workdir = tmp_path_factory.mktemp("sqs-events")
    s3, sqs = s3_client(moto_endpoint), sqs_client(moto_endpoint)
    bucket = f"sqs-{os.getpid()}"
    s3.create_bucket(Bucket=bucket)
    queue_url = notify_queue(s3, sqs, bucket, f"releases-{os.getpid()}")
    # A message a stopped daemon's last long poll took comes back after this (SQS's default
    # is 30 s); a handled one is deleted well within it.
    sqs.set_queue_attributes(QueueUrl=queue_url, Attributes={"VisibilityTimeout": "5"})
    config = (
        f"store:\n  poll_interval_seconds: 300\n  notifications:\n"
        f"    sqs_queue_url: {queue_url}\nmodel_defaults:\n  auto_deploy: true\n"
    )

    def start() -> Daemon:
        return start_daemon(
            triton=triton,
            store=workdir,
            workdir=workdir,
            store_uri=f"s3://{bucket}/{PREFIX}",
            extra_env=aws_env(moto_endpoint),
            config=config,
        )

    world = Heard(start(), s3, sqs, bucket, queue_url, workdir, start)
    try:
        yield world
    finally:
        world.daemon.stop()
        s3.close()
        sqs.close()


def _model() -> str:
    return f"heard-{os.getpid()}-{next(_models)}"


def _served_at(triton: RunningTriton, model: str, expected: float, timeout: float) -> float:
    """The monotonic time of the first inference on ``model`` that answers ``expected``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _answers(triton, model, expected):
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError(f"{model} did not answer {expected} within {timeout} s")


def _answers(triton: RunningTriton, model: str, expected: float) -> bool:
    try:
        return infer_once(triton.grpc_url, model) == expected
    except Exception:  # not loaded yet
        return False


def _deploy_of(daemon: Daemon, model: str, release: str) -> dict[str, Any]:
    listed = daemon.get(f"/v1/operations?model={model}&limit=10").json()["operations"]
    found = [op for op in listed if op["release"] == release and op["kind"] == "deploy"]
    assert found, listed
    operation: dict[str, Any] = daemon.wait_operation(found[0]["id"])
    assert operation["status"] == "succeeded", operation
    assert operation["trigger"] == "watcher"
    return operation


def _step_seconds(operation: dict[str, Any], *names: str) -> float:
    steps = {step["name"]: step["duration_seconds"] for step in operation["steps"]}
    return sum(float(steps[name]) for name in names)


def _health(daemon: Daemon) -> dict[str, Any]:
    notifications: dict[str, Any] = daemon.get("/healthz").json()["store"]["notifications"]
    return notifications


def test_a_release_uploaded_is_served_within_its_fetch_and_load_and_a_second(
    heard: Heard, triton: RunningTriton
) -> None:
    eventually(lambda: _health(heard.daemon)["state"] == "live", 30, "the queue received from")
    model = _model()
    uploaded = heard.upload(model, "r1", k=2.0)
    served = _served_at(triton, model, 2.0, timeout=60)

    operation = _deploy_of(heard.daemon, model, "r1")
    budget = _step_seconds(operation, "fetch", "load") + 1.0
    # With polling 300 s apart, only the bucket's event can bring it this soon.
    assert served - uploaded < budget, (served - uploaded, operation["steps"])
    metrics = heard.daemon.get("/metrics").text
    assert "controlplane_store_notifications_up 1.0" in metrics


def test_junk_and_keys_of_no_release_are_dropped_and_stop_nothing(
    heard: Heard, triton: RunningTriton
) -> None:
    eventually(lambda: _health(heard.daemon)["state"] == "live", 30, "the queue received from")
    heard.sqs.send_message(QueueUrl=heard.queue_url, MessageBody="this is not JSON {")
    heard.sqs.send_message(QueueUrl=heard.queue_url, MessageBody='{"hello": "world"}')
    model = _model()
    heard.put(f"{model}/r1/{MANIFEST}", b"", prefix="elsewhere")  # outside the store's prefix
    heard.put(f"{model}/r1/notes/{MANIFEST}", b"")  # not a release's marker
    # Every one of those reached the queue and was dropped (deleted), none stopped the consumer.
    eventually(lambda: queued(heard.sqs, heard.queue_url) == 0, 30, "the junk deleted")
    log = heard.daemon.log()
    for kind in ("not_json", "not_an_s3_event", "outside_the_store", "not_a_marker"):
        assert f"({kind}: " in log, kind

    uploaded = heard.upload(model, "r2", k=3.0)
    served = _served_at(triton, model, 3.0, timeout=60)
    operation = _deploy_of(heard.daemon, model, "r2")
    assert served - uploaded < _step_seconds(operation, "fetch", "load") + 1.0
    assert _health(heard.daemon)["state"] == "live"
    assert heard.daemon.process.poll() is None


SQS_LIMIT = 256 * 1024  # bytes of a message body moto's SQS (and SQS by default) takes


def _store_events(daemon: Daemon) -> dict[str, Any]:
    jobs = daemon.get("/healthz").json()["jobs"]
    [job] = [j for j in jobs if j["name"] == "store-events"]
    return dict(job)


def test_a_message_of_any_shape_is_deleted_and_the_job_keeps_running_and_deploying(
    heard: Heard, triton: RunningTriton
) -> None:
    """JSON nested deeper than the parser goes (alone, under Records, or inside an SNS
    envelope) crashed the store-events job, and came back after every visibility timeout;
    nothing the queue holds may stop it now."""
    eventually(lambda: _health(heard.daemon)["state"] == "live", 30, "the queue received from")
    before = _store_events(heard.daemon)
    assert before["state"] == "running", before
    sent = 0
    for body, _kind in JUNK.values():
        if len(body.encode()) <= SQS_LIMIT:
            heard.sqs.send_message(QueueUrl=heard.queue_url, MessageBody=body)
            sent += 1
    assert sent >= 30

    eventually(lambda: queued(heard.sqs, heard.queue_url) == 0, 60, "every junk message deleted")
    model = _model()
    uploaded = heard.upload(model, "r1", k=5.0)
    served = _served_at(triton, model, 5.0, timeout=60)
    operation = _deploy_of(heard.daemon, model, "r1")
    assert served - uploaded < _step_seconds(operation, "fetch", "load") + 1.0
    job = _store_events(heard.daemon)
    assert (job["state"], job["restarts"]) == ("running", before["restarts"]), job
    assert _health(heard.daemon)["state"] == "live"
    assert "(not_json: " in heard.daemon.log()
    assert "unhandled errors in a TaskGroup" not in heard.daemon.log()


def test_a_message_stays_in_the_queue_until_the_daemon_has_handled_it(
    heard: Heard, triton: RunningTriton
) -> None:
    eventually(lambda: queued(heard.sqs, heard.queue_url) == 0, 30, "an empty queue")
    heard.daemon.stop()
    model = _model()
    heard.upload(model, "r1", k=4.0)
    # Nobody handles it while the daemon is down: it waits in the queue.
    eventually(lambda: queued(heard.sqs, heard.queue_url) == 1, 30, "the event queued")

    heard.daemon = heard.start()
    _served_at(triton, model, 4.0, timeout=60)
    _deploy_of(heard.daemon, model, "r1")
    eventually(lambda: queued(heard.sqs, heard.queue_url) == 0, 30, "the handled event deleted")
