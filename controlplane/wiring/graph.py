"""The object graph: every adapter built once from the settings and handed to the services.

:func:`build` must run inside the event loop that will serve requests. It builds the
subsystems of :mod:`.parts` in the order they depend on each other, then the fleet sync, the
views the API reads, and the supervisor's jobs.
"""

from __future__ import annotations

import asyncio
from functools import partial

from controlplane.adapters.triton.metrics import TritonMetrics
from controlplane.ports import UtilizationSource
from controlplane.services.alerts import AlertReceiver
from controlplane.services.assembly import Pipelines
from controlplane.services.figures import FigureReader, FleetSources
from controlplane.services.fleet import FleetService
from controlplane.services.fleet_ledger import FleetLedger
from controlplane.services.fleet_sync import FleetSync
from controlplane.services.overload import OverloadWatcher
from controlplane.services.overview import OverviewService
from controlplane.services.reconcile import Reconciler
from controlplane.services.rollback import AutoRollback
from controlplane.services.status import StatusService
from controlplane.services.supervisor import Supervisor
from controlplane.settings import Settings
from controlplane.timing import Wake
from controlplane.wiring import parts
from controlplane.wiring.container import Container
from controlplane.wiring.startup import check_filesystem


def build(settings: Settings) -> Container:
    """Build the object graph. Must run inside the event loop that will serve requests."""
    base = parts.base(settings, check_filesystem(settings))
    memory = parts.memory(base)
    fleet_wake = Wake(base.clock)
    ledger = parts.ledger(base, fleet_wake)
    ops = parts.operations(base, memory, ledger)
    chain = parts.rollback(base, ops, ledger)
    overload, utilization = parts.overload(base, chain)
    sync = _fleet_sync(base, ops, ledger, overload, fleet_wake)
    # The bucket's events of a change of the desired state wake the sync as a peer's wake does.
    watching = parts.watching(base, ops, sync.poke if sync is not None else None)
    if sync is not None and watching.events is not None:
        sync.hear_from(watching.events)  # a queue of its own vouches: no read while quiet
    fleet_view = (
        FleetService(records=ledger.records, sync=sync, clock=base.clock)
        if (ledger is not None and sync is not None)
        else None
    )
    ready = base.ready
    supervisor = _jobs(base, ops.reconciler, watching, overload, sync, ready)
    status = _status(base, ops, chain, ledger, overload, watching)
    closers: list[TritonMetrics | UtilizationSource] = list(base.readers.values())
    if utilization is not None and utilization not in closers:
        closers.append(utilization)  # a Prometheus query has its own client
    return Container(
        settings=settings,
        deploy=ops.deploy,
        client=ops.client,
        status=status,
        reconciler=ops.reconciler,
        runner=ops.runner,
        tasks=base.tasks,
        triton=base.triton,
        repos=base.repos,
        ready=ready,
        watcher=watching.watcher,
        store=base.store,
        rollback=chain,
        alerts=AlertReceiver(
            book=base.repos.alerts,
            rollback=chain,
            clock=base.clock,
            tasks=base.tasks,
            model_label=settings.rollback.alert_label,
            telemetry=base.telemetry,
        ),
        telemetry=base.telemetry,
        overload=overload,
        memory=memory.watch,
        supervisor=supervisor,
        readers=closers,
        overview=_overview(base, status, overload, fleet_view, watching),
        figures=_figures(base, ops, supervisor, watching, sync, fleet_view),
        rotation=ops.rotation,
        fleet=sync,
        fleet_view=fleet_view,
        notifications=watching.notifications,
    )


def _status(
    base: parts.Base,
    ops: Pipelines,
    chain: AutoRollback,
    ledger: FleetLedger | None,
    overload: OverloadWatcher | None,
    watching: parts.Watching,
) -> StatusService:
    return StatusService(
        serving=base.repos.serving,
        journal=base.repos.operations,
        rollbacks=base.repos.rollbacks,
        store=base.store,
        triton=base.triton,
        clock=base.clock,
        holder=ops.client.holder,
        traffic=base.settings.traffic,
        overload=overload.latest if overload is not None else None,
        fallback=chain.fallback_of,
        previous_of=ledger.previous_of if ledger is not None else None,
        cooldown_until=chain.cooldown_after,
        drift=ops.reconciler.drift_of,
        out_of_rotation=base.rotation.out_of,
        catalog=watching.catalog,
    )


def _overview(
    base: parts.Base,
    status: StatusService,
    overload: OverloadWatcher | None,
    fleet_view: FleetService | None,
    watching: parts.Watching,
) -> OverviewService:
    settings = base.settings
    return OverviewService(
        status=status,
        journal=base.repos.operations,
        rollbacks=base.repos.rollbacks,
        clock=base.clock,
        overload=overload,
        fleet=fleet_view,
        source=settings.rollback.source,
        notifications=watching.notifications,
    )


def _figures(
    base: parts.Base,
    ops: Pipelines,
    supervisor: Supervisor,
    watching: parts.Watching,
    sync: FleetSync | None,
    fleet_view: FleetService | None,
) -> FigureReader:
    settings = base.settings
    return FigureReader(
        serving=base.repos.serving,
        rollbacks=base.repos.rollbacks,
        triton=base.triton,
        clock=base.clock,
        last_pass=ops.reconciler.last_pass,
        jobs=supervisor.health,
        rotation=base.rotation,
        notifications=watching.notifications,
        fleet=(
            FleetSources(sync, fleet_view, every=settings.fleet.keepalive_seconds)
            if sync is not None and fleet_view is not None
            else None
        ),
    )


def _fleet_sync(
    base: parts.Base,
    ops: Pipelines,
    ledger: FleetLedger | None,
    overload: OverloadWatcher | None,
    wake: Wake,
) -> FleetSync | None:
    if ledger is None:
        return None
    settings = base.settings
    return FleetSync(
        ledger=ledger,
        deploy=ops.deploy,
        client=ops.client,
        serving=base.repos.serving,
        rollbacks=base.repos.rollbacks,
        clock=base.clock,
        poll_interval=settings.store.poll_interval_seconds,
        beat_interval=settings.fleet.keepalive_seconds,
        overload=overload.verdict if overload is not None else None,
        wake=wake,
        rotation=ops.rotation,
        check_every=settings.store.full_scan_seconds,
    )


def _jobs(
    base: parts.Base,
    reconciler: Reconciler,
    watching: parts.Watching,
    overload: OverloadWatcher | None,
    sync: FleetSync | None,
    ready: asyncio.Event,
) -> Supervisor:
    """The background jobs, in the order they become ready: start-up reconcile, then (in a
    fleet) the first sync pass, then the release watcher."""
    settings = base.settings
    reconciled = asyncio.Event() if sync is not None else ready
    supervisor = Supervisor(base.clock, base.telemetry)
    supervisor.add(
        "reconcile", partial(reconciler.run, settings.reconcile.interval_seconds, reconciled)
    )
    if sync is not None:
        supervisor.add("fleet-sync", partial(sync.run, reconciled, ready))
    supervisor.add("release-watcher", partial(watching.watcher.run, after=ready))
    if overload is not None:
        supervisor.add("overload-watcher", overload.run)
    if watching.events is not None:
        supervisor.add("store-events", watching.events.run)
    return supervisor
