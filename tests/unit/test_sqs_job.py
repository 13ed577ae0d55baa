"""The store-events job over a queue of junk: every message that names no release is deleted,
the job goes on receiving, and a release's event that comes after is still heard.

The queue is a fake of the SQS client's two calls the job makes (receive, delete), injected
through the constructor; the bodies are the shapes of tests/unit/test_s3_events.py."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import pytest

from controlplane.adapters.stores.sqs_events import SqsStoreEvents
from controlplane.domain.notifications import NotificationState
from tests.support.fakes import FakeClock
from tests.support.polling import until
from tests.support.queue_junk import JUNK

URL = "https://sqs.eu-west-1.amazonaws.com/1/releases"


class Unprintable:
    """A body whose text cannot even be had: whatever reading a message raises, it is dropped."""

    def __str__(self) -> str:
        raise RuntimeError("no text")


class FakeQueue:
    """Messages in, receipt handles out: what the job deletes is gone from it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waiting: dict[str, object] = {}
        self.deleted: list[str] = []
        self.receives = 0

    def send(self, handle: str, body: object) -> None:
        with self._lock:
            self.waiting[handle] = body

    def receive_message(self, **_: Any) -> dict[str, Any]:
        with self._lock:
            self.receives += 1
            batch = list(self.waiting.items())[:10]
            for handle, _body in batch:
                del self.waiting[handle]  # invisible until deleted (no timeout here)
        if not batch:
            time.sleep(0.01)  # a long poll that answers nothing, shortened
        return {"Messages": [{"ReceiptHandle": h, "Body": b} for h, b in batch]}

    def delete_message_batch(self, **call: Any) -> dict[str, Any]:
        with self._lock:
            self.deleted.extend(entry["ReceiptHandle"] for entry in call["Entries"])
        return {"Successful": [], "Failed": []}

    def close(self) -> None:
        pass


def test_no_message_stops_the_job_and_each_is_deleted_then_a_release_is_still_heard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="controlplane.adapters.stores.sqs_events")
    queue = FakeQueue()
    for shape, (body, _kind) in JUNK.items():
        queue.send(f"junk: {shape}", body)
    queue.send("junk: unprintable", Unprintable())
    wakes: list[float] = []
    events = SqsStoreEvents(
        URL,
        bucket="models",
        base="prod/",
        wake=lambda: wakes.append(time.monotonic()),
        clock=FakeClock(),
        poll_interval=300,
        client=queue,
    )

    async def scenario() -> None:
        job = asyncio.create_task(events.run())
        await until(lambda: len(queue.deleted) == len(JUNK) + 1, "the junk deleted")
        assert not job.done()
        assert events.health().state is NotificationState.LIVE
        assert sorted(queue.deleted) == sorted(f"junk: {s}" for s in [*JUNK, "unprintable"])
        assert wakes == []  # junk names nothing to list
        # One line per kind of drop (the clock does not move: all within a minute).
        kinds = [r.__dict__["drop"] for r in caplog.records if "drop" in r.__dict__]
        assert sorted(kinds) == sorted(set(kinds))
        assert {"not_json", "not_an_s3_event", "not_a_marker", "unreadable"} <= set(kinds)

        record = {
            "eventSource": "aws:s3",
            "eventName": "ObjectCreated:Put",
            "s3": {"bucket": {"name": "models"}, "object": {"key": "prod/resnet/r2/SHA256SUMS"}},
        }
        queue.send("release", json.dumps({"Records": [record]}))
        await until(lambda: bool(wakes), "the release's event heard")
        assert events.take().models == {"resnet"}
        events.handled(frozenset({"resnet"}))
        await until(lambda: "release" in queue.deleted, "the release's event deleted")
        assert not job.done()
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    asyncio.run(scenario())
