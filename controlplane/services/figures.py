"""The figures one ``/metrics`` scrape shows, gathered from what the daemon already knows.

What serves (the database), whether it is what should serve (the last reconcile pass, and in a
fleet the sync's last pass), the CPU-only mode and degraded latches (the slot records and the
rollback book), the models that keep this member out of rotation (the rotation), the
background jobs (the supervisor), and the fleet. A scrape must not hang on
a Triton or a store that does not answer: each read that leaves the process is bounded, and a
read that runs out shows as "not known" (Triton down; no fleet view), never as a guess.

The fleet view (every member's heartbeat, whether each model converged) costs a read of every
heartbeat in the store, so it is read at most once per ``fleet_every`` seconds (the heartbeat
interval: nothing changes faster), however often Prometheus scrapes. A view that cannot be read
is dropped rather than kept: a member that cannot read the store says so (``stale``), and
shows no member counts or convergence rather than old ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.figures import (
    Figures,
    FleetFigures,
    FleetView,
    ModelFigures,
    member_counts,
)
from controlplane.domain.fleet import MemberState
from controlplane.domain.notifications import NotificationHealth
from controlplane.domain.slots import SlotState
from controlplane.ports import Clock, ModelRecord, RollbackBook, ServingRepo, Triton
from controlplane.services.fleet import FleetService
from controlplane.services.fleet_refusals import count
from controlplane.services.fleet_sync import FleetSync, SyncReport
from controlplane.services.reconcile import PassReport
from controlplane.services.rotation import Rotation

log = logging.getLogger(__name__)
READ_TIMEOUT = 2.0  # s: the longest a scrape waits for Triton's liveness or the fleet view
_SERVES_TARGET = (MemberState.SERVING, MemberState.UNLOADED)


@dataclass(frozen=True)
class FleetSources:
    sync: FleetSync
    view: FleetService
    every: float  # s between reads of the fleet view


class FigureReader:
    def __init__(
        self,
        *,
        serving: ServingRepo,
        rollbacks: RollbackBook,
        triton: Triton,
        clock: Clock,
        last_pass: Callable[[], PassReport | None],
        jobs: Callable[[], Mapping[str, bool]],
        rotation: Rotation,
        fleet: FleetSources | None = None,
        notifications: Callable[[], NotificationHealth] | None = None,
        timeout: float = READ_TIMEOUT,
    ) -> None:
        self._notifications = notifications
        self._serving = serving
        self._rollbacks = rollbacks
        self._triton = triton
        self._clock = clock
        self._last_pass = last_pass
        self._jobs = jobs
        self._rotation = rotation
        self._fleet = fleet
        self._timeout = timeout
        self._view: FleetView | None = None
        self._view_read_at = -float("inf")  # monotonic time of the last read (or attempt)
        self._view_lock = asyncio.Lock()

    async def gather(self) -> Figures:
        try:
            live = await asyncio.wait_for(self._triton.is_live(), self._timeout)
        except TimeoutError:
            live = False
        records = {record.name: record for record in await self._serving.all()}
        last_pass = self._last_pass()
        sync = self._fleet.sync.last if self._fleet is not None else None
        out = self._rotation.kinds()
        names = sorted(set(records) | set(sync.desired if sync is not None else ()) | set(out))
        degraded = await self._rollbacks.latched_of(names) if names else {}
        models = []
        for name in names:
            record = records.get(name)
            models.append(
                ModelFigures(
                    name=name,
                    active_release=record.active_release if record else None,
                    slots=tuple(record.slots) if record else (),
                    serving_desired=_serving_desired(name, last_pass, sync),
                    cpu_only=record is not None and _cpu_only(record),
                    degraded=tuple(sorted(d.release for d in degraded.get(name, ()))),
                    out_of_rotation=out.get(name),
                )
            )
        return Figures(
            models=tuple(models),
            triton_up=live,
            jobs=dict(self._jobs()),
            not_serving=len(last_pass.not_serving) if last_pass is not None else 0,
            fleet=await self._fleet_figures(sync),
            notifications=self._notifications() if self._notifications is not None else None,
        )

    async def _fleet_figures(self, sync: SyncReport | None) -> FleetFigures | None:
        if self._fleet is None:
            return None
        member = self._fleet.sync
        view = await self._fleet_view(self._fleet)
        refused = {**member.refusals.book.now, **(view.refused if view is not None else {})}
        return FleetFigures(
            stale=member.stale,
            last_read=member.last_read,
            name_conflict=member.name_conflict is not None,
            generations={
                model: wanted.generation
                for model, wanted in (sync.desired.items() if sync is not None else ())
            },
            paused=frozenset(
                model
                for model, wanted in (sync.desired.items() if sync is not None else ())
                if wanted.rollout.holds
            ),
            view=view,
            refused=count(refused),
        )

    async def _fleet_view(self, fleet: FleetSources) -> FleetView | None:
        async with self._view_lock:  # one read for scrapes that come together
            if self._clock.monotonic() - self._view_read_at < fleet.every:
                return self._view
            self._view_read_at = self._clock.monotonic()
            try:
                snapshot = await asyncio.wait_for(fleet.view.snapshot(), self._timeout)
            except (ControlPlaneError, TimeoutError) as exc:
                log.debug("no fleet view for /metrics: %s", exc or "the store did not answer")
                self._view = None
                return None
            if snapshot.unreadable is not None:  # what it read last, and itself: not a view
                self._view = None
                return None
            self._view = FleetView(
                at=snapshot.at,
                members=member_counts(snapshot.beats, snapshot.at),
                converged={model: snapshot.converged(model) for model in snapshot.desired},
                refused=snapshot.broken,
            )
            return self._view


def _serving_desired(model: str, last_pass: PassReport | None, sync: SyncReport | None) -> bool:
    """This member serves what it should of ``model``: the fleet's target is what its database
    says serves (in a fleet), and Triton serves that (the last reconcile pass)."""
    if sync is not None:
        state = sync.states.get(model)
        if state is not None and state.state not in _SERVES_TARGET:
            return False
    assessed = last_pass.assessments.get(model) if last_pass is not None else None
    return assessed is None or assessed.serving


def _cpu_only(record: ModelRecord) -> bool:
    return any(slot.state is SlotState.ACTIVE and slot.cpu_only for slot in record.slots)
