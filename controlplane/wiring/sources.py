"""The adapters whose kind the settings choose: a directory or an S3 store, where the fleet's
desired state lives beside it, and the overload watcher's source of GPU utilisation.

boto3 is imported only when the store is S3, so a daemon on a directory store never loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from controlplane.adapters.stores.fleet_local import LocalDesiredStates
from controlplane.adapters.stores.local import LocalStore
from controlplane.adapters.stores.local_watch import LocalStoreEvents
from controlplane.adapters.triton.metrics import TritonMetrics
from controlplane.ports import Clock, DesiredStates, ModelStore, Telemetry, UtilizationSource
from controlplane.settings import Settings

if TYPE_CHECKING:
    from controlplane.adapters.stores.sqs_events import SqsStoreEvents


def build_store(settings: Settings, telemetry: Telemetry | None = None) -> ModelStore:
    """The store the settings name; ``telemetry`` hears about its retries."""
    store = settings.store
    if store.scheme == "s3":
        from controlplane.adapters.stores.s3 import S3Store  # boto3 only when S3 is used

        return S3Store(
            store.uri,
            max_concurrency=store.max_concurrency,
            multipart_threshold=store.multipart_threshold_bytes,
            part_size=store.part_size_bytes,
            retry_seconds=store.retry_seconds,
            telemetry=telemetry,
        )
    return LocalStore(store.local_path, telemetry=telemetry)


def build_store_events(
    settings: Settings,
    store: ModelStore,
    wake: Callable[[], None],
    clock: Clock,
    desired_changed: Callable[[frozenset[str]], None] | None = None,
) -> LocalStoreEvents | SqsStoreEvents | None:
    """What tells the release watcher which models changed: a local store's inotify, an S3
    bucket's notifications through the SQS queue the settings name (or this member's own queue
    on the SNS topic they name); None: polling only. ``desired_changed``: the fleet sync's wake,
    for the bucket's events of a change of the desired state (None without a fleet)."""
    if isinstance(store, LocalStore):
        return LocalStoreEvents(settings.store.local_path, wake, clock=clock)
    notifications = settings.store.notifications
    if not notifications.enabled:
        return None  # every beat lists the whole store
    from controlplane.adapters.stores.s3 import S3Store
    from controlplane.adapters.stores.sqs_events import SqsStoreEvents
    from controlplane.adapters.stores.sqs_member_queue import MemberQueue

    assert isinstance(store, S3Store)  # the settings refuse a queue beside a local store
    queue: str | MemberQueue
    if notifications.sqs_queue_url is not None:
        queue = notifications.sqs_queue_url
    else:
        assert notifications.sns_topic_arn is not None  # enabled: one of the two
        queue = MemberQueue(notifications.sns_topic_arn, settings.member_queue_name)
    return SqsStoreEvents(
        queue,
        bucket=store.bucket,
        base=store.base,
        wake=wake,
        clock=clock,
        poll_interval=settings.store.poll_interval_seconds,
        own_queue=notifications.own_queue,
        full_scan_every=settings.store.full_scan_seconds,
        desired_changed=desired_changed,
    )


def build_records(
    settings: Settings, store: ModelStore, *, clock: Callable[[], datetime]
) -> DesiredStates:
    """Where the fleet's desired state and heartbeats live: beside the releases. ``clock``:
    the daemon's, on which the heartbeats read are said to have landed."""
    if settings.store.scheme == "s3":
        from controlplane.adapters.stores.s3 import S3Store
        from controlplane.adapters.stores.s3_fleet import S3DesiredStates

        assert isinstance(store, S3Store)
        return S3DesiredStates(store, clock=clock, listing_every=settings.store.full_scan_seconds)
    return LocalDesiredStates(settings.store.local_path, clock=clock)


def build_utilization_source(
    settings: Settings, metrics_at: Callable[[str | None], TritonMetrics]
) -> UtilizationSource | None:
    """The overload watcher's source of GPU utilisation; None when it is off."""
    rollback = settings.rollback
    if rollback.source == "triton":
        return metrics_at(rollback.metrics_url)
    if rollback.source == "prometheus":
        from controlplane.adapters.prometheus import PrometheusQuery

        assert rollback.prometheus_url is not None  # checked by the settings
        return PrometheusQuery(rollback.prometheus_url, rollback.query)
    return None
