"""When a queue's events vouch for the models they do not name: a queue of this member's own
(made on the SNS topic, or given with ``queue_per_member``) does while it was live the whole
time since the watcher last asked, so a quiet beat lists nothing; never before its first answer
nor right after a spell it could not be reached (a full listing then); a queue the fleet shares
never does, whatever it hears.

SQS is a fake of the client's two calls the job makes, injected through the constructor; its
``down`` flag refuses connections as an unreachable endpoint does.
tests/integration/test_store_discovery.py measures the same against moto's server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import botocore.exceptions  # type: ignore[import-untyped]
import pytest

from controlplane.adapters.stores.sqs_events import SqsStoreEvents
from controlplane.ports import StoreChanges
from controlplane.settings import Settings
from tests.support.fakes import FakeClock
from tests.support.polling import until

URL = "https://sqs.eu-west-1.amazonaws.com/111122223333/controlplane-m1"
TOPIC = "arn:aws:sns:eu-west-1:111122223333:model-events"


class FakeQueue:
    """Messages in, receipt handles out; ``down`` refuses every receive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waiting: dict[str, str] = {}
        self.down = False
        self.receives = 0

    def send(self, handle: str, key: str) -> None:
        record = {
            "eventSource": "aws:s3",
            "eventName": "ObjectCreated:Put",
            "s3": {"bucket": {"name": "models"}, "object": {"key": key}},
        }
        with self._lock:
            self.waiting[handle] = json.dumps({"Records": [record]})

    def receive_message(self, **_: Any) -> dict[str, Any]:
        if self.down:
            raise botocore.exceptions.EndpointConnectionError(endpoint_url=URL)
        with self._lock:
            self.receives += 1
            batch = list(self.waiting.items())[:10]
            for handle, _body in batch:
                del self.waiting[handle]
        if not batch:
            time.sleep(0.01)  # a long poll that answers nothing, shortened
        return {"Messages": [{"ReceiptHandle": h, "Body": b} for h, b in batch]}

    def delete_message_batch(self, **call: Any) -> dict[str, Any]:
        return {"Successful": [], "Failed": []}

    def close(self) -> None:
        pass


def _events(
    queue: FakeQueue, clock: FakeClock, *, own_queue: bool, wakes: list[str] | None = None
) -> SqsStoreEvents:
    return SqsStoreEvents(
        URL,
        bucket="models",
        base="prod/",
        wake=lambda: (wakes if wakes is not None else []).append("watcher"),
        clock=clock,
        poll_interval=10,
        own_queue=own_queue,
        client=queue,
    )


def _seen(changes: StoreChanges) -> tuple[set[str], bool]:
    return set(changes.models), changes.complete


def test_a_queue_of_its_own_vouches_for_what_it_did_not_name_while_it_stays_live() -> None:
    queue, clock, wakes = FakeQueue(), FakeClock(), list[str]()
    events = _events(queue, clock, own_queue=True, wakes=wakes)

    async def scenario() -> None:
        before = events.take()  # before the first receive: nothing is known
        job = asyncio.create_task(events.run())
        await until(lambda: events.health().up and queue.receives > 1, "receiving")
        first = events.take()  # it became live since the last take: what came before is unknown
        quiet = events.take()
        queue.send("r2", "prod/resnet/r2/SHA256SUMS")
        await until(lambda: wakes == ["watcher"], "the event heard")
        named = events.take()
        events.handled(frozenset({"resnet"}))
        after = events.take()

        assert [_seen(c) for c in (before, first, quiet, named, after)] == [
            (set(), False),
            (set(), False),
            (set(), True),  # a quiet beat: nothing to list
            ({"resnet"}, True),  # only resnet to list
            (set(), True),
        ]

        queue.down = True  # unreachable: what was published meanwhile may be unknown
        await until(lambda: not events.health().up, "the queue lost")
        lost = events.take()
        queue.down = False
        await until(lambda: clock.sleepers() > 0, "waiting to try again")
        await clock.step()
        await until(lambda: events.health().up, "the queue answers again")
        back = events.take()  # the spell is not over for this take: a full listing
        settled = events.take()
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

        assert [_seen(c) for c in (lost, back, settled)] == [
            (set(), False),
            (set(), False),
            (set(), True),
        ]

    asyncio.run(scenario())


def test_an_unreachable_spell_between_two_takes_is_not_vouched_for() -> None:
    """Lost and found again between two takes: the queue is live at both, yet the second
    take is not complete, since it was not live the whole time."""
    queue, clock = FakeQueue(), FakeClock()
    events = _events(queue, clock, own_queue=True)

    async def scenario() -> None:
        job = asyncio.create_task(events.run())
        await until(lambda: events.health().up, "receiving")
        events.take()
        assert events.take().complete
        queue.down = True
        await until(lambda: clock.sleepers() > 0, "lost, waiting to try again")
        queue.down = False
        await clock.step()
        await until(lambda: events.health().up, "the queue answers again")
        assert not events.take().complete
        assert events.take().complete
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    asyncio.run(scenario())


def test_a_shared_queue_never_vouches_for_what_it_did_not_name() -> None:
    """Today's behaviour with a queue the fleet may share: a quiet beat lists the whole store,
    an event brings its model's listing forward."""
    queue, clock, wakes = FakeQueue(), FakeClock(), list[str]()
    events = _events(queue, clock, own_queue=False, wakes=wakes)

    async def scenario() -> None:
        job = asyncio.create_task(events.run())
        await until(lambda: events.health().up and queue.receives > 1, "receiving")
        takes = [events.take(), events.take(), events.take()]
        queue.send("r2", "prod/resnet/r2/SHA256SUMS")
        await until(lambda: wakes == ["watcher"], "the event heard")
        named = events.take()
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

        assert [_seen(c) for c in takes] == [(set(), False)] * 3
        assert _seen(named) == ({"resnet"}, True)

    asyncio.run(scenario())


def _notifications(given: dict[str, Any]) -> Any:
    settings = Settings.model_validate(
        {
            "repository": {"path": "/srv/repository"},
            "store": {"uri": "s3://models/prod", "notifications": given},
        }
    )
    return settings.store.notifications


@pytest.mark.parametrize(
    ("given", "own"),
    [
        ({"sns_topic_arn": TOPIC}, True),  # the queue this member makes is its own
        ({"sns_topic_arn": TOPIC, "queue_per_member": True}, True),
        ({"sqs_queue_url": URL, "queue_per_member": True}, True),
        ({"sqs_queue_url": URL}, False),  # a queue given may be shared
        ({}, False),
    ],
)
def test_whose_queue_it_is(given: dict[str, Any], own: bool) -> None:
    assert _notifications(given).own_queue is own


def test_queue_per_member_without_a_queue_is_refused_saying_what_to_give() -> None:
    with pytest.raises(ValueError, match=r"give that queue's URL too"):
        _notifications({"queue_per_member": True})
