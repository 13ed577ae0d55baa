"""An S3 bucket's event notifications, read from an SQS queue: which models to list at once,
and when the fleet's desired state changed.

The bucket sends an ``s3:ObjectCreated:*`` event for every ``SHA256SUMS`` uploaded (the
publisher's commit marker) to the queue; this job long-polls it (20 s waits) and wakes the
release watcher with the models the events name (:mod:`.s3_events` reads a message). It is the
store's :class:`~controlplane.ports.ChangeEvents`, as the local store's inotify is, with two
differences that follow from SQS:

- **At-least-once, late or lost; one consumer each.** A queue of this member's own (the
  fan-out's, or one given with ``store.notifications.queue_per_member``) hears every release
  marker: a take vouches for the models it does not name (``complete``) when the queue was
  live the whole time since the previous take (never the first take after its first answer or
  after an unreachable spell), so a quiet beat lists nothing, and the whole store every
  ``store.full_scan_seconds`` finds what an event lost on the way would have named. A queue the
  fleet shares hands each event to one member: a quiet take is not complete, and every quiet
  beat (``store.poll_interval_seconds``) lists the whole store.
- **A message is deleted only once handled.** A take hands the named models' messages to the
  watcher's scan; they are deleted when the watcher says it has listed those models and acted
  on them (:meth:`handled`), and only those. A daemon that dies in between, or a listing that
  failed, leaves the message in the queue: SQS shows it again after its visibility timeout.
  Messages that name no model (not JSON, not an S3 event, the ``s3:TestEvent`` S3 sends when a
  notification is configured, another bucket, a key outside the store or not a marker) are
  deleted at once and logged, at most once a minute per kind of drop. No body can stop the
  job: one that reading fails on (``unreadable``) is dropped the same way.

In a fan-out (the bucket's events go to an SNS topic, each member has a queue of its own:
:mod:`.sqs_member_queue` makes it before the first receive) the bucket also announces each
change of the desired state (``_controlplane/desired/<model>.json`` written or deleted): such a
message wakes the fleet sync (``desired_changed``, as ``POST /v1/fleet/wake`` does) and is
deleted at once, since the sync reads the whole desired state, and a member that dies before
reads it at its start anyway.

A queue that cannot be reached (it does not exist, access is denied, no connection) changes
nothing but latency: the state turns ``unreachable`` (logged once per change, shown in
``/healthz`` and ``controlplane_store_notifications_up``), and the queue is tried again with a
backoff that doubles up to :data:`RECONNECT`'s limit; the first answer turns it ``live`` again and
wakes the watcher for a full listing of what was missed. A queue this member may not make or
subscribe is reported the same way, naming the permission it lacks, and tried again alike.

Each receive runs in a daemon thread of its own (:mod:`.daemon_thread`): a long poll cannot be
interrupted, and a worker thread of the event loop's executor would hold shutdown for up to
20 s. This module and :mod:`.sqs_member_queue` own every call to SQS (and SNS), so boto3 stays
in the S3 store's package.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlparse

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]

from controlplane.adapters.stores.daemon_thread import in_daemon_thread
from controlplane.adapters.stores.s3_events import Drop, Heard, read_message
from controlplane.adapters.stores.sqs_member_queue import MemberQueue
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.notifications import NotificationHealth, NotificationState
from controlplane.ports import Clock, StoreChanges
from controlplane.timing import Backoff

log = logging.getLogger(__name__)
WAIT_SECONDS = 20  # SQS's longest long poll: one request per 20 s while the queue is quiet
RECONNECT = Backoff(first=1.0, limit=30.0)  # an unreachable queue is tried again this often
DROP_LOG_EVERY = 60.0  # s between two log lines about dropped messages of one kind
_AWS_HOST = re.compile(
    r"^(?:sqs\.)?(?P<region>[a-z]{2}(?:-[a-z]+)+-\d)\.(?:queue\.)?amazonaws\.com"
)


class SqsStoreEvents:
    """The S3 store's events through SQS, as the release watcher reads them; :meth:`run` is
    the job that receives them.

    ``queue``: the URL of a queue given, or this member's queue on the fleet's SNS topic, made
    by the job before it receives. ``own_queue``: the queue given is this member's alone (one
    it makes always is), so its events vouch for the models they do not name;
    ``full_scan_every``: the watcher's full scans, for the log. ``desired_changed``: what to
    call when the fleet's desired state changed (the fleet sync's wake); None without a
    fleet."""

    def __init__(
        self,
        queue: str | MemberQueue,
        *,
        bucket: str,
        base: str,
        wake: Callable[[], None],
        clock: Clock,
        poll_interval: float,
        own_queue: bool = False,
        full_scan_every: float = 300.0,
        desired_changed: Callable[[frozenset[str]], None] | None = None,
        client: Any | None = None,
        wait_seconds: int = WAIT_SECONDS,
        backoff: Backoff = RECONNECT,
    ) -> None:
        self._setup = queue if isinstance(queue, MemberQueue) else None
        self._url = queue if isinstance(queue, str) else None  # None: not made yet
        self._bucket = bucket
        self._base = base
        self._wake = wake
        self._desired_changed = desired_changed
        self._clock = clock
        self._poll_interval = poll_interval
        self._vouches = own_queue or isinstance(queue, MemberQueue)  # hears every marker
        self._full_scan_every = full_scan_every
        self._wait = wait_seconds
        self._backoff = backoff
        self._owns_client = client is None
        region = queue.region if isinstance(queue, MemberQueue) else _region_of(queue)
        self._client = client if client is not None else _client_for(region)
        self._health = NotificationHealth(self._queue, NotificationState.STARTING, clock.now())
        self._pending: dict[str, list[str]] = {}  # model -> receipt handles, not taken yet
        self._taken: dict[str, list[str]] = {}  # handed to the scan running now
        self._missed = True  # events may have been missed: the next take is not complete
        self._to_delete: list[str] = []
        self._deletes = asyncio.Event()
        self._drops = _DropLog(clock)
        self._lives = 0  # how many times the queue turned live: a token for vouch()

    # --- ChangeEvents -------------------------------------------------------------------

    def take(self) -> StoreChanges:
        # Messages taken by a scan that never said it handled them (it failed) are left
        # alone: SQS shows them again after their visibility timeout.
        self._taken, self._pending = self._pending, {}
        live = self._health.up and not self._missed  # the whole time since the last take
        # A queue of this member's own hears every release: what it did not name did not
        # change. A shared one's events for other models may have gone to another member.
        complete = live and (self._vouches or bool(self._taken))
        self._missed = not self._health.up
        return StoreChanges(frozenset(self._taken), complete=complete)

    def handled(self, models: frozenset[str]) -> None:
        for model in models & self._taken.keys():
            self._to_delete.extend(self._taken.pop(model))
        if self._to_delete:
            self._deletes.set()

    def vouch(self) -> int | None:
        """The fleet sync's :class:`~controlplane.ports.DesiredStateEvents`: a token that
        holds while this member's own queue (the fan-out) is live, so every change of the
        desired state the bucket announces reaches it (``own_queue``, or one it made); None
        with a queue the fleet shares (another member may take an event), or while the queue
        is not live."""
        if not self._vouches or self._desired_changed is None or not self._health.up:
            return None
        return self._lives

    def health(self) -> NotificationHealth:
        return self._health

    # --- the job ------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._receive_forever(), name="sqs-receive")
                group.create_task(self._delete_forever(), name="sqs-delete")
        finally:
            self._set(NotificationState.STARTING)
            if self._owns_client:
                self._client.close()
            if self._setup is not None:
                self._setup.close()

    @property
    def _queue(self) -> str:
        """The queue, as logs and status name it: its URL, or its name until it is made."""
        if self._url is not None:
            return self._url
        assert self._setup is not None
        return self._setup.name

    async def _receive_forever(self) -> None:
        delay: float | None = None  # since the queue last answered
        while True:
            try:
                if self._url is None:
                    await self._set_up()
                answer = await in_daemon_thread(self._receive)
            except (*_LIBRARY, ControlPlaneError) as exc:
                why = _why(exc, self._queue)
                if self._setup is not None and _queue_gone(exc):
                    why = f"{self._queue} was deleted; this member makes it again and subscribes it"
                    self._url = None  # deleted under this member (a clean-up gone wrong)
                delay = self._backoff.after(delay)
                self._unreachable(why, delay)
                await self._clock.sleep(delay)
                continue
            delay = None
            self._reached()
            heard = Heard()
            for message in answer.get("Messages", []):
                heard |= self._heard(message)
            if heard.models:
                self._wake()
            if heard.desired and self._desired_changed is not None:
                self._desired_changed(heard.desired)
            if self._to_delete:
                self._deletes.set()

    async def _set_up(self) -> None:
        """Make this member's queue on the topic; its URL from then on."""
        assert self._setup is not None
        url = await in_daemon_thread(functools.partial(self._setup.set_up, self._client))
        self._url = url
        self._health = dataclasses.replace(self._health, source=url)

    def _receive(self) -> dict[str, Any]:
        # Until the queue has answered once (at start, after a failure), ask without waiting:
        # whether it can be reached is known at once, not after a quiet long poll.
        wait = self._wait if self._health.up else 0
        answer: dict[str, Any] = self._client.receive_message(
            QueueUrl=self._url, WaitTimeSeconds=wait, MaxNumberOfMessages=10
        )
        return answer

    def _heard(self, message: dict[str, Any]) -> Heard:
        """Keep a message until the models it names are listed; delete one that names none
        (a change of the desired state too: the fleet sync reads all of it when woken)."""
        handle = str(message.get("ReceiptHandle", ""))
        try:
            heard = read_message(str(message.get("Body", "")), bucket=self._bucket, base=self._base)
        except Exception as exc:
            # Whoever may send to the queue chooses the bodies: one that read_message cannot
            # read must cost a log line, not the job (it would come back after every
            # visibility timeout and stop the job again).
            heard = Heard(dropped=((Drop.UNREADABLE, f"{type(exc).__name__}: {exc}"[:200]),))
        for kind, detail in heard.dropped:
            self._drops.dropped(kind, detail, self._queue)
        if heard.desired:
            log.debug(
                "the fleet's desired state of %s changed (an event of %s)",
                ", ".join(sorted(heard.desired)),
                self._queue,
            )
        if not heard.models:
            self._to_delete.append(handle)
            return heard
        # A message that names several models is deleted once the first of them is handled:
        # the others were listed by the same scan (a take hands them over together).
        first = min(heard.models)
        self._pending.setdefault(first, []).append(handle)
        for model in heard.models - {first}:
            self._pending.setdefault(model, [])
        return heard

    async def _delete_forever(self) -> None:
        while True:
            await self._deletes.wait()
            self._deletes.clear()
            handles, self._to_delete = self._to_delete, []
            for start in range(0, len(handles), 10):  # DeleteMessageBatch takes 10 at most
                batch = handles[start : start + 10]
                try:
                    await in_daemon_thread(functools.partial(self._delete, batch))
                except _LIBRARY as exc:
                    # They come back after their visibility timeout and are handled again.
                    log.warning(
                        "could not delete %d message(s) from %s: %s",
                        len(batch),
                        self._queue,
                        _why(exc, self._queue),
                    )

    def _delete(self, handles: list[str]) -> None:
        answer = self._client.delete_message_batch(
            QueueUrl=self._url,
            Entries=[{"Id": str(i), "ReceiptHandle": handle} for i, handle in enumerate(handles)],
        )
        for failed in answer.get("Failed", []):
            log.warning(
                "SQS did not delete a message from %s (%s: %s); it comes back and is handled again",
                self._queue,
                failed.get("Code"),
                failed.get("Message"),
            )

    # --- state --------------------------------------------------------------------------

    def _reached(self) -> None:
        if self._health.up:
            return
        was = self._health.state
        self._set(NotificationState.LIVE)
        self._lives += 1
        if was is NotificationState.UNREACHABLE:
            log.info(
                "SQS queue %s answers again: new releases are listed as soon as their "
                "SHA256SUMS is uploaded; listing the whole store for what was missed",
                self._queue,
            )
            self._wake()  # a full listing now (the next take is not complete)
        else:
            log.info(
                "receiving the bucket's events from SQS queue %s: a release is listed as soon "
                "as its SHA256SUMS is uploaded%s; %s",
                self._queue,
                ", the fleet's desired state read as soon as it changes"
                if self._desired_changed is not None
                else "",
                f"the queue is this member's own, so a quiet beat lists nothing and the whole "
                f"store is listed every {self._full_scan_every:g} s"
                if self._vouches
                else f"the queue may be shared, so every quiet beat lists the whole store "
                f"(every {self._poll_interval:g} s)",
            )

    def _unreachable(self, why: str, backoff: float) -> None:
        retry_at = self._clock.now() + timedelta(seconds=backoff)
        if self._health.state is not NotificationState.UNREACHABLE:
            log.warning(
                "SQS queue %s cannot be reached (%s); falling back to polling: a new release "
                "is seen at the next listing of the store (every %g s); trying the queue "
                "again, at most %g s apart",
                self._queue,
                why,
                self._poll_interval,
                self._backoff.limit,
            )
            self._set(NotificationState.UNREACHABLE, problem=why, retry_at=retry_at)
        else:
            self._health = NotificationHealth(
                self._queue, self._health.state, self._health.since, why, retry_at
            )
        self._missed = True

    def _set(
        self,
        state: NotificationState,
        *,
        problem: str | None = None,
        retry_at: datetime | None = None,
    ) -> None:
        self._health = NotificationHealth(self._queue, state, self._clock.now(), problem, retry_at)
        if state is not NotificationState.LIVE:
            self._missed = True


