"""The store-events job in a fan-out (the bucket's events on an SNS topic, a queue per member):
a change of the desired state wakes the fleet sync, a heartbeat is dropped by its key, and a
member makes its own queue at start, or says which permission it lacks and tries again.

SQS and SNS are fakes of the client calls the job makes, injected through the constructors;
tests/integration/test_sns_fanout.py runs the same against moto's S3, SNS and SQS."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import botocore.exceptions  # type: ignore[import-untyped]
import pytest

from controlplane.adapters.stores.sqs_events import SqsStoreEvents
from controlplane.adapters.stores.sqs_member_queue import MemberQueue
from controlplane.domain.notifications import NotificationState, member_queue_name
from controlplane.settings import Settings
from tests.support.fakes import FakeClock
from tests.support.polling import until

TOPIC = "arn:aws:sns:eu-west-1:111122223333:model-events"
QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/111122223333/controlplane-m1"
QUEUE_ARN = "arn:aws:sqs:eu-west-1:111122223333:controlplane-m1"


def _through_sns(key: str, event: str = "ObjectCreated:Put") -> str:
    record = {
        "eventSource": "aws:s3",
        "eventName": event,
        "s3": {"bucket": {"name": "models"}, "object": {"key": key}},
    }
    return json.dumps({"Type": "Notification", "Message": json.dumps({"Records": [record]})})


class FakeSqs:
    """The SQS calls of the job and of a member's queue set-up: messages in, handles out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waiting: dict[str, str] = {}
        self.deleted: list[str] = []
        self.created: list[str] = []
        self.attributes: dict[str, str] = {}
        self.gone = False  # the queue was deleted (until it is created again)

    def send(self, handle: str, body: str) -> None:
        with self._lock:
            self.waiting[handle] = body

    def create_queue(self, *, QueueName: str) -> dict[str, Any]:  # noqa: N803 (boto3's names)
        self.created.append(QueueName)
        self.gone = False
        return {"QueueUrl": QUEUE_URL}

    def get_queue_attributes(self, *, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:  # noqa: N803
        assert QueueUrl == QUEUE_URL
        assert AttributeNames == ["QueueArn"]
        return {"Attributes": {"QueueArn": QUEUE_ARN}}

    def set_queue_attributes(self, *, QueueUrl: str, Attributes: dict[str, str]) -> None:  # noqa: N803
        assert QueueUrl == QUEUE_URL
        self.attributes.update(Attributes)

    def receive_message(self, **call: Any) -> dict[str, Any]:
        assert call["QueueUrl"] == QUEUE_URL
        if self.gone:
            raise botocore.exceptions.ClientError(
                {
                    "Error": {
                        "Code": "AWS.SimpleQueueService.NonExistentQueue",
                        "QueryErrorCode": "QueueDoesNotExist",
                        "Message": "The specified queue does not exist.",
                    }
                },
                "ReceiveMessage",
            )
        with self._lock:
            batch = list(self.waiting.items())[:10]
            for handle, _body in batch:
                del self.waiting[handle]
        if not batch:
            time.sleep(0.01)  # a long poll that answers nothing, shortened
        return {"Messages": [{"ReceiptHandle": h, "Body": b} for h, b in batch]}

    def delete_message_batch(self, **call: Any) -> dict[str, Any]:
        with self._lock:
            self.deleted.extend(entry["ReceiptHandle"] for entry in call["Entries"])
        return {"Successful": [], "Failed": []}

    def close(self) -> None:
        pass


class FakeSns:
    """Subscribe, refused (as IAM refuses it) while ``denied``."""

    def __init__(self, *, denied: bool = False) -> None:
        self.denied = denied
        self.subscriptions: list[dict[str, Any]] = []

    def subscribe(self, **call: Any) -> dict[str, Any]:
        if self.denied:
            raise botocore.exceptions.ClientError(
                {
                    "Error": {
                        "Code": "AuthorizationError",
                        "Message": "User: arn:aws:sts::111122223333:assumed-role/pod is not "
                        "authorized to perform: SNS:Subscribe on resource: " + TOPIC,
                    }
                },
                "Subscribe",
            )
        self.subscriptions.append(call)
        return {"SubscriptionArn": f"{TOPIC}:0123"}

    def close(self) -> None:
        pass


def _job(
    sqs: FakeSqs, sns: FakeSns, clock: FakeClock, wakes: list[str]
) -> tuple[SqsStoreEvents, MemberQueue]:
    queue = MemberQueue(TOPIC, "controlplane-m1", sns=sns)
    events = SqsStoreEvents(
        queue,
        bucket="models",
        base="prod/",
        wake=lambda: wakes.append("watcher"),
        desired_changed=lambda models: wakes.append(f"fleet sync: {', '.join(sorted(models))}"),
        clock=clock,
        poll_interval=300,
        client=sqs,
    )
    return events, queue


def test_a_member_makes_its_queue_lets_only_the_topic_send_and_subscribes_it() -> None:
    sqs, sns, wakes = FakeSqs(), FakeSns(), list[str]()
    events, _queue = _job(sqs, sns, FakeClock(), wakes)

    async def scenario() -> None:
        job = asyncio.create_task(events.run())
        await until(lambda: events.health().up, "the queue made and received from")
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    asyncio.run(scenario())
    assert sqs.created == ["controlplane-m1"]
    assert events.health().source == QUEUE_URL  # named by its URL once made
    (statement,) = json.loads(sqs.attributes["Policy"])["Statement"]
    assert statement["Principal"] == {"Service": "sns.amazonaws.com"}
    assert statement["Action"] == "sqs:SendMessage"
    assert statement["Resource"] == QUEUE_ARN
    assert statement["Condition"] == {"ArnEquals": {"aws:SourceArn": TOPIC}}
    assert int(sqs.attributes["MessageRetentionPeriod"]) <= 4 * 3600
    (subscription,) = sns.subscriptions
    assert (subscription["TopicArn"], subscription["Protocol"], subscription["Endpoint"]) == (
        TOPIC,
        "sqs",
        QUEUE_ARN,
    )
    assert "RawMessageDelivery" not in json.dumps(subscription)  # SNS's envelope is unwrapped
    assert wakes == []


def test_a_member_that_may_not_subscribe_says_which_permission_and_tries_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="controlplane.adapters.stores")
    sqs, sns, wakes, clock = FakeSqs(), FakeSns(denied=True), list[str](), FakeClock()
    events, _queue = _job(sqs, sns, clock, wakes)

    async def scenario() -> None:
        job = asyncio.create_task(events.run())
        await until(lambda: events.health().state is NotificationState.UNREACHABLE, "refused")
        health = events.health()
        assert health.source == "controlplane-m1"  # no URL yet: named by its name
        assert health.problem is not None
        assert f"needs sns:Subscribe on {TOPIC}" in health.problem
        assert "AuthorizationError" in health.problem
        assert health.problem_line() is not None
        assert not job.done()  # it tries again; the watcher polls meanwhile
        sns.denied = False  # the role is given the permission
        await until(lambda: clock.sleepers() > 0, "waiting to try again")
        await clock.step()
        await until(lambda: events.health().up, "the queue subscribed on the next try")
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    asyncio.run(scenario())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "sns:Subscribe" in warnings[0]
    assert "falling back to polling" in warnings[0]
    assert sqs.created == ["controlplane-m1", "controlplane-m1"]  # CreateQueue is idempotent
    assert events.health().source == QUEUE_URL
    # A full listing once it answers: events may have been missed while it was refused.
    assert wakes == ["watcher"]


