"""The status page's data: every model as one read-only overview, built from what the other
services already know.

Per model: what should serve (the fleet's desired release, or this daemon's own record when it
is not in a fleet), what each member serves (the fleet's heartbeats, this member as it is now),
the slots with Triton's state of each (:class:`StatusService`), the rollout phase, the degraded
latch (the fleet's and this member's), the last operations with their steps (changes of what
serves only), the last housekeeping apart (a retire, a repair: the model view's), and the
rollbacks of the GPU history's span; once per page, that history and its threshold
(:class:`OverloadWatcher`). Nothing here writes, and a part that cannot be read (the store,
Triton) makes the overview less complete, never an error: the page is what people open when
things are broken.

A page refreshes every couple of seconds in each browser that has it open, so what is costly
is reused while it cannot have changed: the operations while the journal has no new write, the
fleet's records for :data:`FLEET_REUSE_SECONDS`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.fleet import Pause
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.notifications import NotificationHealth
from controlplane.domain.operations import CHANGES, Operation
from controlplane.domain.rollback import RollbackRecord
from controlplane.ports import Clock, OperationLog, RollbackBook
from controlplane.services.fleet import FleetService, FleetSnapshot
from controlplane.services.overload import HISTORY_SECONDS, GpuPoint, OverloadView, OverloadWatcher
from controlplane.services.status import StatusService
from controlplane.services.views import ModelView

log = logging.getLogger(__name__)
MAX_MODELS = 50  # models on one page; the rest are counted, and listed by GET /v1/models
OPERATIONS_PER_MODEL = 3
FLEET_REUSE_SECONDS = 1.0
MIN_SPAN_SECONDS = 60.0  # the GPU plot's shortest span
# The journal's write count, the models, and their last operations (newest first).
_Recent = tuple[int, tuple[str, ...], dict[str, tuple[Operation, ...]]]


@dataclass(frozen=True)
class MemberServing:
    """What one member serves of a model."""

    member: str
    alive: bool
    release: str | None
    state: str | None  # the member's state of the model (MemberState), Triton's without a fleet
    target: str | None  # what it should serve
    error: str | None
    this_member: bool
    rolling: str = ""  # a rolling update here: its phase and how long each took


@dataclass(frozen=True)
class Latch:
    """A release latched degraded: nothing automatic serves it again."""

    release: str
    at: datetime
    reason: str
    scope: str  # "fleet" (every member) or "member" (this daemon's own record)


@dataclass(frozen=True)
class ModelOverview:
    view: ModelView  # this daemon's slots, Triton's states, what serves here
    desired: str | None
    desired_by: str  # "fleet" or "member": where the desired release was read
    members: tuple[MemberServing, ...]
    phase: str | None  # the rollout phase; None outside a fleet
    converged: bool | None
    rollout_note: str | None
    canaries: tuple[str, ...]
    latches: tuple[Latch, ...]
    operations: tuple[Operation, ...]  # newest first; housekeeping is the view's
    rollbacks: tuple[RollbackRecord, ...]  # those in the GPU history's span, oldest first
    paused: Pause | None = None  # who paused its fleet rollout, when and why


@dataclass(frozen=True)
class GpuHistory:
    source: str  # triton, prometheus, or none (the watcher is off)
    threshold: float | None  # a ratio, like the points; None when the watcher is off
    since: datetime
    until: datetime
    points: tuple[GpuPoint, ...]
    note: str  # why there is no sample, when there is none

    @property
    def sampled(self) -> bool:
        return any(point.value is not None for point in self.points)


@dataclass(frozen=True)
class Overview:
    at: datetime
    member: str | None  # this daemon's name in its fleet; None outside a fleet
    fleet_problem: str | None  # why the fleet's records may be old (store unreadable, stale)
    models: tuple[ModelOverview, ...]
    more: bool  # more models than the page holds (:data:`MAX_MODELS`)
    gpu: GpuHistory
    overload: OverloadView | None
    ignored_models: tuple[IgnoredName, ...] = ()  # store entries left out for their names
    notifications_problem: str | None = None  # the store's SQS queue cannot be reached


class OverviewService:
    def __init__(
        self,
        *,
        status: StatusService,
        journal: OperationLog,
        rollbacks: RollbackBook,
        clock: Clock,
        overload: OverloadWatcher | None = None,
        fleet: FleetService | None = None,
        source: str = "none",
        notifications: Callable[[], NotificationHealth] | None = None,
    ) -> None:
        self._notifications = notifications
        self._status = status
        self._journal = journal
        self._rollbacks = rollbacks
        self._clock = clock
        self._overload = overload
        self._fleet = fleet
        self._source = source
        self._operations: _Recent | None = None
        self._snapshot: tuple[float, FleetSnapshot] | None = None

    async def overview(self) -> Overview:
        now = self._clock.now()
        since = now - timedelta(seconds=HISTORY_SECONDS)
        page = await self._status.list_models(limit=MAX_MODELS, managed_first=True)
        names = tuple(view.name for view in page.models)
        snapshot, problem = await self._fleet_snapshot()
        operations, rollbacks = await asyncio.gather(
            self._recent_operations(names), self._rollbacks.since(since)
        )
        models = tuple(
            self._model(
                view,
                snapshot,
                operations.get(view.name, ()),
                tuple(r for r in rollbacks if r.model == view.name),
            )
            for view in page.models
        )
        return Overview(
            at=now,
            member=self._fleet.member if self._fleet is not None else None,
            fleet_problem=problem,
            models=models,
            more=page.next_after is not None,
            gpu=self._gpu(since, now),
            overload=page.overload,
            ignored_models=page.ignored_models,
            notifications_problem=(
                self._notifications().problem_line() if self._notifications is not None else None
            ),
        )

    def _gpu(self, since: datetime, now: datetime) -> GpuHistory:
        watcher = self._overload
        if watcher is None:
            return GpuHistory(
                "none", None, since, now, (), "the overload watcher is off (rollback.source none)"
            )
        points = watcher.history()
        if points:  # a daemon up for less than the history: its span, a minute at least
            since = max(since, min(points[0].at, now - timedelta(seconds=MIN_SPAN_SECONDS)))
        view = watcher.view
        if not points:
            note = "no sample yet"
        elif view is not None and view.note:
            note = view.note
        else:
            note = "the source could not be read"
        return GpuHistory(self._source, watcher.threshold, since, now, points, note)

    async def _fleet_snapshot(self) -> tuple[FleetSnapshot | None, str | None]:
        fleet = self._fleet
        if fleet is None:
            return None, None
        reused = self._snapshot
        if reused is not None and self._clock.monotonic() - reused[0] < FLEET_REUSE_SECONDS:
            snapshot = reused[1]
        else:
            try:
                snapshot = await fleet.snapshot()
            except ControlPlaneError as exc:
                log.warning("the fleet's records could not be read for the status page: %s", exc)
                return None, f"the fleet's records could not be read: {exc}"
            self._snapshot = (self._clock.monotonic(), snapshot)
        if snapshot.unreadable is not None:
            why = snapshot.unreadable
            return snapshot, f"the store could not be read ({why}): this is what was read last"
        if fleet.stale:
            return snapshot, "this member could not read the fleet's desired state at its last try"
        return snapshot, None

    async def _recent_operations(self, names: Sequence[str]) -> dict[str, tuple[Operation, ...]]:
        """The last operations of each model that change what serves (the housekeeping after
        them would push them off the page), read again only after the journal saved one."""
        writes = self._journal.writes  # before the reads: one saved during them counts as after
        cached = self._operations
        if cached is not None and cached[0] == writes and cached[1] == tuple(names):
            return cached[2]
        found = await asyncio.gather(
            *(self._journal.recent(name, OPERATIONS_PER_MODEL, CHANGES) for name in names)
        )
        operations = {name: tuple(ops) for name, ops in zip(names, found, strict=True)}
        self._operations = (writes, tuple(names), operations)
        return operations

    def _model(
        self,
        view: ModelView,
        snapshot: FleetSnapshot | None,
        operations: tuple[Operation, ...],
        rollbacks: tuple[RollbackRecord, ...],
    ) -> ModelOverview:
        latches = [Latch(d.release, d.at, d.reason, "member") for d in view.degraded]
        if snapshot is None:
            return ModelOverview(
                view=view,
                desired=view.active_release,
                desired_by="member",
                members=(
                    MemberServing(
                        member="this daemon",
                        alive=True,
                        release=view.active_release,
                        state=view.triton_state,
                        target=view.active_release,
                        error=None,
                        this_member=True,
                    ),
                ),
                phase=None,
                converged=None,
                rollout_note=None,
                canaries=(),
                latches=tuple(latches),
                operations=operations,
                rollbacks=rollbacks,
            )
        wanted = snapshot.desired.get(view.name)
        members = []
        for name, beat in sorted(snapshot.beats.items()):
            state = beat.models.get(view.name)
            members.append(
                MemberServing(
                    member=name,
                    alive=snapshot.alive(beat),
                    release=state.release if state is not None else None,
                    state=state.state.value if state is not None else None,
                    target=state.target if state is not None else None,
                    error=state.error if state is not None else None,
                    this_member=name == snapshot.member,
                    rolling=state.progress.summary if state is not None else "",
                )
            )
        if wanted is not None:
            fleet_latched = {d.release for d in wanted.degraded}
            latches = [
                *(Latch(d.release, d.at, d.reason, "fleet") for d in wanted.degraded),
                *(latch for latch in latches if latch.release not in fleet_latched),
            ]
        return ModelOverview(
            view=view,
            desired=wanted.release if wanted is not None else None,
            desired_by="fleet",
            members=tuple(members),
            phase=wanted.rollout.phase.value if wanted is not None else None,
            converged=snapshot.converged(view.name) if wanted is not None else None,
            rollout_note=(wanted.rollout.note or None) if wanted is not None else None,
            canaries=tuple(wanted.rollout.canaries) if wanted is not None else (),
            latches=tuple(latches),
            operations=operations,
            rollbacks=rollbacks,
            paused=wanted.rollout.paused if wanted is not None and wanted.rollout.holds else None,
        )
