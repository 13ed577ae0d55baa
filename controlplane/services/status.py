"""Read models for operators: what serves, what Triton says, what the store offers.

Answers are assembled from the database (desired state), Triton's index (observed state) and
the store (available releases). A Triton or store that cannot be reached makes the answer
less complete, never an error: status is what operators reach for when things are broken.

The list of models reads the store's releases from the watcher's last scan (the
:class:`~controlplane.services.catalog.StoreCatalog`), never from the store itself once that
scan exists, and builds only one page: its cost per call grows with the page, not with the
store. One model's answer still reads the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
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
    ModelRecord,
    ModelStore,
    OperationLog,
    RollbackBook,
    ServingRepo,
    Triton,
)
from controlplane.services.catalog import Listing, StoreCatalog
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


@dataclass(frozen=True)
class ModelPage:
    models: list[ModelView]
    next_after: str | None  # the name to pass as ``after`` for the next page; None: no more


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
        fallback: Callable[[ModelRecord, Sequence[DegradedRelease]], str | None] | None = None,
        cooldown_until: Callable[[RollbackRecord | None], datetime | None] | None = None,
        drift: Callable[[str], str | None] | None = None,
        catalog: StoreCatalog | None = None,
    ) -> None:
        self._catalog = catalog
        self._overload = overload or (lambda: None)
        self._fallback = fallback or (lambda _record, _degraded: None)
        self._cooldown = cooldown_until or (lambda _last: None)
        self._drift = drift or (lambda _model: None)
        self._traffic = traffic or (lambda _model: TrafficPolicy(strategy=Strategy.INPLACE))
        self._serving = serving
        self._journal = journal
        self._rollbacks = rollbacks
        self._store = store
        self._triton = triton
        self._holder = holder

    async def list_models(self, *, limit: int | None = None, after: str | None = None) -> ModelPage:
        """Models managed here or in the store, in natural order: those after the model named
        ``after``, at most ``limit`` of them (None: all)."""
        if after is not None:
            validate_model_name(after)
        index = await self._index()
        records = {record.name: record for record in await self._serving.all()}
        names = set(records)
        catalog = self._catalog if self._catalog and self._catalog.scanned else None
        if catalog is not None:
            names.update(catalog.models())
        else:  # the watcher has not looked yet (start-up): look now
            try:
                names.update(await asyncio.to_thread(self._store.list_models))
            except ControlPlaneError as exc:
                log.warning("store unreachable while listing models: %s", exc)
        ordered = sorted(names, key=_order)
        if after is not None:
            bound = _order(after)
            ordered = [name for name in ordered if _order(name) > bound]
        page = ordered if limit is None else ordered[:limit]
        if catalog is not None:
            known = _known(catalog)
            listings = {name: known(name) for name in page}
        else:
            listings = await asyncio.to_thread(lambda: {n: self._listing(n) for n in page})
        views = await self._views(page, index, records, listings)
        more = len(page) < len(ordered)
        return ModelPage(views, page[-1] if more and page else None)

    async def get_model(self, model: str) -> ModelView:
        validate_model_name(model)
        index = await self._index()
        record = await self._serving.get(model)
        listing = await asyncio.to_thread(self._listing, model)
        records = {model: record} if record is not None else {}
        [view] = await self._views([model], index, records, {model: listing})
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

    def _listing(self, model: str) -> Listing:
        """``model``'s releases, read from the store now (a worker thread's job)."""
        try:
            return Listing(tuple(self._store.list_releases(model)))
        except ModelNotFound:
            return Listing(())
        except ControlPlaneError as exc:
            return Listing((), str(exc))

    async def _views(
        self,
        names: list[str],
        index: dict[str, IndexEntry] | None,
        records: dict[str, ModelRecord],
        listings: dict[str, Listing],
    ) -> list[ModelView]:
        """The views of ``names``, their history read in four reads whatever their number (one
        read per model and table made a page of 100 models cost 700 round trips)."""
        last_operations = await self._journal.latest(names)
        repairs = await self._journal.latest(names, OperationKind.REPAIR)
        rollbacks = await self._rollbacks.last_of(names)
        degraded = await self._rollbacks.latched_of(names)
        overload = self._overload()
        return [
            self._view(
                name,
                index,
                records.get(name),
                listings[name],
                History(
                    last_operations.get(name),
                    repairs.get(name),
                    rollbacks.get(name),
                    tuple(degraded.get(name, ())),
                ),
                overload,
            )
            for name in names
        ]

    def _view(
        self,
        model: str,
        index: dict[str, IndexEntry] | None,
        record: ModelRecord | None,
        listing: Listing,
        history: History,
        overload: OverloadView | None,
    ) -> ModelView:
        triton_state = _seen_by_triton(index, model)
        if index is None:
            reason = "Triton is unreachable"
        else:
            entry = index.get(model)
            reason = entry.reason if entry else "not in Triton's repository index"
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
            releases=listing.releases,
            store_error=listing.error,
            running_operation=self._holder(model),
            last_operation=history.last_operation,
            overload=overload,
            fallback=self._fallback(record, history.degraded) if record else None,
            last_rollback=history.last_rollback,
            degraded=history.degraded,
            cooldown_until=self._cooldown(history.last_rollback),
            last_repair=history.last_repair,
            drift=self._drift(model),
        )


@dataclass(frozen=True)
class History:
    """What the database holds about one model besides its record, read in bulk."""

    last_operation: Operation | None
    last_repair: Operation | None  # the reconcile loop's last repair
    last_rollback: RollbackRecord | None
    degraded: tuple[DegradedRelease, ...]


def _order(name: str) -> tuple[tuple[tuple[int, int | str], ...], str]:
    """Natural order, ties (``v01``, ``v1``; ``A``, ``a``) broken by the name: a total order,
    so a page boundary never skips or repeats a model."""
    return natural_key(name), name


def _known(catalog: StoreCatalog) -> Callable[[str], Listing]:
    """A model's releases from the catalog; one it does not hold (managed here, not in the
    store at the last scan) has none, and the store's error when the last scan failed."""

    def known(model: str) -> Listing:
        found = catalog.get(model)
        if found is None:
            return Listing((), catalog.error)
        return found if found.error or not catalog.error else Listing(found.releases, catalog.error)

    return known


def _seen_by_triton(index: dict[str, IndexEntry] | None, name: str) -> str:
    """Triton's state of ``name``: "unknown" when Triton is unreachable."""
    if index is None:
        return "unknown"
    entry = index.get(name)
    return entry.state if entry else "UNAVAILABLE"