def test_a_member_s_queue_deleted_under_it_is_made_and_subscribed_again() -> None:
    sqs, sns, clock = FakeSqs(), FakeSns(), FakeClock()
    events, _queue = _job(sqs, sns, clock, [])

    async def scenario() -> None:
        job = asyncio.create_task(events.run())
        await until(lambda: events.health().up, "receiving")
        sqs.gone = True  # a clean-up of stale queues took this live member's
        await until(lambda: events.health().state is NotificationState.UNREACHABLE, "lost")
        assert "makes it again" in (events.health().problem or "")
        await until(lambda: clock.sleepers() > 0, "waiting to try again")
        await clock.step()
        await until(lambda: events.health().up, "made, subscribed and received from again")
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    asyncio.run(scenario())
    assert sqs.created == ["controlplane-m1", "controlplane-m1"]
    assert len(sns.subscriptions) == 2


def test_a_change_of_the_desired_state_wakes_the_fleet_sync_and_a_heartbeat_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="controlplane.adapters.stores.sqs_events")
    sqs, sns, wakes = FakeSqs(), FakeSns(), list[str]()
    events, _queue = _job(sqs, sns, FakeClock(), wakes)

    async def scenario() -> None:
        job = asyncio.create_task(events.run())
        await until(lambda: events.health().up, "receiving")
        sqs.send("beat", _through_sns("prod/_controlplane/members/m2.json"))
        await until(lambda: "beat" in sqs.deleted, "the heartbeat's event deleted")
        assert wakes == []

        sqs.send("deployed", _through_sns("prod/_controlplane/desired/resnet.json"))
        await until(lambda: wakes == ["fleet sync: resnet"], "the fleet sync woken for resnet")
        await until(lambda: "deployed" in sqs.deleted, "deleted at once: the sync reads it all")
        sqs.send(
            "by hand", _through_sns("prod/_controlplane/desired/bert.json", "ObjectRemoved:Delete")
        )
        await until(
            lambda: wakes == ["fleet sync: resnet", "fleet sync: bert"],
            "woken for a record deleted by hand",
        )
        await until(lambda: "by hand" in sqs.deleted, "that one deleted too")
        assert events.take().models == frozenset()  # nothing for the release watcher to list
        job.cancel()
        await asyncio.gather(job, return_exceptions=True)

    asyncio.run(scenario())
    drops = [r for r in caplog.records if r.__dict__.get("drop") == "heartbeat"]
    assert len(drops) == 1
    assert "docs/notifications.md" in drops[0].getMessage()


