"""The adapters whose kind the settings choose: a directory or an S3 store, where the fleet's
desired state lives beside it, and the overload watcher's source of GPU utilisation.

boto3 is imported only when the store is S3, so a daemon on a directory store never loads it.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.adapters.stores.fleet_local import LocalDesiredStates
from controlplane.adapters.stores.local import LocalStore
from controlplane.adapters.triton.metrics import TritonMetrics
from controlplane.ports import DesiredStates, ModelStore, Telemetry, UtilizationSource
from controlplane.settings import Settings


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


def build_records(settings: Settings, store: ModelStore) -> DesiredStates:
    """Where the fleet's desired state and heartbeats live: beside the releases."""
    if settings.store.scheme == "s3":
        from controlplane.adapters.stores.s3 import S3Store
        from controlplane.adapters.stores.s3_fleet import S3DesiredStates

        assert isinstance(store, S3Store)
        return S3DesiredStates(store)
    return LocalDesiredStates(settings.store.local_path)


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
