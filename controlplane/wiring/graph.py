"""The object graph: every adapter built once from the settings and handed to the services.

:func:`build` must run inside the event loop that will serve requests. Pieces that need each
other both ways are bound late: the rollback asks the fleet sync, built after it from the deploy
service, for a model's previous release.
"""

from __future__ import annotations

import asyncio
import uuid
from functools import partial
from pathlib import Path

from controlplane import __version__
from controlplane.adapters.fleet_peers import HttpPeers
from controlplane.adapters.keyring import Keyring
from controlplane.adapters.persistence import SqliteRepos
from controlplane.adapters.stores.local_watch import LocalStoreEvents
from controlplane.adapters.telemetry import PrometheusTelemetry
from controlplane.adapters.triton.driver import TritonDriver
from controlplane.adapters.triton.metrics import HostAndGpuMemory, TritonMetrics
from controlplane.adapters.triton.model_config import ProtobufConfigEditor
from controlplane.adapters.triton.residue import ProcessAuditor
from controlplane.domain.evaluator import Aggregate, EvaluatorConfig
from controlplane.ports import ModelRecord, UtilizationSource
from controlplane.services.alerts import AlertReceiver
from controlplane.services.assembly import Limits, assemble
from controlplane.services.catalog import StoreCatalog
from controlplane.services.figures import FigureReader, FleetSources
from controlplane.services.fleet import FleetService
from controlplane.services.fleet_ledger import FleetLedger, Member
from controlplane.services.fleet_sync import FleetSync
from controlplane.services.memory import HeadroomPolicy, LeakPolicy, MemoryWatch
from controlplane.services.overload import OverloadWatcher
from controlplane.services.overview import OverviewService
from controlplane.services.prepare import SignaturePolicy
from controlplane.services.rollback import AutoRollback, RollbackBudgets
from controlplane.services.status import StatusService
from controlplane.services.stress import StressCheck
from controlplane.services.supervisor import Supervisor
from controlplane.services.tasks import TaskOwner
from controlplane.services.watcher import ReleaseWatcher
from controlplane.settings import Settings
from controlplane.timing import SystemClock, Wake
from controlplane.wiring.container import Container
from controlplane.wiring.sources import (
    build_records,
    build_store,
    build_store_events,
    build_utilization_source,
)
from controlplane.wiring.startup import check_filesystem


