"""The subsystems the object graph is made of, each built from the settings and what it needs.

Each builder takes what the subsystems before it made and returns what those after it use, so
the order of :func:`~controlplane.wiring.graph.build` is the order of dependence: the base
(clock, database, telemetry, store, Triton), memory, the operations, the rollback, the watching
loops, the fleet, the views. No builder reaches back into one built after it: nothing is bound
late, so what calls what is what this file shows.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from controlplane import __version__
from controlplane.adapters.fleet_peers import HttpPeers
from controlplane.adapters.keyring import Keyring
from controlplane.adapters.persistence import SqliteRepos
from controlplane.adapters.staging.fs import StagingArea
from controlplane.adapters.stores.local_watch import LocalStoreEvents
from controlplane.adapters.telemetry import PrometheusTelemetry
from controlplane.adapters.triton.driver import TritonDriver
from controlplane.adapters.triton.metrics import HostAndGpuMemory, TritonMetrics
from controlplane.adapters.triton.model_config import ProtobufConfigEditor
from controlplane.adapters.triton.residue import ProcessAuditor
from controlplane.domain.evaluator import Aggregate, EvaluatorConfig
from controlplane.domain.notifications import NotificationHealth
from controlplane.domain.traffic import Strategy
from controlplane.ports import ModelStore, UtilizationSource
from controlplane.services.assembly import Limits, Pipelines, assemble
from controlplane.services.catalog import StoreCatalog
from controlplane.services.fleet_ledger import FleetLedger, Member
from controlplane.services.fleet_turns import FleetTurns
from controlplane.services.memory import HeadroomPolicy, LeakPolicy, MemoryWatch
from controlplane.services.overload import OverloadWatcher
from controlplane.services.prepare import SignaturePolicy
from controlplane.services.rollback import AutoRollback, RollbackBudgets
from controlplane.services.rotation import Rotation
from controlplane.services.stress import StressCheck
from controlplane.services.tasks import TaskOwner
from controlplane.services.watcher import ReleaseWatcher
from controlplane.settings import Settings
from controlplane.timing import SystemClock, Wake
from controlplane.wiring.sources import (
    build_records,
    build_store,
    build_store_events,
    build_utilization_source,
)

if TYPE_CHECKING:  # imported by the store's builder only when a queue is set: boto3 is heavy
    from controlplane.adapters.stores.sqs_events import SqsStoreEvents


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Base:
    """What every subsystem shares: time, the database, telemetry, the store, Triton."""

    settings: Settings
    staging: StagingArea
    clock: SystemClock
    repos: SqliteRepos
    telemetry: PrometheusTelemetry
    store: ModelStore
    triton: TritonDriver
    tasks: TaskOwner
    readers: dict[str, TritonMetrics]  # one Triton metrics reader (one HTTP client) per URL
    ready: asyncio.Event  # set once start-up is done (and, in a fleet, the member converged)
    rotation: Rotation  # whether this member takes traffic now, and why not (/readyz)

    def metrics_at(self, url: str | None = None) -> TritonMetrics:
        """The reader of ``url`` (Triton's own metrics by default), made once per URL."""
        url = url or self.settings.triton.metrics_url
        return self.readers.setdefault(url, TritonMetrics(url))


def base(settings: Settings, staging: StagingArea) -> Base:
    ready = asyncio.Event()
    clock = SystemClock()
    telemetry = PrometheusTelemetry()
    triton = TritonDriver(
        settings.triton.grpc_url,
        call_timeout=settings.triton.call_timeout_seconds,
        load_timeout=settings.triton.load_timeout_seconds,
        attempts=settings.triton.retry_attempts,
    )
    return Base(
        settings=settings,
        staging=staging,
        clock=clock,
        repos=SqliteRepos.open(settings.database_path),
        telemetry=telemetry,
        store=build_store(settings, telemetry),
        triton=triton,
        tasks=TaskOwner(),
        readers={},
        ready=ready,
        rotation=Rotation(ready, clock=clock, rejoin_seconds=settings.longest_unready_seconds),
    )


@dataclass(frozen=True)
class Memory:
    figures: HostAndGpuMemory
    watch: MemoryWatch
    headroom: HeadroomPolicy
    processes: ProcessAuditor  # Triton's processes, when visible (restart-triton stops it)


def memory(b: Base) -> Memory:
    settings = b.settings.memory
    figures = HostAndGpuMemory(
        b.metrics_at(settings.gpu_metrics_url), shm_path=Path(settings.shm_path)
    )
    audit = ProcessAuditor(b.settings.repository.path, pid=settings.triton_pid)
    watch = MemoryWatch(
        processes=audit if settings.audit else None,
        figures=figures,
        book=b.repos.memory,
        clock=b.clock,
        policy=LeakPolicy(
            window=settings.leak_window_swaps, threshold=settings.leak_threshold_bytes
        ),
        telemetry=b.telemetry,
    )
    headroom = HeadroomPolicy(
        figures=figures if settings.headroom_check else None,
        factor=settings.load_factor,
        shm_per_instance=settings.shm_per_instance_bytes,
        shm_backends=settings.shm_backends,
        shm_margin=settings.shm_margin_bytes,
    )
    _warn_of_rolling(b.settings, audit)
    return Memory(figures, watch, headroom, audit)


def _warn_of_rolling(settings: Settings, audit: ProcessAuditor) -> None:
    """Settings that a rolling update would find wanting only once a member is out of
    rotation, said at start."""
    policies = {"model_defaults": settings.model_defaults, **settings.models}
    for name, policy in policies.items():
        if Strategy(policy.strategy).may_roll and policy.rollout.unready_seconds < 1:
            log.warning(
                "%s: rollout.unready_seconds is %g: a rolling update unloads before a load "
                "balancer can notice the member left rotation, and the next member may leave "
                "while this one is still out in its eyes (calls fail). Give the balancer's "
                "time to drop a member (the readiness probe's period x failure threshold)",
                name,
                policy.rollout.unready_seconds,
            )
    if settings.memory.on_not_returned == "restart-triton":
        hidden = audit.skipped()
        if hidden is not None:
            log.warning(
                "memory.on_not_returned is restart-triton, but Triton's process cannot be "
                "seen now (%s): unless it is only starting, a rolling update whose memory does "
                "not come back will stop instead. Run the daemon where it sees Triton (the "
                "same host, or shareProcessNamespace: true in the pod)",
                hidden,
            )


def ledger(b: Base, wake: Wake) -> FleetLedger | None:
    """The fleet's records and this member in them; None without a fleet."""
    settings = b.settings
    if not settings.fleet.enabled:
        return None
    return FleetLedger(
        records=build_records(settings, b.store, clock=b.clock.now),
        member=Member(settings.member_name, uuid.uuid4().hex[:12], __version__, settings.fleet_url),
        clock=b.clock,
        rollout_for=settings.rollout,
        wake=wake.set,
        peers=HttpPeers(),
    )


def operations(b: Base, m: Memory, fleet: FleetLedger | None) -> Pipelines:
    settings = b.settings
    keyring = settings.store.keyring
    return assemble(
        store=b.store,
        staging=b.staging,
        editor=ProtobufConfigEditor(),
        triton=b.triton,
        metrics=b.metrics_at(),
        serving=b.repos.serving,
        journal=b.repos.operations,
        releases=b.repos.releases,
        rollbacks=b.repos.rollbacks,
        memory=m.watch,
        headroom=m.headroom,
        clock=b.clock,
        timers=b.tasks,
        policy_for=settings.traffic,
        limits=Limits(
            concurrent_loads=settings.triton.max_concurrent_loads,
            unload_seconds=settings.triton.unload_timeout_seconds,
            require_checksums=settings.store.require_checksums,
            max_release_bytes=settings.store.max_release_bytes,
        ),
        telemetry=b.telemetry,
        fleet=fleet,
        member=settings.member_name,
        signatures=SignaturePolicy(
            verifier=Keyring(keyring, now=b.clock.now) if keyring is not None else None,
            required=settings.require_signature,
            telemetry=b.telemetry,
        ),
        stress=StressCheck(load=b.triton, figures=m.figures, policy_for=settings.stress),
        turns=None
        if fleet is None
        else FleetTurns(
            records=fleet.records, member=fleet.member, clock=b.clock, rotation=b.rotation
        ),
        rotation=b.rotation,
        rolling_for=settings.rolling,
        processes=m.processes,
        floor_for=settings.min_release,
    )


def rollback(b: Base, ops: Pipelines, fleet: FleetLedger | None) -> AutoRollback:
    settings = b.settings
    return AutoRollback(
        deploy=ops.deploy,
        client=ops.client,
        serving=b.repos.serving,
        book=b.repos.rollbacks,
        clock=b.clock,
        budgets=RollbackBudgets(
            fallback=settings.rollback.fallback_budget_seconds,
            cold_fallback=settings.rollback.cold_fallback_budget_seconds,
            cpu=settings.rollback.cpu_budget_seconds,
            cooldown=settings.rollback.cooldown_seconds,
        ),
        configured_fallback=settings.fallback_release,
        enabled=settings.auto_rollback,
        telemetry=b.telemetry,
        fleet=fleet if settings.rollback.scope == "fleet" else None,
        # In a fleet, "previous" is the fleet's, as its sync last read it.
        previous_of=fleet.previous_of if fleet is not None else None,
        rolling_for=settings.may_roll,
    )


def overload(
    b: Base, chain: AutoRollback
) -> tuple[OverloadWatcher | None, UtilizationSource | None]:
    """The GPU watcher and the source it reads; (None, None) when ``rollback.source`` is off."""
    settings = b.settings.rollback
    source = build_utilization_source(b.settings, b.metrics_at)
    if source is None:
        return None, None
    watcher = OverloadWatcher(
        source=source,
        source_name=settings.source,
        rollback=chain,
        clock=b.clock,
        tasks=b.tasks,
        config=EvaluatorConfig(
            threshold=settings.threshold_ratio,
            window=settings.window_seconds,
            interval=settings.interval_seconds,
        ),
        aggregate=Aggregate(settings.aggregate),
        scale=0.01 if settings.unit == "percent" else 1.0,
        telemetry=b.telemetry,
    )
    return watcher, source


@dataclass(frozen=True)
class Watching:
    watcher: ReleaseWatcher
    catalog: StoreCatalog  # the watcher's last look at the store, for GET /v1/models
    events: LocalStoreEvents | SqsStoreEvents | None
    notifications: Callable[[], NotificationHealth] | None  # an SQS queue's; None: no queue


def watching(
    b: Base, ops: Pipelines, desired_changed: Callable[[frozenset[str]], None] | None = None
) -> Watching:
    """The release watcher and what tells it of changes; ``desired_changed`` (the fleet sync's
    wake) hears the bucket's events of changes of the desired state."""
    settings = b.settings
    wake = Wake(b.clock)
    events = build_store_events(settings, b.store, wake.set, b.clock, desired_changed)
    catalog = StoreCatalog()
    watcher = ReleaseWatcher(
        store=b.store,
        deploy=ops.deploy,
        client=ops.client,
        releases=b.repos.releases,
        serving=b.repos.serving,
        rollbacks=b.repos.rollbacks,
        clock=b.clock,
        tasks=b.tasks,
        auto_deploy=settings.auto_deploy,
        require_signature=settings.require_signature,
        interval=settings.store.poll_interval_seconds,
        catalog=catalog,
        events=events,
        full_scan_every=settings.store.full_scan_seconds,
        wake=wake,
    )
    health = None if events is None or isinstance(events, LocalStoreEvents) else events.health
    return Watching(watcher, catalog, events, health)
