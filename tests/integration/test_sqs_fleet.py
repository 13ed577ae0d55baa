"""S3 event notifications in a fleet: SQS hands each event to one member, which deploys the
release first and moves the desired state; the other follows because it is woken, not because
it polls (both poll every 300 s here), and the event is handled once."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.support.fleet import Member, running_fleet
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import aws_env, notify_queue, queued, sqs_client, upload_release_dir
from tests.support.s3_fixtures import moto_endpoint, s3_bucket  # noqa: F401
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton
PREFIX = "models"
POLL = 300.0  # neither member finds the release by listing within the test


def test_one_member_hears_the_event_goes_first_and_wakes_the_other(
    pooled_tritons: Callable[[Path], RunningTriton],
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
) -> None:
    s3, bucket = s3_bucket
    model = unique_model("heard")
    sqs = sqs_client(moto_endpoint)
    try:
        url = notify_queue(s3, sqs, bucket, f"fleet-{os.getpid()}")
        config = (
            f"store:\n  notifications:\n    sqs_queue_url: {url}\n"
            "model_defaults:\n  auto_deploy: true\n"
        )
        with running_fleet(
            pooled_tritons,
            tmp_path / "unused-local-store",
            tmp_path / "fleet",
            model,
            store_uri=f"s3://{bucket}/{PREFIX}",
            env={**aws_env(moto_endpoint), "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": str(POLL)},
            config=config,
        ) as fleet:
            members = [fleet.add(), fleet.add()]
            for member in members:  # both long-poll the queue before the release is uploaded
                eventually(partial(_live, member), 30, f"{member.name} hearing the queue")

            release = write_scale_release(tmp_path / "releases", model, "r1", k=4.0)
            uploaded = time.monotonic()
            upload_release_dir(s3, bucket, PREFIX, release)
            fleet.wait_serving(model, "r1", 4.0, timeout=90.0)
            took = time.monotonic() - uploaded

            assert took < POLL / 3, f"served everywhere {took:.1f} s after the upload"
            triggers = sorted(_deploy_trigger(m, model) for m in members)
            assert triggers == ["fleet", "watcher"], triggers  # one heard it, one followed
            assert fleet.fleet()["models"][model]["converged"] is True
            eventually(lambda: queued(sqs, url) == 0, 30, "the event deleted once handled")
    finally:
        sqs.close()


def _live(member: Member) -> bool:
    health = member.api.get("/healthz").json()
    return bool(health["store"]["notifications"]["state"] == "live")


def _deploy_trigger(member: Member, model: str) -> str:
    """What started the member's one deploy, once it has ended (it serves the release from its
    record step on, a step or two before the operation ends)."""
    operations = member.api.get(f"/v1/operations?model={model}").json()["operations"]
    deploys = [o for o in operations if o["kind"] == "deploy"]
    assert len(deploys) == 1, (member.name, operations)
    ended = member.api.wait_operation(deploys[0]["id"])
    assert ended["status"] == "succeeded", (member.name, ended)
    trigger: str = ended["trigger"]
    return trigger
