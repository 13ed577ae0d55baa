"""Read models for operators: what serves, what Triton says, what the store offers.

Answers are assembled from the database (desired state), Triton's index (observed state) and
the store (available releases). A Triton or store that cannot be reached makes the answer
less complete, never an error: status is what operators reach for when things are broken.

The list of models reads the store's releases from the watcher's last scan (the
:class:`~controlplane.services.catalog.StoreCatalog`), never from the store itself once that
scan exists, and builds only one page: its cost per call grows with the page, not with the
store. One model's answer still reads the store. A list also reuses Triton's index for up to
:data:`INDEX_REUSE_SECONDS`, unless an operation was saved since (every change the daemon makes
to Triton is one): a client that polls the list does not cost Triton a call each time, and the
page says when the store and Triton were seen (:class:`AsOf`). The overload verdict, one per
Triton, is given once per page (:attr:`ModelPage.overload`), not in each model's view.

What the store's listings left out because of their names (:mod:`controlplane.domain.ignored`)
comes with them: each view's ``ignored_releases``, the page's ``ignored_models``. A model dir
that holds nothing but misnamed releases is a model the store has, so one model's answer is
those, not ``model_not_found``.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.domain.errors import ControlPlaneError, ModelNotFound
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.names import validate_model_name
from controlplane.domain.operations import CHANGES, HOUSEKEEPING, Operation, OperationKind
from controlplane.domain.releases import natural_key
from controlplane.domain.rollback import DegradedRelease, RollbackRecord
from controlplane.domain.rotation import OutOfRotation
from controlplane.domain.slots import SlotState
from controlplane.domain.traffic import Strategy, TrafficPolicy
from controlplane.domain.triton import TritonState
from controlplane.ports import (
    Clock,
    IndexEntry,
    ModelRecord,
    ModelStore,
    OperationLog,
    RollbackBook,
    ServingRepo,
    Triton,
)
from controlplane.services.catalog import Listing, StoreCatalog, kept
from controlplane.services.overload import OverloadView
from controlplane.services.views import AsOf, History, ModelPage, ModelView

log = logging.getLogger(__name__)
INDEX_REUSE_SECONDS = 1.0


@dataclass(frozen=True)
class _Built:
    """A page of views, and what it was built from."""

    inputs: tuple[object, ...]
    views: list[ModelView]

    def expired(self, now: datetime) -> bool:
        """A cooldown a view shows has ended since (the one part of a view that time moves)."""
        return any(v.cooldown_until is not None and v.cooldown_until <= now for v in self.views)


@dataclass(frozen=True)
class _SeenIndex:
    monotonic: float
    writes: int  # the journal's count of saved operations when it was read
    at: datetime
    index: dict[str, IndexEntry] | None


class StatusService:
    def __init__(
        self,
        *,
        serving: ServingRepo,
        journal: OperationLog,
        rollbacks: RollbackBook,
        store: ModelStore,
        triton: Triton,
        clock: Clock,
        holder: Callable[[str], str | None],
        traffic: Callable[[str], TrafficPolicy] | None = None,
        overload: Callable[[], OverloadView | None] | None = None,
        fallback: Callable[[ModelRecord, Sequence[DegradedRelease]], str | None] | None = None,
        previous_of: Callable[[ModelRecord], str | None] | None = None,
        cooldown_until: Callable[[RollbackRecord | None], datetime | None] | None = None,
        drift: Callable[[str], str | None] | None = None,
        out_of_rotation: Callable[[str], OutOfRotation | None] | None = None,
        catalog: StoreCatalog | None = None,
    ) -> None:
        self._catalog = catalog
        self._overload = overload or (lambda: None)
        self._fallback = fallback or (lambda _record, _degraded: None)
        self._previous_of = previous_of or (lambda record: record.previous_release)
        self._cooldown = cooldown_until or (lambda _last: None)
        self._drift = drift or (lambda _model: None)
        self._out_of_rotation = out_of_rotation or (lambda _model: None)
        self._traffic = traffic or (lambda _model: TrafficPolicy(strategy=Strategy.INPLACE))
        self._serving = serving
        self._journal = journal
        self._rollbacks = rollbacks
        self._store = store
        self._triton = triton
        self._clock = clock
        self._holder = holder
        self._seen_index: _SeenIndex | None = None
        self._order: tuple[tuple[int, frozenset[str]], list[str]] | None = None
        self._records_seen: tuple[int, dict[str, ModelRecord]] | None = None
        self._built: _Built | None = None  # the last page of views built

    async def list_models(
        self, *, limit: int | None = None, after: str | None = None, managed_first: bool = False
    ) -> ModelPage:
        """Models managed here or in the store, in natural order: those after the model named
        ``after``, at most ``limit`` of them (None: all). ``managed_first`` (a page for people,
        never paged with ``after``): the models this member manages come before those only
        in the store, so a limit never hides what serves behind releases nobody deployed."""
        if after is not None:
            validate_model_name(after)
            if managed_first:
                raise ValueError("managed_first orders one page: it cannot follow 'after'")
        seen = await self._recent_index()
        catalog = self._catalog if self._catalog and self._catalog.scanned else None
        store_error = catalog.error if catalog is not None else None
        records = await self._records()
        if catalog is not None:
            ordered = self._ordered(catalog, records)
            ignored = catalog.ignored_models
        else:  # the watcher has not looked yet (start-up): look now
            names = set(records)
            left_out: list[IgnoredName] = []
            try:
                names.update(
                    await asyncio.to_thread(
                        functools.partial(self._store.list_models, ignored=left_out.append)
                    )
                )
            except ControlPlaneError as exc:
                log.warning("store unreachable while listing models: %s", exc)
                store_error = str(exc)
            ordered = sorted(names, key=_order)
            ignored = kept(left_out)
        if after is not None:
            ordered = ordered[bisect.bisect_right(ordered, _order(after), key=_order) :]
        if managed_first:
            ordered = [n for n in ordered if n in records] + [
                n for n in ordered if n not in records
            ]
        page = ordered if limit is None else ordered[:limit]
        more = len(page) < len(ordered)
        as_of = AsOf(
            store=catalog.scanned if catalog is not None else None,
            store_full_scan=catalog.full_scan if catalog is not None else None,
            triton=seen.at if seen.index is not None else None,
        )
        next_after = page[-1] if more and page else None
        if catalog is None:
            listings = await asyncio.to_thread(lambda: {n: self._listing(n) for n in page})
            views = await self._views(page, seen.index, records, listings, overload=None)
            return ModelPage(views, next_after, self._overload(), as_of, store_error, ignored)
        # Taken before anything is read: a write submitted after it moves it.
        inputs = self._inputs(page, catalog, seen)
        built = self._built
        if built is None or built.inputs != inputs or built.expired(self._clock.now()):
            known = _known(catalog)
            listings = {name: known(name) for name in page}
            views = await self._views(page, seen.index, records, listings, overload=None)
            built = self._built = _Built(inputs, views)
        return ModelPage(built.views, next_after, self._overload(), as_of, store_error, ignored)

    def _inputs(
        self, page: list[str], catalog: StoreCatalog, seen: _SeenIndex
    ) -> tuple[object, ...]:
        """What the views of ``page`` are made of, cheap to compare: a page whose inputs are
        those of the last one built is that page again, without a read of the database."""
        return (
            tuple(page),
            catalog.version,
            self._serving.writes,
            self._journal.writes,
            self._rollbacks.writes,
            seen,  # the same object while the index is reused: compared by identity first
            tuple(self._holder(name) for name in page),
            tuple(self._drift(name) for name in page),
            tuple(self._out_of_rotation(name) for name in page),
        )

    async def _records(self) -> dict[str, ModelRecord]:
        """Every model's record, read again only after a write."""
        writes = self._serving.writes  # before the read: a write submitted after it moves it
        if self._records_seen is None or self._records_seen[0] != writes:
            records = {record.name: record for record in await self._serving.all()}
            self._records_seen = (writes, records)
        return self._records_seen[1]

    async def get_model(self, model: str) -> ModelView:
        validate_model_name(model)
        index = await self._index()
        record = await self._serving.get(model)
        listing = await asyncio.to_thread(self._listing, model)
        records = {model: record} if record is not None else {}
        [view] = await self._views(
            [model], index, records, {model: listing}, overload=self._overload()
        )
        if (
            view.active_release is None
            and not view.slots
            and not view.releases
            and not view.ignored_releases
        ):
            unread = f"; and the store cannot be read: {listing.error}" if listing.error else ""
            raise ModelNotFound(
                f"model {model!r} is neither managed here nor in the store "
                f"{self._store.uri}{unread}"
            )
        return view

    async def _recent_index(self) -> _SeenIndex:
        """Triton's index and when it was read: the last one this service read, while it is
        younger than :data:`INDEX_REUSE_SECONDS` and no operation was saved since."""
        now = self._clock.monotonic()
        seen = self._seen_index
        if (
            seen is not None
            and now - seen.monotonic < INDEX_REUSE_SECONDS
            and seen.writes == self._journal.writes
        ):
            return seen
        writes = self._journal.writes  # before the call: one saved during it counts as after
        at = self._clock.now()
        self._seen_index = _SeenIndex(now, writes, at, await self._index())
        return self._seen_index

    def _ordered(self, catalog: StoreCatalog, records: dict[str, ModelRecord]) -> list[str]:
        """Every model's name in natural order, sorted again only when the names changed."""
        key = (catalog.version, frozenset(records))
        if self._order is None or self._order[0] != key:
            names = set(records)
            names.update(catalog.models())
            self._order = (key, sorted(names, key=_order))
        return self._order[1]

    async def _index(self) -> dict[str, IndexEntry] | None:
        try:
            return {entry.name: entry for entry in await self._triton.index()}
        except ControlPlaneError as exc:
            log.warning("Triton unreachable for status: %s", exc)
            return None

    def _listing(self, model: str) -> Listing:
        """``model``'s releases, read from the store now (a worker thread's job)."""
        left_out: list[IgnoredName] = []
        try:
            releases = self._store.list_releases(model, ignored=left_out.append)
            return Listing(tuple(releases), ignored=kept(left_out))
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
        *,
        overload: OverloadView | None,
    ) -> list[ModelView]:
        """The views of ``names``, their history read in six reads whatever their number (one
        read per model and table made a page of 100 models cost 700 round trips), queued at
        once (the database thread runs them back to back). The last operation is the newest
        change of what serves, the daemon's housekeeping read apart (see
        :class:`~controlplane.domain.operations.OperationKind`): a retire after a failed
        deploy must not hide it."""
        serving = {
            name: record.active_release
            for name in names
            if (record := records.get(name)) is not None and record.active_release is not None
        }
        last_operations, upkeep, repairs, rollbacks, degraded, deploys = await asyncio.gather(
            self._journal.latest(names, CHANGES),
            self._journal.latest(names, HOUSEKEEPING),
            self._journal.latest(names, {OperationKind.REPAIR}),
            self._rollbacks.last_of(names),
            self._rollbacks.latched_of(names),
            self._journal.last_deploys(serving),
        )
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
                    _signer(deploys.get(name)),
                    upkeep.get(name),
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
            alias_target=active if policy.strategy.aliased else None,
            name=model,
            active_release=record.active_release if record else None,
            previous_release=self._previous_of(record) if record else None,
            slots=slots,
            triton_state=triton_state,
            triton_reason=reason,
            releases=listing.releases,
            store_error=listing.error,
            running_operation=self._holder(model),
            last_operation=history.last_operation,
            last_housekeeping=history.last_housekeeping,
            overload=overload,
            fallback=self._fallback(record, history.degraded) if record else None,
            last_rollback=history.last_rollback,
            degraded=history.degraded,
            cooldown_until=self._cooldown(history.last_rollback),
            last_repair=history.last_repair,
            drift=self._drift(model),
            out_of_rotation=self._out_of_rotation(model),
            cpu_only=any(s.state is SlotState.ACTIVE and s.cpu_only for s in slots),
            ignored_releases=listing.ignored,
            signer=history.signer,
        )


def _signer(deploy: Operation | None) -> str | None:
    signer = deploy.detail.get("signer") if deploy is not None else None
    return signer if isinstance(signer, str) else None


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
        if found.error or not catalog.error:
            return found
        return Listing(found.releases, catalog.error, found.ignored)

    return known


def _seen_by_triton(index: dict[str, IndexEntry] | None, name: str) -> str:
    """Triton's state of ``name``: "unknown" when Triton is unreachable."""
    if index is None:
        return "unknown"
    entry = index.get(name)
    return (entry.state if entry else TritonState.UNAVAILABLE).value
