"""The journal's seams: one repository per aggregate (what serves, operations, releases seen,
rollbacks and latches, alerts, memory samples).

Each is its own Protocol, so a service names only the records it uses. Writes land in order;
the ``writes`` counts tell a reader whether what it read is still current.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from controlplane.domain.alerts import Alert, AlertRecord, Receipt
from controlplane.domain.memory import MemorySample
from controlplane.domain.operations import Operation, OperationKind
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.rollback import DegradedRelease, RollbackRecord
from controlplane.domain.slots import Slot


@dataclass(frozen=True)
class ModelRecord:
    """What should serve (desired state) for one model, and its slots as last recorded."""

    name: str
    active_release: str | None
    previous_release: str | None
    updated_at: datetime
    slots: Sequence[Slot] = field(default_factory=tuple)


@dataclass(frozen=True)
class Serving:
    """What serves and what served before: the desired state of one model."""

    active: str | None
    previous: str | None


class ServingRepo(Protocol):
    @property
    def writes(self) -> int:
        """Writes this process submitted so far. A read submitted after the count was taken
        sees them all (one database thread takes jobs in order), and the daemon is its
        database's only writer (the instance lock): a read is current while the count holds."""
        ...

    async def get(self, model: str) -> ModelRecord | None: ...

    async def all(self) -> list[ModelRecord]: ...

    async def commit(
        self,
        model: str,
        at: datetime,
        *,
        serving: Serving | None = None,
        slots: Sequence[Slot] = (),
    ) -> None:
        """Write a change of ``model`` (what serves, any of its slots) in one transaction."""
        ...

    async def forget_slots(self, model: str, names: Sequence[str]) -> None: ...


class OperationLog(Protocol):
    @property
    def writes(self) -> int:
        """Operations saved by this process so far (see :attr:`ServingRepo.writes`). Also: an
        answer made from what Triton said before the count moved may be out of date, since
        every change the daemon makes to Triton is an operation, saved as it goes."""
        ...

    def save(self, operation: Operation) -> None:
        """Queue the operation's record; returns at once, records land in order. Any thread."""
        ...

    async def get(self, operation_id: str) -> Operation | None: ...

    async def recent(
        self,
        model: str | None = None,
        limit: int = 20,
        kinds: Collection[OperationKind] | None = None,
    ) -> list[Operation]:
        """The newest operations, newest first (of ``model``, of ``kinds``, when given)."""
        ...

    async def unfinished(self) -> list[Operation]: ...

    async def latest(
        self, models: Sequence[str], kinds: Collection[OperationKind] | None = None
    ) -> dict[str, Operation]:
        """The newest operation (of one of ``kinds``, when given) of each of ``models`` that
        has one, in one read: for answers about many models at once. With ``kinds``, its cost
        does not grow with each model's history (one index look per model and kind)."""
        ...

    async def last_deploys(self, releases: Mapping[str, str]) -> dict[str, Operation]:
        """For each model of ``releases`` (model -> release), the newest deploy of that release
        that succeeded, if any, in one read: what status says of how a release came to serve."""
        ...

    async def flush(self) -> None:
        """Return once every record queued so far is written."""
        ...


class ReleaseBook(Protocol):
    async def record(self, releases: Sequence[ReleaseInfo], at: datetime) -> None: ...

    async def seen(self, model: str) -> list[ReleaseInfo]:
        """The releases of ``model`` as last recorded (what the watcher saw before)."""
        ...


class RollbackBook(Protocol):
    @property
    def writes(self) -> int:
        """Writes this process submitted so far (see :attr:`ServingRepo.writes`)."""
        ...

    async def save(self, record: RollbackRecord) -> None: ...

    async def last(self, model: str) -> RollbackRecord | None: ...

    async def count_suppressed(self, rollback_id: str) -> None:
        """One more trigger was held back by the cooldown after this rollback."""
        ...

    async def latch(self, latch: DegradedRelease) -> None: ...

    async def unlatch(self, model: str, release: str) -> bool: ...

    async def latched(self, model: str) -> list[DegradedRelease]: ...

    async def last_of(self, models: Sequence[str]) -> dict[str, RollbackRecord]:
        """:meth:`last` of each of ``models`` that has one, in one read."""
        ...

    async def latched_of(self, models: Sequence[str]) -> dict[str, list[DegradedRelease]]:
        """:meth:`latched` of each of ``models`` that has any, in one read."""
        ...

    async def since(self, at: datetime, limit: int = 500) -> list[RollbackRecord]:
        """Every model's rollbacks recorded at or after ``at``, oldest first; the newest
        ``limit`` of them when there are more."""
        ...


class AlertBook(Protocol):
    async def record(self, alert: Alert, at: datetime) -> Receipt:
        """Store one receipt of an alert, deduped on (fingerprint, startsAt)."""
        ...

    async def recent(self, limit: int = 50) -> list[AlertRecord]: ...


class MemoryBook(Protocol):
    async def record(self, sample: MemorySample) -> None: ...

    async def recent(self, limit: int) -> list[MemorySample]:
        """The newest ``limit`` samples, oldest first."""
        ...