def build(settings: Settings) -> Container:
    """Build the object graph. Must run inside the event loop that will serve requests."""
    staging = check_filesystem(settings)
    clock = SystemClock()
    repos = SqliteRepos.open(settings.database_path)
    telemetry = PrometheusTelemetry()
    store = build_store(settings, telemetry)
    fleet_wake = Wake(clock)
    ledger = (
        FleetLedger(
            records=build_records(settings, store),
            member=Member(
                settings.member_name, uuid.uuid4().hex[:12], __version__, settings.fleet_url
            ),
            clock=clock,
            rollout_for=settings.rollout,
            wake=fleet_wake.set,
            peers=HttpPeers(),
        )
        if settings.fleet.enabled
        else None
    )
    triton = TritonDriver(
        settings.triton.grpc_url,
        call_timeout=settings.triton.call_timeout_seconds,
        load_timeout=settings.triton.load_timeout_seconds,
        attempts=settings.triton.retry_attempts,
    )
    tasks = TaskOwner()
    readers: dict[str, TritonMetrics] = {}

    def metrics_at(url: str | None) -> TritonMetrics:
        """One reader (one HTTP client) per metrics URL, however many uses share it."""
        url = url or settings.triton.metrics_url
        return readers.setdefault(url, TritonMetrics(url))

    metrics = metrics_at(None)
    memory = HostAndGpuMemory(
        metrics_at(settings.memory.gpu_metrics_url), shm_path=Path(settings.memory.shm_path)
    )
    memory_watch = MemoryWatch(
        processes=(
            ProcessAuditor(settings.repository.path, pid=settings.memory.triton_pid)
            if settings.memory.audit
            else None
        ),
        figures=memory,
        book=repos.memory,
        clock=clock,
        policy=LeakPolicy(
            window=settings.memory.leak_window_swaps,
            threshold=settings.memory.leak_threshold_bytes,
        ),
        telemetry=telemetry,
    )
    headroom = HeadroomPolicy(
        figures=memory if settings.memory.headroom_check else None,
        factor=settings.memory.load_factor,
        shm_per_instance=settings.memory.shm_per_instance_bytes,
        shm_backends=settings.memory.shm_backends,
        shm_margin=settings.memory.shm_margin_bytes,
    )
    pipelines = assemble(
        store=store,
        staging=staging,
        editor=ProtobufConfigEditor(),
        triton=triton,
        metrics=metrics,
        serving=repos.serving,
        journal=repos.operations,
        releases=repos.releases,
        rollbacks=repos.rollbacks,
        memory=memory_watch,
        headroom=headroom,
        clock=clock,
        timers=tasks,
        policy_for=settings.traffic,
        limits=Limits(
            concurrent_loads=settings.triton.max_concurrent_loads,
            unload_seconds=settings.triton.unload_timeout_seconds,
            require_checksums=settings.store.require_checksums,
            max_release_bytes=settings.store.max_release_bytes,
        ),
        telemetry=telemetry,
        fleet=ledger,
        member=settings.member_name,
        signatures=SignaturePolicy(
            verifier=(
                Keyring(settings.store.keyring, now=clock.now)
                if settings.store.keyring is not None
                else None
            ),
            required=settings.require_signature,
            telemetry=telemetry,
        ),
        stress=StressCheck(load=triton, figures=memory, policy_for=settings.stress),
    )
    deploy, reconciler, runner = pipelines.deploy, pipelines.reconciler, pipelines.runner

    def previous_of(record: ModelRecord) -> str | None:
        # Late-bound: the fleet sync is built below, from the deploy service.
        return fleet.previous_of(record) if fleet is not None else record.previous_release

    rollback = AutoRollback(
        deploy=deploy,
        client=pipelines.client,
        serving=repos.serving,
        book=repos.rollbacks,
        clock=clock,
        budgets=RollbackBudgets(
            fallback=settings.rollback.fallback_budget_seconds,
            cold_fallback=settings.rollback.cold_fallback_budget_seconds,
            cpu=settings.rollback.cpu_budget_seconds,
            cooldown=settings.rollback.cooldown_seconds,
        ),
        configured_fallback=lambda model: settings.policy(model).fallback_release,
        enabled=lambda model: settings.policy(model).auto_rollback,
        telemetry=telemetry,
        fleet=ledger if settings.rollback.scope == "fleet" else None,
        previous_of=previous_of,
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

    def drift(model: str) -> str | None:
        last = reconciler.last
        found = last.assessments.get(model) if last is not None else None
        return None if found is None or found.serving else found.why

    catalog = StoreCatalog()  # the watcher's last look at the store, for GET /v1/models
    status = StatusService(
        serving=repos.serving,
        journal=repos.operations,
        rollbacks=repos.rollbacks,
        store=store,
        triton=triton,
        clock=clock,
        holder=deploy.holder,
        traffic=settings.traffic,
        overload=(lambda: overload.view) if overload is not None else None,
        fallback=rollback.fallback_of,
        previous_of=previous_of,
        cooldown_until=rollback.cooldown_after,
        drift=drift,
        catalog=catalog,
    )
    wake_watcher = Wake(clock)
    events = build_store_events(settings, store, wake_watcher.set, clock)
    notifications = (  # an SQS queue's health, for /healthz and /metrics
        None if events is None or isinstance(events, LocalStoreEvents) else events.health
    )
    watcher = ReleaseWatcher(
        store=store,
        deploy=deploy,
        client=pipelines.client,
        releases=repos.releases,
        serving=repos.serving,
        rollbacks=repos.rollbacks,
        clock=clock,
        tasks=tasks,
        auto_deploy=lambda model: settings.policy(model).auto_deploy,
        require_signature=settings.require_signature,
        interval=settings.store.poll_interval_seconds,
        catalog=catalog,
        events=events,
        full_scan_every=settings.store.full_scan_seconds,
        wake=wake_watcher,
    )
    ready = asyncio.Event()
    reconciled = asyncio.Event() if ledger is not None else ready
    supervisor = Supervisor(clock, telemetry)
    supervisor.add(
        "reconcile", lambda: reconciler.run(settings.reconcile.interval_seconds, reconciled)
    )
    fleet = None
    if ledger is not None:
        fleet = FleetSync(
            ledger=ledger,
            deploy=deploy,
            client=pipelines.client,
            serving=repos.serving,
            rollbacks=repos.rollbacks,
            clock=clock,
            poll_interval=settings.store.poll_interval_seconds,
            beat_interval=settings.fleet.heartbeat_seconds,
            overload=lambda: overload_verdict(overload),
            wake=fleet_wake,
        )
        supervisor.add("fleet-sync", partial(fleet.run, reconciled, ready))

    async def watch_releases() -> None:
        await ready.wait()  # the watcher starts once start-up reconcile has run
        await watcher.run()

    supervisor.add("release-watcher", watch_releases)
    if overload is not None:
        supervisor.add("overload-watcher", overload.run)
    if events is not None:
        supervisor.add("store-events", events.run)
    fleet_view = (
        FleetService(records=ledger.records, sync=fleet, clock=clock)
        if ledger is not None and fleet is not None
        else None
    )
    figures = FigureReader(
        serving=repos.serving,
        rollbacks=repos.rollbacks,
        triton=triton,
        clock=clock,
        last_pass=lambda: reconciler.last,
        jobs=lambda: {status.name: not status.down for status in supervisor.statuses()},
        notifications=notifications,
        fleet=(
            FleetSources(fleet, fleet_view, every=settings.fleet.heartbeat_seconds)
            if fleet is not None and fleet_view is not None
            else None
        ),
    )
    closers: list[TritonMetrics | UtilizationSource] = list(readers.values())
    if utilization is not None and utilization not in closers:
        closers.append(utilization)  # a Prometheus query has its own client
    return Container(
        settings=settings,
        deploy=deploy,
        client=pipelines.client,
        status=status,
        reconciler=reconciler,
        runner=runner,
        tasks=tasks,
        triton=triton,
        repos=repos,
        ready=ready,
        watcher=watcher,
        store=store,
        rollback=rollback,
        alerts=AlertReceiver(
            book=repos.alerts,
            rollback=rollback,
            clock=clock,
            tasks=tasks,
            model_label=settings.rollback.alert_label,
            telemetry=telemetry,
        ),
        telemetry=telemetry,
        overload=overload,
        memory=memory_watch,
        supervisor=supervisor,
        readers=closers,
        overview=OverviewService(
            status=status,
            journal=repos.operations,
            rollbacks=repos.rollbacks,
            clock=clock,
            overload=overload,
            fleet=fleet_view,
            source=settings.rollback.source,
            notifications=notifications,
        ),
        figures=figures,
        fleet=fleet,
        fleet_view=fleet_view,
        notifications=notifications,
    )


def overload_verdict(overload: OverloadWatcher | None) -> str | None:
    """The overload verdict a heartbeat carries: None when the watcher is off, ``no_gpu``
    when there is no GPU to watch (nothing can overload), else the evaluator's verdict."""
    if overload is None:
        return None
    view = overload.view
    if view is None:
        return "unknown"
    if view.last_value is None and "no GPU" in view.note:
        return "no_gpu"
    return view.evaluation.verdict.value
