"""The one place where concrete adapters are built from settings and handed to services."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from controlplane.adapters.clock import SystemClock
from controlplane.adapters.host import HostAndGpuMemory
from controlplane.adapters.persistence.sqlite import SqliteStateRepo
from controlplane.adapters.staging.fs import StagingArea
from controlplane.adapters.stores.local import LocalStore
from controlplane.adapters.stores.local_watch import watch_local_store
from controlplane.adapters.telemetry import PrometheusTelemetry
from controlplane.adapters.triton.driver import TritonDriver
from controlplane.adapters.triton.metrics import TritonMetrics
from controlplane.adapters.triton.model_config import ProtobufConfigEditor
from controlplane.adapters.triton.residue import ProcessAuditor
from controlplane.domain.evaluator import Aggregate, EvaluatorConfig
from controlplane.ports import ModelStore, UtilizationSource
from controlplane.services.alerts import AlertReceiver
from controlplane.services.coordination import ModelLocks, TaskOwner
from controlplane.services.deploy import DeployPolicy, DeployService
from controlplane.services.headroom import HeadroomPolicy
from controlplane.services.memory import LeakPolicy, MemoryWatch
from controlplane.services.overload import OverloadWatcher
from controlplane.services.reconcile import Reconciler
from controlplane.services.rollback import AutoRollback, RollbackBudgets
from controlplane.services.status import StatusService
from controlplane.services.watcher import ReleaseWatcher
from controlplane.settings import Settings


@dataclass
class Container:
    """Everything the API needs, built once; ``close`` releases it."""

    settings: Settings
    deploy: DeployService
    status: StatusService
    reconciler: Reconciler
    tasks: TaskOwner
    triton: TritonDriver
    repo: SqliteStateRepo
    ready: asyncio.Event
    watcher: ReleaseWatcher
    store: ModelStore
    rollback: AutoRollback
    alerts: AlertReceiver
    overload: OverloadWatcher | None
    memory: MemoryWatch
    telemetry: PrometheusTelemetry
    background: list[Callable[[], Coroutine[Any, Any, None]]]
    readers: list[TritonMetrics | UtilizationSource]  # HTTP clients, one per URL

    async def close(self) -> None:
        await self.tasks.close()
        await self.triton.close()
        for reader in self.readers:
            await reader.close()
        self.store.close()
        self.repo.close()


def check_filesystem(settings: Settings) -> StagingArea:
    """Start-up check: refuse to run where placement could not be atomic."""
    staging = StagingArea(
        settings.repository.path,
        settings.staging_path,
        cache_max_bytes=settings.staging.cache_max_bytes,
    )
    staging.check()
    return staging


def build_store(settings: Settings) -> ModelStore:
    if settings.store.scheme == "s3":
        from controlplane.adapters.stores.s3 import S3Store  # boto3 only when S3 is used

        return S3Store(settings.store.uri, max_concurrency=settings.store.max_concurrency)
    return LocalStore(settings.store.local_path)


def build(settings: Settings) -> Container:
    """Build the object graph. Must run inside the event loop that will serve requests."""
    staging = check_filesystem(settings)
    store = build_store(settings)
    clock = SystemClock()
    repo = SqliteStateRepo(settings.database_path)
    telemetry = PrometheusTelemetry(repo)
    triton = TritonDriver(
        settings.triton.grpc_url,
        call_timeout=settings.triton.call_timeout_seconds,
        load_timeout=settings.triton.load_timeout_seconds,
        attempts=settings.triton.retry_attempts,
    )
    locks = ModelLocks()
    tasks = TaskOwner()
    readers: dict[str, TritonMetrics] = {}

    def metrics_at(url: str | None) -> TritonMetrics:
        """One reader (one HTTP client) per metrics URL, however many uses share it."""
        url = url or settings.triton.metrics_url
        return readers.setdefault(url, TritonMetrics(url))

    metrics = metrics_at(None)
    memory = HostAndGpuMemory(metrics_at(settings.memory.gpu_metrics_url))
    memory_watch = MemoryWatch(
        processes=(
            ProcessAuditor(settings.repository.path, pid=settings.memory.triton_pid)
            if settings.memory.audit
            else None
        ),
        figures=memory,
        repo=repo,
        clock=clock,
        policy=LeakPolicy(
            window=settings.memory.leak_window_swaps,
            threshold=settings.memory.leak_threshold_bytes,
        ),
        telemetry=telemetry,
    )
    deploy = DeployService(
        store=store,
        staging=staging,
        editor=ProtobufConfigEditor(),
        triton=triton,
        repo=repo,
        clock=clock,
        locks=locks,
        tasks=tasks,
        load_slots=asyncio.Semaphore(_load_concurrency(settings, repo)),
        policy=DeployPolicy(
            require_checksums=settings.store.require_checksums,
            unload_timeout=settings.triton.unload_timeout_seconds,
        ),
        traffic=settings.traffic,
        metrics=metrics,
        telemetry=telemetry,
        headroom=HeadroomPolicy(
            figures=memory if settings.memory.headroom_check else None,
            factor=settings.memory.load_factor,
        ),
        memory=memory_watch,
    )
    reconciler = Reconciler(
        deploy=deploy,
        staging=staging,
        triton=triton,
        repo=repo,
        clock=clock,
        unload_timeout=settings.triton.unload_timeout_seconds,
        traffic=settings.traffic,
    )
    rollback = AutoRollback(
        deploy=deploy,
        repo=repo,
        clock=clock,
        budgets=RollbackBudgets(
            fallback=settings.rollback.fallback_budget_seconds,
            cpu=settings.rollback.cpu_budget_seconds,
            cooldown=settings.rollback.cooldown_seconds,
        ),
        configured_fallback=lambda model: settings.policy(model).fallback_release,
        enabled=lambda model: settings.policy(model).auto_rollback,
        telemetry=telemetry,
    )
    utilization = build_utilization_source(settings, metrics_at)
    overload = (
        None
        if utilization is None
        else OverloadWatcher(
            source=utilization,
            source_name=settings.rollback.source,
            rollback=rollback,
            clock=clock,
            tasks=tasks,
            config=EvaluatorConfig(
                threshold=settings.rollback.threshold_ratio,
                window=settings.rollback.window_seconds,
                interval=settings.rollback.interval_seconds,
            ),
            aggregate=Aggregate(settings.rollback.aggregate),
            scale=0.01 if settings.rollback.unit == "percent" else 1.0,
            telemetry=telemetry,
        )
    )
    status = StatusService(
        repo=repo,
        store=store,
        triton=triton,
        locks=locks,
        traffic=settings.traffic,
        overload=(lambda: overload.view) if overload is not None else None,
        fallback=rollback.fallback,
        cooldown_until=rollback.cooldown_until,
    )
    watcher = ReleaseWatcher(
        store=store,
        deploy=deploy,
        repo=repo,
        clock=clock,
        locks=locks,
        tasks=tasks,
        auto_deploy=lambda model: settings.policy(model).auto_deploy,
        interval=settings.store.poll_interval_seconds,
    )
    background: list[Callable[[], Coroutine[Any, Any, None]]] = [watcher.run]
    if overload is not None:
        background.append(overload.run)
    if isinstance(store, LocalStore):
        root = settings.store.local_path
        background.append(lambda: watch_local_store(root, watcher.wake))
    closers: list[TritonMetrics | UtilizationSource] = list(readers.values())
    if utilization is not None and utilization not in closers:
        closers.append(utilization)  # a Prometheus query has its own client
    return Container(
        settings=settings,
        deploy=deploy,
        status=status,
        reconciler=reconciler,
        tasks=tasks,
        triton=triton,
        repo=repo,
        ready=asyncio.Event(),
        watcher=watcher,
        store=store,
        rollback=rollback,
        alerts=AlertReceiver(
            repo=repo,
            rollback=rollback,
            clock=clock,
            tasks=tasks,
            model_label=settings.rollback.alert_label,
            telemetry=telemetry,
        ),
        telemetry=telemetry,
        overload=overload,
        memory=memory_watch,
        background=background,
        readers=closers,
    )


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


def _load_concurrency(settings: Settings, repo: SqliteStateRepo) -> int:
    """min(CPU cores, 2 x managed models): the models the database knows, so start-up needs
    no listing of a store that may be remote (or down)."""
    if settings.triton.max_concurrent_loads is not None:
        return settings.triton.max_concurrent_loads
    models = max(1, len(repo.list_models()))
    return max(1, min(os.cpu_count() or 1, 2 * models))
