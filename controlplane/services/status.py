"""Read models for operators: what serves, what Triton says, what the store offers.

Answers are assembled from the database (desired state), Triton's index (observed state) and
the store (available releases). A Triton or store that cannot be reached makes the answer
less complete, never an error: status is what operators reach for when things are broken.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from controlplane.domain.errors import ControlPlaneError, ModelNotFound
from controlplane.domain.names import validate_model_name
from controlplane.domain.operations import Operation, OperationKind
from controlplane.domain.releases import ReleaseInfo, natural_key
from controlplane.domain.rollback import DegradedRelease, RollbackRecord
from controlplane.domain.slots import Slot, SlotState
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.ports import (
    IndexEntry,
    ModelStore,
    OperationLog,
    RollbackBook,
    ServingRepo,
    Triton,
)
from controlplane.services.overload import OverloadView

log = logging.getLogger(__name__)


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


class StatusService:
    def __init__(
        self,
        *,
        serving: ServingRepo,
        journal: OperationLog,
        rollbacks: RollbackBook,
        store: ModelStore,
        triton: Triton,
        holder: Callable[[str], str | None],
        traffic: Callable[[str], TrafficPolicy] | None = None,
        overload: Callable[[], OverloadView | None] | None = None,
        fallback: Callable[[str], Awaitable[str | None]] | None = None,
        cooldown_until: Callable[[str], Awaitable[datetime | None]] | None = None,
        drift: Callable[[str], str | None] | None = None,
    ) -> None:
        self._overload = overload or (lambda: None)
        self._fallback = fallback
        self._cooldown = cooldown_until
        self._drift = drift or (lambda _model: None)
        self._traffic = traffic or (lambda _model: TrafficPolicy(strategy=Strategy.INPLACE))
        self._serving = serving
        self._journal = journal
        self._rollbacks = rollbacks
        self._store = store
        self._triton = triton
        self._holder = holder

    async def list_models(self) -> list[ModelView]:
        index = await self._index()
        names = {record.name for record in await self._serving.all()}
        try:
            names.update(await asyncio.to_thread(self._store.list_models))
        except ControlPlaneError as exc:
            log.warning("store unreachable while listing models: %s", exc)
        return [await self._view(name, index) for name in sorted(names, key=natural_key)]

    async def get_model(self, model: str) -> ModelView:
        validate_model_name(model)
        view = await self._view(model, await self._index())
        if view.active_release is None and not view.slots and not view.releases:
            raise ModelNotFound(
                f"model {model!r} is neither managed here nor in the store {self._store.uri}"
            )
        return view

    async def _index(self) -> dict[str, IndexEntry] | None:
        try:
            return {entry.name: entry for entry in await self._triton.index()}
        except ControlPlaneError as exc:
            log.warning("Triton unreachable for status: %s", exc)
            return None

    async def _view(self, model: str, index: dict[str, IndexEntry] | None) -> ModelView:
        record = await self._serving.get(model)
        releases: tuple[ReleaseInfo, ...] = ()
        store_error = None
        try:
            releases = tuple(await asyncio.to_thread(self._store.list_releases, model))
        except ModelNotFound:
            releases = ()
        except ControlPlaneError as exc:
            store_error = str(exc)
        triton_state = _seen_by_triton(index, model)
        if index is None:
            reason = "Triton is unreachable"
        else:
            entry = index.get(model)
            reason = entry.reason if entry else "not in Triton's repository index"
        operations = await self._journal.recent(model, limit=20)
        policy = self._traffic(model)
        slots = tuple(record.slots) if record else ()
        active = next((s.name for s in slots if s.state is SlotState.ACTIVE), None)
        triton_states = {slot.name: _seen_by_triton(index, slot.name) for slot in slots}
        return ModelView(
            slot_triton_states=triton_states,
            strategy=policy.strategy.value,
            alias_target=active if policy.strategy is Strategy.BLUE_GREEN else None,
            name=model,
            active_release=record.active_release if record else None,
            previous_release=record.previous_release if record else None,
            slots=slots,
            triton_state=triton_state,
            triton_reason=reason,
            releases=releases,
            store_error=store_error,
            running_operation=self._holder(model),
            last_operation=operations[0] if operations else None,
            overload=self._overload(),
            fallback=await self._fallback(model) if self._fallback else None,
            last_rollback=await self._rollbacks.last(model),
            degraded=tuple(await self._rollbacks.latched(model)),
            cooldown_until=await self._cooldown(model) if self._cooldown else None,
            last_repair=next((op for op in operations if op.kind is OperationKind.REPAIR), None),
            drift=self._drift(model),
        )


def _seen_by_triton(index: dict[str, IndexEntry] | None, name: str) -> str:
    """Triton's state of ``name``: "unknown" when Triton is unreachable."""
    if index is None:
        return "unknown"
    entry = index.get(name)
    return entry.state if entry else "UNAVAILABLE"
