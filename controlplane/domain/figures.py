"""What ``/metrics`` shows of the present, as one value built per scrape.

The event counters move as things happen; these figures are read when Prometheus asks, from
what the daemon already holds (the database, the last reconcile pass, the fleet sync's last
pass and the fleet as last read), so a restart or a missed event never leaves them wrong. The
services gather them (:mod:`controlplane.services.figures`), the telemetry adapter turns them
into series: neither knows the other.

Per model, "desired" means what this member should serve: the fleet's target for it
(:meth:`~controlplane.domain.fleet.DesiredModel.target_for`) in a fleet, the release its own
database names otherwise; and serving it means Triton does (as the last reconcile pass saw).
Whether a model keeps this member out of rotation is the rotation's state now, by kind
(:class:`~controlplane.domain.rotation.OutReason`).

Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from controlplane.domain.fleet import MemberBeat
from controlplane.domain.notifications import NotificationHealth
from controlplane.domain.refusals import RecordKind, Refusal, RefusalReason
from controlplane.domain.rotation import OutReason
from controlplane.domain.slots import Slot


class MemberStanding(StrEnum):
    """How a member stands, from its heartbeat: one of these at a time."""

    ALIVE = "alive"  # it beats and reads the fleet's desired state
    STALE = "stale"  # it beats but cannot read the desired state (it serves what it has)
    DOWN = "down"  # no heartbeat for 3 of its beats (forgotten after an hour)


def standing(beat: MemberBeat, now: datetime) -> MemberStanding:
    if not beat.alive(now):
        return MemberStanding.DOWN
    return MemberStanding.STALE if beat.stale else MemberStanding.ALIVE


def member_counts(beats: Mapping[str, MemberBeat], now: datetime) -> dict[MemberStanding, int]:
    """How many members stand each way (every standing listed, 0 included)."""
    counts = dict.fromkeys(MemberStanding, 0)
    for beat in beats.values():
        counts[standing(beat, now)] += 1
    return counts


@dataclass(frozen=True)
class ModelFigures:
    name: str
    active_release: str | None  # what its database says serves here
    slots: tuple[Slot, ...] = ()
    serving_desired: bool = True  # it serves what this member should serve of it
    cpu_only: bool = False  # it serves as the rollback chain's CPU-only reload left it
    degraded: tuple[str, ...] = ()  # its releases latched degraded here
    out_of_rotation: OutReason | None = None  # why it keeps this member out; None: it does not


@dataclass(frozen=True)
class FleetView:
    """The fleet as this member last read it from the store (every member's heartbeat)."""

    at: datetime
    members: Mapping[MemberStanding, int]
    converged: Mapping[str, bool]  # per model: every live member serves its target
    refused: Mapping[str, Refusal] = field(default_factory=dict)  # records refused, by where


@dataclass(frozen=True)
class FleetFigures:
    stale: bool  # this member cannot read the fleet's desired state
    last_read: datetime | None  # when it last could
    name_conflict: bool = False  # another daemon beats under this member's name
    generations: Mapping[str, int] = field(default_factory=dict)  # per model, as last read
    view: FleetView | None = None  # None: the fleet could not be read (or not yet)
    # records refused now (the sync's last pass and the view's), by kind and reason
    refused: Mapping[tuple[RecordKind, RefusalReason], int] = field(default_factory=dict)
    paused: frozenset[str] = frozenset()  # models whose rollout a person paused, as last read


@dataclass(frozen=True)
class Figures:
    models: tuple[ModelFigures, ...]
    triton_up: bool
    jobs: Mapping[str, bool]  # job -> running (False: backing off after a failure)
    not_serving: int  # managed models whose desired release Triton did not serve, last pass
    fleet: FleetFigures | None = None  # None: fleet.enabled is false
    notifications: NotificationHealth | None = None  # None: no store notifications set up