@pytest.mark.parametrize(
    ("member", "queue"),
    [
        ("controlplane-7d9f8b6c4-x2x5k", "controlplane-controlplane-7d9f8b6c4-x2x5k"),
        ("gpu-node.example", "controlplane-gpu-node-example"),
    ],
)
def test_a_member_s_queue_is_named_after_it(member: str, queue: str) -> None:
    assert member_queue_name(member) == queue


def test_members_with_long_names_that_share_a_beginning_get_two_queues() -> None:
    one, two = member_queue_name("a" * 100 + "1"), member_queue_name("a" * 100 + "2")
    assert one != two
    assert len(one) == len(two) == 80


def _settings(store: dict[str, Any], member: str = "m1") -> Settings:
    return Settings.model_validate(
        {"repository": {"path": "/srv/repository"}, "fleet": {"member": member}, "store": store}
    )


def test_the_queue_is_named_after_the_member_unless_a_name_is_given() -> None:
    topic = {"uri": "s3://models/prod", "notifications": {"sns_topic_arn": TOPIC}}
    assert _settings(topic, member="pod-abc").member_queue_name == "controlplane-pod-abc"
    named = {
        "uri": "s3://models/prod",
        "notifications": {"sns_topic_arn": TOPIC, "queue_name": "q"},
    }
    assert _settings(named).member_queue_name == "q"


@pytest.mark.parametrize(
    ("store", "message"),
    [
        (
            {"uri": "file:///srv/store", "notifications": {"sns_topic_arn": TOPIC}},
            r"store\.notifications\.sns_topic_arn needs an S3 store",
        ),
        (
            {
                "uri": "s3://models/prod",
                "notifications": {"sns_topic_arn": TOPIC, "sqs_queue_url": QUEUE_URL},
            },
            "give sqs_queue_url .* or sns_topic_arn .* not both",
        ),
        (
            {"uri": "s3://models/prod", "notifications": {"queue_name": "q"}},
            "give store.notifications.sns_topic_arn too",
        ),
        (
            {"uri": "s3://models/prod", "notifications": {"sns_topic_arn": "model-events"}},
            "give the topic's ARN",
        ),
        (
            {
                "uri": "s3://models/prod",
                "notifications": {"sns_topic_arn": TOPIC, "queue_name": "controlplane.m1"},
            },
            "letters, digits, hyphens and underscores only",
        ),
    ],
)
def test_notification_settings_that_cannot_work_are_refused_saying_why(
    store: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        _settings(store)
