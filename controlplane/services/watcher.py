"""The release watcher: notices new releases in the store and deploys them by policy.

Every ``poll_interval`` (or sooner, when the store reports a change) it lists each model's
releases, a listing and never a download, and compares them with what it recorded last time.
A release is *new* when it became complete (its ``SHA256SUMS`` appeared) or was republished
(the marker's revision changed). New releases are recorded and shown as available; when the
model's policy says ``auto_deploy``, the newest complete release (natural sort) is deployed,
but only if it is itself new: a release a person rolled back from is not pushed again, and
one latched degraded by an automatic rollback is not pushed even when republished.

In a fleet every member's watcher sees a new release, and each tries to *claim* it in the
fleet's desired state (compare-and-swap): the one that wins deploys it first, as if it had
received the call, and publishes it once it serves; the others follow the desired state. So a
bad release published to the store stops at one member. A member that lost to a live claim
looks again at its next scans, and claims it itself if the claimer died before finishing.

A beat costs what changed, not what the store holds. With a store's change events
(:class:`~controlplane.ports.ChangeEvents`: a local store's inotify, an S3 bucket's
notifications through an SQS queue of this member's own) a beat lists only the models whose
dirs had events, plus those whose last listing failed or whose auto-deploy waits for a retry: a
quiet beat lists nothing. The whole store is listed every ``full_scan_every`` s anyway, and on
every beat while the events cannot be trusted (not set up yet, broken, a network filesystem, no
events at all, or a queue the fleet shares, whose events name models but never vouch for the
others: another member may have taken theirs), so an event dropped on the way delays a release
until the next full scan, never loses it. A full scan is one call,
:meth:`~controlplane.ports.ModelStore.list_store` (one paginated listing of an S3 store, however
many models it holds); a beat that events name lists those models one by one. After each
scan the watcher tells the events which models it has listed and acted on
(:meth:`~controlplane.ports.ChangeEvents.handled`): SQS deletes a message only then. A model
whose listing is the one the last scan recorded (the store adapters make that listing cheap) is
not looked up in the releases book, and of a changed listing only the rows that differ from the
book are written (a row's ``last_seen`` is therefore when it last changed). What was listed is
kept in the :class:`~controlplane.services.catalog.StoreCatalog`, which ``GET /v1/models``
answers from.

Where a signature is required (``store.require_signature``, per model too) the newest release
is not auto-deployed while the listing shows no ``SHA256SUMS.sig`` beside it: it is shown as
available, logged once, and deployed when its signature appears; no older release is deployed
instead. Whether the signature verifies is the deploy's ``signature`` step to find out.

A deploy that failed for a transient reason (the store throttled, objects changed during the
download) is retried at the next scan; one that failed permanently is not retried until the
release is republished. A new release found while its model is busy with another operation
(a deploy, its old slot retiring) is tried again as soon as that operation ends. After a
restart the newest release is deployed again if its auto-deploy was cut short by the stop
(its deploy left interrupted, or never begun): what is new is not remembered across restarts,
what the journal says is.

Dirs (or S3 prefixes) the listings leave out because their names are no model's or release's
(:mod:`controlplane.domain.ignored`) are kept in the catalog with the listing, for the API to
show, and logged once each (:class:`~controlplane.services.ignored_log.IgnoredNamesLog`). They
cost nothing more than the listing that meets them: the models are listed on a full scan, and
on a beat whose events name an entry at the store's top that is no model's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.domain.errors import (
    ControlPlaneError,
    InvalidName,
    ModelNotFound,
)
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.names import validate_model_name
from controlplane.domain.operations import (
    Operation,
)
from controlplane.domain.releases import ReleaseInfo, natural_key
from controlplane.ports import (
    ChangeEvents,
    Clock,
    ModelStore,
    ReleaseBook,
    RollbackBook,
    ServingRepo,
)
from controlplane.services.auto_deploy import AutoDeploy
from controlplane.services.catalog import StoreCatalog, kept
from controlplane.services.deploy import DeployService
from controlplane.services.ignored_log import IgnoredNamesLog
from controlplane.services.operations import OperationClient
from controlplane.services.tasks import TaskOwner
from controlplane.timing import Wake

log = logging.getLogger(__name__)
FULL_SCAN_SECONDS = 300.0


@dataclass(frozen=True)
class _Listed:
    """One model's listing, made in the worker thread, and what it left out."""

    model: str
    releases: list[ReleaseInfo] | ControlPlaneError
    ignored: list[IgnoredName]


