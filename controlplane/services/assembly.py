"""How the operation services fit together: the runner, the slot book, the strategies, the
deploy service and the reconcile loop, built from ports.

The daemon's wiring and the service tests both call :func:`assemble`, so what a test runs is
wired exactly as what the daemon runs; only the adapters handed in differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controlplane.domain.traffic import TrafficPolicy
from controlplane.domain.turns import RollingPolicy
from controlplane.ports import (
    Clock,
    MetricsSource,
    ModelConfigEditor,
    ModelStore,
    OperationLog,
    ReleaseBook,
    RollbackBook,
    ServingRepo,
    Staging,
    Telemetry,
    Triton,
    TritonProcesses,
)
from controlplane.services.bluegreen import BlueGreen, Bounds
from controlplane.services.deploy import DeployService
from controlplane.services.fleet_ledger import FleetLedger
from controlplane.services.fleet_turns import FleetTurns
from controlplane.services.inplace import Inplace
from controlplane.services.memory import HeadroomPolicy, MemoryWatch
from controlplane.services.operations import OperationClient
from controlplane.services.prepare import Preparer
from controlplane.services.reconcile import Reconciler
from controlplane.services.retire import RetireTimers
from controlplane.services.rolling import Rolling
from controlplane.services.rotation import Rotation
from controlplane.services.runner import ModelLocks, OperationRunner
from controlplane.services.signature_step import SignaturePolicy
from controlplane.services.slots import LoadSlots, SlotBook, SlotFreer
from controlplane.services.strategy import ModelStrategy
from controlplane.services.stress import StressCheck
from controlplane.services.tasks import TaskOwner
from controlplane.services.telemetry import NO_TELEMETRY


@dataclass(frozen=True)
class Pipelines:
    runner: OperationRunner
    client: OperationClient
    slots: SlotBook
    load_slots: LoadSlots
    bluegreen: BlueGreen
    inplace: Inplace
    deploy: DeployService
    reconciler: Reconciler
    rotation: Rotation


@dataclass(frozen=True)
class Limits:
    """The bounds the pipelines work within (from ``triton.*`` and ``store.*`` settings)."""

    concurrent_loads: int = 4
    unload_seconds: float = 120.0
    abandon_seconds: float = 3.0
    require_checksums: bool = True
    max_release_bytes: int | None = None


def assemble(
    *,
    store: ModelStore,
    staging: Staging,
    editor: ModelConfigEditor,
    triton: Triton,
    metrics: MetricsSource,
    serving: ServingRepo,
    journal: OperationLog,
    releases: ReleaseBook,
    rollbacks: RollbackBook,
    memory: MemoryWatch,
    headroom: HeadroomPolicy,
    clock: Clock,
    timers: TaskOwner,
    policy_for: Callable[[str], TrafficPolicy],
    limits: Limits,
    telemetry: Telemetry = NO_TELEMETRY,
    fleet: FleetLedger | None = None,
    member: str | None = None,
    signatures: SignaturePolicy | None = None,
    stress: StressCheck | None = None,
    rotation: Rotation | None = None,
    turns: FleetTurns | None = None,
    rolling_for: Callable[[str], RollingPolicy] = lambda _model: RollingPolicy(),
    processes: TritonProcesses | None = None,
    floor_for: Callable[[str], str | None] = lambda _model: None,
) -> Pipelines:
    runner = OperationRunner(
        journal=journal,
        staging=staging,
        clock=clock,
        locks=ModelLocks(),
        telemetry=telemetry,
        member=member,
    )
    client = OperationClient(runner=runner, clock=clock)
    slots = SlotBook(serving, clock)
    shared = _Shared(
        preparer=Preparer(
            store=store,
            staging=staging,
            editor=editor,
            require_checksums=limits.require_checksums,
            max_release_bytes=limits.max_release_bytes,
            signatures=signatures,
        ),
        staging=staging,
        triton=triton,
        slots=slots,
        load_slots=LoadSlots(limits.concurrent_loads),
        memory=memory,
        headroom=headroom,
        limits=limits,
        clock=clock,
        policy_for=policy_for,
    )
    rotation = rotation or Rotation()
    parts = _blue_green(shared, client, metrics=metrics, timers=timers, stress=stress)
    bluegreen = BlueGreen(**parts)
    rolling = [
        Rolling(
            always=always,
            rotation=rotation,
            turns=turns,
            metrics=metrics,
            rolling_for=rolling_for,
            processes=processes,
            **parts,
        )
        for always in (True, False)
    ]
    inplace = _inplace(shared)
    every: list[ModelStrategy] = [bluegreen, *rolling, inplace]
    strategies = {s.kind: s for s in every}
    deploy = DeployService(
        store=store,
        staging=staging,
        triton=triton,
        runner=runner,
        slots=slots,
        journal=journal,
        releases=releases,
        rollbacks=rollbacks,
        strategies=strategies,
        preparer=shared.preparer,
        memory=memory,
        clock=clock,
        policy_for=policy_for,
        unload_seconds=limits.unload_seconds,
        fleet=fleet,
        floor_for=floor_for,
    )
    reconciler = Reconciler(
        deploy=deploy,
        runner=runner,
        client=client,
        staging=staging,
        triton=triton,
        slots=slots,
        serving=serving,
        journal=journal,
        clock=clock,
        telemetry=telemetry,
        held=rotation.held,
    )
    return Pipelines(
        runner, client, slots, shared.load_slots, bluegreen, inplace, deploy, reconciler, rotation
    )


@dataclass(frozen=True)
class _Shared:
    """What both strategies are built from."""

    preparer: Preparer
    staging: Staging
    triton: Triton
    slots: SlotBook
    load_slots: LoadSlots
    memory: MemoryWatch
    headroom: HeadroomPolicy
    limits: Limits
    clock: Clock
    policy_for: Callable[[str], TrafficPolicy]


def _blue_green(
    shared: _Shared,
    client: OperationClient,
    *,
    metrics: MetricsSource,
    timers: TaskOwner,
    stress: StressCheck | None,
) -> dict[str, Any]:
    """What a strategy on blue-green's slots is built from: one freer and one set of retire
    timers for blue-green, rolling and auto alike (they share the slots)."""
    limits = shared.limits
    freer = SlotFreer(
        book=shared.slots,
        triton=shared.triton,
        staging=shared.staging,
        memory=shared.memory,
        unload_seconds=limits.unload_seconds,
    )
    retire = RetireTimers(
        client=client,
        slots=shared.slots,
        freer=freer,
        metrics=metrics,
        clock=shared.clock,
        tasks=timers,
        policy_for=shared.policy_for,
    )
    return {
        "preparer": shared.preparer,
        "staging": shared.staging,
        "triton": shared.triton,
        "slots": shared.slots,
        "freer": freer,
        "load_slots": shared.load_slots,
        "memory": shared.memory,
        "headroom": shared.headroom,
        "retire": retire,
        "clock": shared.clock,
        "policy_for": shared.policy_for,
        "bounds": Bounds(unload=limits.unload_seconds, abandon=limits.abandon_seconds),
        "stress": stress,
    }


def _inplace(shared: _Shared) -> Inplace:
    return Inplace(
        preparer=shared.preparer,
        staging=shared.staging,
        triton=shared.triton,
        slots=shared.slots,
        load_slots=shared.load_slots,
        memory=shared.memory,
        headroom=shared.headroom,
        unload_timeout=shared.limits.unload_seconds,
    )
