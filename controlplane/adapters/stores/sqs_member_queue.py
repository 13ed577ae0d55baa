"""This member's own SQS queue on the fleet's SNS topic: the subscriber's end of the fan-out.

SQS hands a message to one consumer, so a queue shared by the fleet tells one member of each
event. With the bucket's events sent to an SNS topic instead, each member subscribes a queue of
its own and every member hears every release and every change of the desired state. At start
(:meth:`MemberQueue.set_up`, before the first receive) a member makes that queue itself:

1. ``sqs:CreateQueue`` of its name (idempotent: the queue of a member that restarts under the
   same name is found and reused, with what it holds);
2. ``sqs:GetQueueAttributes`` for its ARN;
3. ``sqs:SetQueueAttributes``: the policy that lets the topic (and only it) send to the queue,
   and a retention of :data:`RETENTION_SECONDS`;
4. ``sns:Subscribe`` of the queue to the topic (idempotent too: the same subscription again).

Raw message delivery stays off: the consumer unwraps SNS's envelope. A step that fails raises
:class:`~controlplane.domain.errors.StoreError` naming the permission it needed (access denied)
or what went wrong (:class:`~controlplane.domain.errors.StoreUnavailable` when SQS or SNS did
not answer); the consumer reports it as its queue's problem, polls meanwhile and tries
again with its backoff. The queue is never deleted by the daemon (see docs/notifications.md for
why, and how stale queues are cleaned up).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]

from controlplane.domain.errors import StoreError, StoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")
# A message older than this is worth nothing to a member that comes back: it lists the whole
# store and reads the whole desired state on its return. The bound keeps a queue left behind by
# a pod that is gone small until it is cleaned up.
RETENTION_SECONDS = 3600
_DENIED = frozenset(
    {"AccessDenied", "AccessDeniedException", "AuthorizationError", "AuthorizationErrorException"}
)


class MemberQueue:
    """The queue ``name`` subscribed to ``topic_arn``, in the topic's region and account."""

    def __init__(self, topic_arn: str, name: str, *, sns: Any | None = None) -> None:
        self.topic_arn = topic_arn
        self.name = name
        parts = topic_arn.split(":")  # arn:aws:sns:<region>:<account>:<topic>
        self.region = parts[3]
        self._queue_arn = f"arn:{parts[1]}:sqs:{self.region}:{parts[4]}:{name}"
        self._sns = sns
        self._owns_sns = sns is None

    def set_up(self, sqs: Any) -> str:
        """Make the queue, let the topic send to it, subscribe it; return its URL. Blocking
        (four requests); :class:`StoreError` when a step fails."""
        url: str = self._step(
            "sqs:CreateQueue",
            self._queue_arn,
            lambda: sqs.create_queue(QueueName=self.name)["QueueUrl"],
        )
        arn: str = self._step(
            "sqs:GetQueueAttributes",
            self._queue_arn,
            lambda: sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
                "Attributes"
            ]["QueueArn"],
        )
        attributes = {
            "Policy": json.dumps(self._policy(arn)),
            "MessageRetentionPeriod": str(RETENTION_SECONDS),
        }
        self._step(
            "sqs:SetQueueAttributes",
            arn,
            lambda: sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes),
        )
        subscription: str = self._step(
            "sns:Subscribe",
            self.topic_arn,
            lambda: self._topic().subscribe(
                TopicArn=self.topic_arn,
                Protocol="sqs",
                Endpoint=arn,
                ReturnSubscriptionArn=True,
            )["SubscriptionArn"],
        )
        log.info(
            "made this member's SQS queue %s (created, or found from an earlier start), let the "
            "SNS topic %s send to it and subscribed it (%s): this member hears every release "
            "and every change of the fleet's desired state the bucket announces",
            url,
            self.topic_arn,
            subscription,
        )
        return url

    def close(self) -> None:
        if self._owns_sns and self._sns is not None:
            self._sns.close()
            self._sns = None

    def _policy(self, queue_arn: str) -> dict[str, Any]:
        return {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "controlplane-fanout",
                    "Effect": "Allow",
                    "Principal": {"Service": "sns.amazonaws.com"},
                    "Action": "sqs:SendMessage",
                    "Resource": queue_arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": self.topic_arn}},
                }
            ],
        }

    def _topic(self) -> Any:
        if self._sns is None:
            config = botocore.config.Config(
                retries={"total_max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=10,
            )
            self._sns = boto3.session.Session().client(
                "sns", region_name=self.region, config=config
            )
        return self._sns

    def _step(self, permission: str, resource: str, call: Callable[[], T]) -> T:
        """``call()``, its library errors mapped to a :class:`StoreError` that names the
        queue, the step's permission and what to do."""
        try:
            return call()
        except botocore.exceptions.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "")) or "error"
            message = error.get("Message", "") or str(exc)
            if code in _DENIED or "not authorized" in message.lower():
                why = (
                    f"this member may not set up its queue {self.name}: it needs {permission} "
                    f"on {resource} (docs/notifications.md lists every permission; or give "
                    f"store.notifications.sqs_queue_url, a queue made for it) ({code}: {message})"
                )
            elif permission == "sns:Subscribe" and code in ("NotFound", "NotFoundException"):
                why = (
                    f"the SNS topic {self.topic_arn} does not exist: create it or fix "
                    f"store.notifications.sns_topic_arn ({code}: {message})"
                )
            else:
                why = f"setting up the queue {self.name} failed at {permission} ({code}: {message})"
            raise StoreError(why, details={"queue": self.name, "permission": permission}) from exc
        except botocore.exceptions.BotoCoreError as exc:  # no connection, no credentials, ...
            raise StoreUnavailable(
                f"setting up the queue {self.name} failed at {permission} "
                f"({type(exc).__name__}: {exc})",
                details={"queue": self.name, "permission": permission},
            ) from exc