@dataclass(frozen=True)
class _Plan:
    models: set[str] | None  # None: every model (a full scan)
    top: bool  # list the models too (a full scan does), for the entries that are no model's


@dataclass(frozen=True)
class ScanResult:
    new: list[ReleaseInfo] = field(default_factory=list)
    deploys: list[Operation] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    full: bool = True  # every model was listed; else only ``listed``
    listed: list[str] = field(default_factory=list)  # the models whose releases were listed


class ReleaseWatcher:
    def __init__(
        self,
        *,
        store: ModelStore,
        deploy: DeployService,
        client: OperationClient,
        releases: ReleaseBook,
        serving: ServingRepo,
        rollbacks: RollbackBook,
        clock: Clock,
        tasks: TaskOwner,
        auto_deploy: Callable[[str], bool],
        interval: float,
        require_signature: Callable[[str], bool] = lambda _model: False,
        catalog: StoreCatalog | None = None,
        events: ChangeEvents | None = None,
        full_scan_every: float = FULL_SCAN_SECONDS,
        wake: Wake | None = None,
    ) -> None:
        self.catalog = catalog or StoreCatalog()
        self._events = events
        self._full_scan_every = full_scan_every
        self._next_full: float | None = None  # monotonic time of the next full scan
        self._store = store
        self._releases = releases
        self._clock = clock
        self._auto_deploy = auto_deploy
        self._interval = interval
        self._ignored_log = IgnoredNamesLog()
        self.wake = wake or Wake(clock)  # set by the store's events, or to scan at once
        self._auto = AutoDeploy(
            deploy=deploy,
            client=client,
            serving=serving,
            rollbacks=rollbacks,
            tasks=tasks,
            require_signature=require_signature,
            wake=self.wake.set,
        )

    async def run(self, after: asyncio.Event | None = None) -> None:
        """Scan forever, every interval or when woken; cancelled on shutdown. A scan that fails
        is logged when its error is new (not on every beat), and the recovery once. ``after``:
        start once it is set (start-up reconcile has run)."""
        if after is not None:
            await after.wait()
        failing: str | None = None
        while True:
            try:
                await self.scan()
            except ControlPlaneError as exc:
                if str(exc) != failing:
                    log.warning(
                        "store scan failed: %s; looking again every %g s", exc, self._interval
                    )
                failing = str(exc)
            else:
                if failing is not None:
                    log.info("the store %s can be listed again", self._store.uri)
                failing = None
            await self.wake.sleep(self._interval)

    async def scan(self) -> ScanResult:
        plan = self._plan()
        started = self._clock.monotonic()
        if plan.models is not None and not plan.models and not plan.top:
            self.catalog.looked(self._clock.now())  # nothing changed: nothing to list
            return ScanResult(full=False)
        try:
            return await self._scan(plan, started)
        except BaseException:
            self._next_full = None  # what the events named may not all have been looked at
            raise

    async def _scan(self, plan: _Plan, started: float) -> ScanResult:
        full = plan.models is None
        top: list[IgnoredName] = []  # filled in the worker thread, read once it is done
        try:
            listings = await asyncio.to_thread(self._list_store, plan, top)
        except ControlPlaneError as exc:
            self.catalog.set_error(str(exc))
            raise
        if plan.top:
            self._ignored_log.report(top)
            self.catalog.ignoring(kept(top))
        result = ScanResult(full=full, listed=[listed.model for listed in listings])
        present = []
        handled = set()  # listed and acted on: what named them is done with
        for listed in listings:
            model, listing = listed.model, listed.releases
            try:
                if isinstance(listing, ControlPlaneError):
                    raise listing
                if listed.ignored:
                    self._ignored_log.report(listed.ignored, model=model)
                await self._scan_model(model, listing, kept(listed.ignored), result)
            except ModelNotFound:
                self.catalog.forget(model)  # gone (between the two listings, or since an event)
                handled.add(model)
                continue
            except ControlPlaneError as exc:
                result.errors[model] = str(exc)
                self.catalog.failed(model, str(exc))
                log.warning("watching %s: %s", model, exc)
            else:
                handled.add(model)
            present.append(model)
        if full:
            self.catalog.finished(present, self._clock.now())
            self._next_full = started + self._full_scan_every
        else:
            self.catalog.looked(self._clock.now())
        if self._events is not None:
            self._events.handled(frozenset(handled))
        return result

    def _plan(self) -> _Plan:
        """The models this beat lists: all of them (a full scan) without events, when they
        cannot be trusted since the last beat, and every ``full_scan_every`` s."""
        changes = self._events.take() if self._events is not None else None
        due = self._next_full is None or self._clock.monotonic() >= self._next_full
        if changes is None or not changes.complete or due:
            return _Plan(None, top=True)
        # Listed every beat: models whose auto-deploy waits for a retry, or for the signature
        # of a release held unsigned (a SHA256SUMS.sig uploaded after SHA256SUMS).
        retrying = self._auto.waiting()
        named = {model for model in changes.models if _is_model_name(model)}
        return _Plan(named | retrying | self.catalog.failing(), top=changes.others)

    def _list_store(self, plan: _Plan, top: list[IgnoredName]) -> list[_Listed]:
        """The releases of the planned models (None: every model in the store), or why not,
        in one worker thread: a hop to a thread per model cost more than listing the model
        once its markers were no longer hashed. The entries the models' listing leaves out are
        appended to ``top``."""
        if plan.models is None:
            return self._list_everything(top)
        if plan.top:  # only for the entries at the top that are no model's
            self._store.list_models(ignored=top.append)
        listings = []
        for model in sorted(plan.models, key=natural_key):
            ignored: list[IgnoredName] = []
            try:
                releases = self._store.list_releases(model, ignored=ignored.append)
                listings.append(_Listed(model, releases, ignored))
            except ControlPlaneError as exc:
                listings.append(_Listed(model, exc, []))
        return listings

    def _list_everything(self, top: list[IgnoredName]) -> list[_Listed]:
        """A full scan: every model and its releases in one call (one listing of an S3 store,
        whatever its number of models); it fails as a whole or not at all."""
        ignored: dict[str | None, list[IgnoredName]] = {}

        def left_out(model: str | None, entry: IgnoredName) -> None:
            ignored.setdefault(model, []).append(entry)

        store = self._store.list_store(ignored=left_out)
        top.extend(ignored.pop(None, []))
        return [
            _Listed(model, releases, ignored.get(model, [])) for model, releases in store.items()
        ]

    async def _scan_model(
        self,
        model: str,
        releases: list[ReleaseInfo],
        ignored: tuple[IgnoredName, ...],
        result: ScanResult,
    ) -> None:
        last = self.catalog.get(model)
        if last is not None and last.releases == tuple(releases) and not self._auto.retrying(model):
            # As recorded at the last scan: nothing to do (but what it left out may differ).
            self.catalog.listed(model, releases, ignored)
            return
        recorded = await self._releases.seen(model)
        before = {(r.name, r.complete, r.revision) for r in recorded}
        new = [r for r in releases if r.complete and (r.name, True, r.revision) not in before]
        changed = [r for r in releases if (r.name, r.complete, r.revision) not in before]
        if changed:
            await self._releases.record(changed, self._clock.now())
        self.catalog.listed(model, releases, ignored)
        for info in new:
            log.info(
                "new release %s of %s in the store",
                info.name,
                model,
                extra={"model": model, "release": info.name},
            )
        result.new.extend(new)
        if self._auto_deploy(model):
            await self._auto.consider(model, releases, new, recorded, result.deploys)


def _is_model_name(name: str) -> bool:
    """Whether an event's name can be a model's (a full scan skips the others too)."""
    try:
        validate_model_name(name)
    except InvalidName:
        return False
    return True
