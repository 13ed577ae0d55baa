"""What status tells of models: one model's view, a page of them, and when they were seen.

Values only, built by :class:`~controlplane.services.status.StatusService`; the API renders
them (``api/schemas/model.py``), the status page and ``controlplane status`` show them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from controlplane.domain.ignored import IgnoredName
from controlplane.domain.operations import Operation
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.rollback import DegradedRelease, RollbackRecord
from controlplane.domain.rotation import OutOfRotation
from controlplane.domain.slots import Slot
from controlplane.services.overload import OverloadView


@dataclass(frozen=True)
class ModelView:
    name: str
    active_release: str | None
    previous_release: str | None
    slots: tuple[Slot, ...]
    triton_state: str  # READY, UNAVAILABLE, ... or "unknown" when Triton is unreachable
    triton_reason: str
    releases: tuple[ReleaseInfo, ...]
    store_error: str | None
    running_operation: str | None
    # The newest change of what serves (deploy, rollback, unload, cpu-fallback: CHANGES in
    # domain/operations.py), whatever the daemon's housekeeping did after it.
    last_operation: Operation | None
    strategy: str = "inplace"
    alias_target: str | None = None  # blue-green: the slot the alias points at
    slot_triton_states: dict[str, str] = field(default_factory=dict)  # Triton's view of each
    overload: OverloadView | None = None  # the watcher's latest verdict (one per Triton)
    fallback: str | None = None
    last_rollback: RollbackRecord | None = None
    degraded: tuple[DegradedRelease, ...] = ()
    cooldown_until: datetime | None = None
    last_repair: Operation | None = None  # the reconcile loop's last repair of this model
    drift: str | None = None  # what the last reconcile pass found wrong, if anything
    # Why the model keeps this member out of rotation now ("draining m", "memory_not_returned:
    # ..."), as /readyz says it; None: it does not.
    out_of_rotation: OutOfRotation | None = None
    cpu_only: bool = False  # it serves as the rollback chain's CPU-only reload left it
    # Release dirs (or prefixes) the store's listing left out for their names (the first ones).
    ignored_releases: tuple[IgnoredName, ...] = ()
    # The publisher key that signed the serving release, as the deploy that made it serve
    # recorded it (None: unsigned, or deployed before this daemon checked signatures).
    signer: str | None = None
    last_housekeeping: Operation | None = None  # the newest retire or repair (HOUSEKEEPING)


@dataclass(frozen=True)
class AsOf:
    """When what a list of models shows was seen."""

    store: datetime | None  # the watcher's last look at the store; None: listed for this page
    store_full_scan: datetime | None  # its last look at every model (what no event can miss)
    triton: datetime | None  # Triton's index; None: Triton was unreachable


@dataclass(frozen=True)
class ModelPage:
    models: list[ModelView]  # their ``overload`` is None: it is the page's
    next_after: str | None  # the name to pass as ``after`` for the next page; None: no more
    overload: OverloadView | None = None  # the overload watcher's verdict, for every model
    as_of: AsOf | None = None
    store_error: str | None = None  # why the store's models could not be listed (at all)
    # Entries at the store's top its listing left out for their names (the first ones).
    ignored_models: tuple[IgnoredName, ...] = ()


@dataclass(frozen=True)
class History:
    """What the database holds about one model besides its record, read in bulk."""

    last_operation: Operation | None  # the newest of CHANGES
    last_repair: Operation | None  # the reconcile loop's last repair
    last_rollback: RollbackRecord | None
    degraded: tuple[DegradedRelease, ...]
    signer: str | None = None  # the key that signed the serving release, as its deploy found
    last_housekeeping: Operation | None = None  # the newest of HOUSEKEEPING