class _DropLog:
    """One log line per kind of dropped message per :data:`DROP_LOG_EVERY`, with the count of
    those it did not log: a flood of junk costs a line a minute."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last: dict[Drop, float] = {}
        self._unlogged: dict[Drop, int] = {}

    def dropped(self, kind: Drop, detail: str, queue: str) -> None:
        now = self._clock.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < DROP_LOG_EVERY:
            self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
            return
        more = self._unlogged.pop(kind, 0)
        self._last[kind] = now
        level = logging.INFO if kind is Drop.TEST_EVENT else logging.WARNING
        log.log(
            level,
            "dropped a message from %s that names no release to list (%s: %s)%s",
            queue,
            kind.value,
            detail,
            f"; and {more} more of this kind since the last line" if more else "",
            extra={"drop": kind.value},
        )


# --- plumbing -------------------------------------------------------------------------------

_LIBRARY = (
    botocore.exceptions.ClientError,
    botocore.exceptions.BotoCoreError,
)


def _queue_gone(exc: Exception) -> bool:
    if not isinstance(exc, botocore.exceptions.ClientError):
        return False
    error = exc.response.get("Error", {})
    code, query = str(error.get("Code", "")), str(error.get("QueryErrorCode", ""))
    return "NonExistentQueue" in code or query == "QueueDoesNotExist"


def _why(exc: Exception, url: str) -> str:
    """What is wrong with the queue, and what to do, for the log and status."""
    if isinstance(exc, ControlPlaneError):  # said by the queue's set-up, for its step
        return exc.message
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = error.get("Message", "") or str(exc)
        if _queue_gone(exc):
            return (
                f"the queue does not exist: create it or fix "
                f"store.notifications.sqs_queue_url ({code}: {message})"
            )
        if code in ("AccessDenied", "AccessDeniedException") or "denied" in message.lower():
            return (
                "access denied: the daemon needs sqs:ReceiveMessage and sqs:DeleteMessage on "
                f"the queue ({code}: {message})"
            )
        return f"{code or 'error'}: {message}"
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return f"no AWS credentials were found: {exc}"
    return f"{type(exc).__name__}: {exc}"


def _region_of(queue_url: str) -> str | None:
    """The region of an AWS queue URL; None for another API's (the chain's region then)."""
    match = _AWS_HOST.match(urlparse(queue_url).netloc)
    return match.group("region") if match else None


def _client_for(region: str | None) -> Any:
    """An SQS client from the standard AWS chain; the queue's region wins over the chain's (a
    queue lives in one region), and ``AWS_ENDPOINT_URL_SQS`` names another API."""
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        read_timeout=WAIT_SECONDS + 10,  # a long poll answers after WAIT_SECONDS at most
        connect_timeout=5,
    )
    return boto3.session.Session().client("sqs", region_name=region, config=config)
