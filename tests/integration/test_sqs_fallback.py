"""An SQS queue that goes away: the daemon falls back to polling and says so (``/healthz``,
``controlplane_store_notifications_up``, one log line per change), a release still arrives at
the next poll, and the daemon hears the queue again once it is back, by itself."""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.integration.test_cli import cli
from tests.support.daemon import Daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import aws_env, notify_queue, sqs_client, upload_release_dir
from tests.support.s3_fixtures import moto_endpoint, s3_bucket  # noqa: F401

pytestmark = pytest.mark.triton
PREFIX = "models"


def _notifications(daemon: Daemon) -> dict[str, Any]:
    found: dict[str, Any] = daemon.get("/healthz").json()["store"]["notifications"]
    return found


def _up(daemon: Daemon) -> str:
    lines = daemon.get("/metrics").text.splitlines()
    return next(line for line in lines if line.startswith("controlplane_store_notifications_up "))


def test_a_queue_that_goes_away_falls_back_to_polling_and_is_heard_again_when_back(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
    model_name: str,
    triton: RunningTriton,
) -> None:
    s3, bucket = s3_bucket
    sqs = sqs_client(moto_endpoint)
    queue = f"fallback-{os.getpid()}"
    try:
        url = notify_queue(s3, sqs, bucket, queue)
        daemon = daemons(
            tmp_path,
            store_uri=f"s3://{bucket}/{PREFIX}",
            extra_env=aws_env(moto_endpoint),
            config=f"store:\n  poll_interval_seconds: 1\n  notifications:\n"
            f"    sqs_queue_url: {url}\nmodel_defaults:\n  auto_deploy: true\n",
        )
        eventually(lambda: _notifications(daemon)["state"] == "live", 30, "the queue heard")
        assert _up(daemon) == "controlplane_store_notifications_up 1.0"

        sqs.delete_queue(QueueUrl=url)
        eventually(lambda: _notifications(daemon)["state"] == "unreachable", 60, "fallback")
        health = _notifications(daemon)
        assert "does not exist" in health["problem"], health
        assert health["retry_at"] is not None
        assert _up(daemon) == "controlplane_store_notifications_up 0.0"
        # Said where people look: controlplane status and the status page.
        said = f"store notifications: the SQS queue {url} cannot be reached since"
        status = cli(daemon.url, "status")
        assert status.returncode == 0, status.stderr
        assert said in status.stderr, status.stderr
        assert "found by polling" in status.stderr, status.stderr
        assert said in html.unescape(daemon.get("/").text)

        # Polling still finds a release.
        release = write_scale_release(tmp_path / "releases", model_name, "r1", k=2.0)
        upload_release_dir(s3, bucket, PREFIX, release)
        eventually(lambda: _answers(triton, model_name, 2.0), 60, "r1 served by polling")

        assert notify_queue(s3, sqs, bucket, queue) == url  # the queue is back
        eventually(lambda: _notifications(daemon)["state"] == "live", 60, "the queue heard again")
        assert _up(daemon) == "controlplane_store_notifications_up 1.0"
        assert said not in cli(daemon.url, "status").stderr
        assert said not in html.unescape(daemon.get("/").text)
        log = daemon.log()
        # One line per change of state, however many retries were made in between.
        assert log.count("cannot be reached") == 1, log
        assert log.count("answers again") == 1, log
    finally:
        sqs.close()


def _answers(triton: RunningTriton, model: str, expected: float) -> bool:
    try:
        return infer_once(triton.grpc_url, model) == expected
    except Exception:  # not loaded yet
        return False
