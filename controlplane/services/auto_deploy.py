"""The release watcher's auto-deploy: which new release of a model is deployed, and when.

Only the newest complete release (natural sort) is deployed, and only if it is itself new: a
release a person rolled back from (latched degraded) is not pushed again, and one held back
for want of a signature waits for its ``SHA256SUMS.sig``. In a fleet every member's watcher
sees the release and each tries to *claim* it in the desired state (compare-and-swap): the one
that wins deploys it first; the others follow the desired state. A deploy that failed for a
transient reason is tried again at the next scan; one found while its model is busy, as soon
as that operation ends; one that failed for good, not until the release is republished. After
a restart the newest release is deployed again if its auto-deploy was cut short by the stop:
what is new is not remembered across restarts, what the journal says is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

from controlplane.domain.errors import ControlPlaneError, OperationInProgress
from controlplane.domain.operations import (
    Cause,
    Operation,
    OperationKind,
    OperationStatus,
    Trigger,
    Unchanged,
)
from controlplane.domain.releases import ReleaseInfo, natural_key
from controlplane.ports import RollbackBook, ServingRepo
from controlplane.services.deploy import DeployService
from controlplane.services.operations import OperationClient
from controlplane.services.tasks import TaskOwner

log = logging.getLogger(__name__)
RESUME_LOOKBACK = 200  # a model's operations read for what became of its newest release
Key = tuple[str, str, str | None]  # model, release, revision


class AutoDeploy:
    def __init__(
        self,
        *,
        deploy: DeployService,
        client: OperationClient,
        serving: ServingRepo,
        rollbacks: RollbackBook,
        tasks: TaskOwner,
        require_signature: Callable[[str], bool],
        wake: Callable[[], None],
    ) -> None:
        self._deploy = deploy
        self._client = client
        self._serving = serving
        self._rollbacks = rollbacks
        self._tasks = tasks
        self._require_signature = require_signature
        self._wake = wake
        self._retry: set[Key] = set()
        # Newest releases held back for want of a signature (each logged once): deployed once
        # their SHA256SUMS.sig appears, forgotten once a newer release is the newest.
        self._unsigned: set[Key] = set()
        self._looked: set[str] = set()  # auto-deploy models looked at since the start

    def waiting(self) -> set[str]:
        """The models listed every beat: an auto-deploy of theirs waits for a retry, or for
        the signature of a release held unsigned (a .sig uploaded after SHA256SUMS)."""
        return {model for model, _release, _revision in self._retry | self._unsigned}

    def retrying(self, model: str) -> bool:
        """An auto-deploy of ``model`` waits to be tried again at this scan."""
        return any(key[0] == model for key in self._retry)

    async def consider(
        self,
        model: str,
        releases: list[ReleaseInfo],
        new: list[ReleaseInfo],
        recorded: list[ReleaseInfo],
        started: list[Operation],
    ) -> None:
        """Deploy ``model``'s newest complete release if it is new (or its auto-deploy waits
        for a retry, a signature, or was cut short by a stop); each operation started is
        appended to ``started``."""
        newest = await self._candidate(model, releases, new, recorded)
        if newest is None:
            return
        key = (model, newest.name, newest.revision)
        if self._held_unsigned(newest, key):
            return
        if self._client.holder(model) is not None:
            self._when_free(model, key)
            return
        self._retry.discard(key)
        if not await self._our_turn(model, newest, key):
            return
        operation = await self._start(model, newest, key)
        if operation is None:
            return
        started.append(operation)
        self._tasks.spawn(f"watch-{operation.id}", self._follow(operation, key))

    async def _candidate(
        self,
        model: str,
        releases: list[ReleaseInfo],
        new: list[ReleaseInfo],
        recorded: list[ReleaseInfo],
    ) -> ReleaseInfo | None:
        """The newest complete release, if it is due: new, waiting for a retry or a signature,
        or cut short by a stop; not already serving; not latched by a rollback."""
        complete = [r for r in releases if r.complete]
        if not complete:
            return None
        newest = max(complete, key=lambda r: natural_key(r.name))
        key = (model, newest.name, newest.revision)
        fresh = newest in new or key in self._retry or key in self._unsigned
        if not fresh and not await self._cut_short(model, newest.name):
            return None
        record = await self._serving.get(model)
        known = {r.name for r in recorded if r.complete}
        if record and record.active_release == newest.name and newest.name not in known:
            return None  # already serving it; first sight of it is no reason to load it again
        latched = {d.release: d for d in await self._rollbacks.latched(model)}
        if newest.name in latched:
            log.warning(
                "not auto-deploying %s %s: it was rolled back from (%s); deploy it by hand to "
                "clear that",
                model,
                newest.name,
                latched[newest.name].reason,
                extra={"model": model, "release": newest.name},
            )
            return None
        return newest

    async def _our_turn(self, model: str, newest: ReleaseInfo, key: Key) -> bool:
        """In a fleet one member goes first and the others follow the desired state: whether
        this member is the one."""
        fleet = self._deploy.fleet
        if fleet is None:
            return True
        claim = await fleet.claim(model, newest.name, newest.revision)
        if claim.won:
            return True
        log.info(
            "not auto-deploying %s %s here: %s",
            model,
            newest.name,
            claim.why,
            extra={"model": model, "release": newest.name},
        )
        if claim.look_again:
            self._retry.add(key)
        return False

    async def _start(self, model: str, newest: ReleaseInfo, key: Key) -> Operation | None:
        try:
            operation = await self._client.start(
                partial(
                    self._deploy.deploy,
                    model,
                    newest.name,
                    trigger=Trigger.WATCHER,
                    cause=Cause(reason=f"{newest.name} is the newest complete release"),
                ),
                patience=self._deploy.behind_housekeeping(model),
            )
        except OperationInProgress:
            self._when_free(model, key)  # taken since the look above
            return None
        except ControlPlaneError as exc:
            if exc.retryable:
                self._retry.add(key)
            log.warning("auto-deploy of %s %s refused: %s", model, newest.name, exc)
            return None
        return None if isinstance(operation, Unchanged) else operation

    async def _cut_short(self, model: str, release: str) -> bool:
        """At this daemon's first look at ``model`` since it started: was the auto-deploy of
        its newest complete release cut short when the daemon stopped (killed, restarted)? It
        was if that release's last operation is a deploy left interrupted, or if no operation
        names it and it is newer than what serves (seen, and the daemon died before the deploy
        began). One that failed, was rolled back from or serves is left alone, as before."""
        if model in self._looked:
            return False
        self._looked.add(model)
        record = await self._serving.get(model)
        active = record.active_release if record else None
        if active == release:
            return False
        for operation in await self._deploy.list_operations(model, RESUME_LOOKBACK):
            if release in (operation.release, operation.from_release):
                cut = (
                    operation.kind is OperationKind.DEPLOY
                    and operation.status is OperationStatus.INTERRUPTED
                )
                break
        else:
            cut = active is None or natural_key(release) > natural_key(active)
        if cut:
            log.info(
                "resuming the auto-deploy of %s %s, cut short when the daemon stopped",
                model,
                release,
                extra={"model": model, "release": release},
            )
        return cut

    def _held_unsigned(self, newest: ReleaseInfo, key: Key) -> bool:
        """Whether the newest release is held back: a signature is required and it has none.
        No older release is deployed instead; a deploy by hand says ``signature_missing``."""
        model = newest.model
        self._unsigned = {held for held in self._unsigned if held[0] != model or held == key}
        if newest.signed or not self._require_signature(model):
            self._unsigned.discard(key)
            return False
        if key not in self._unsigned:
            self._unsigned.add(key)
            log.warning(
                "not auto-deploying %s %s: it has no SHA256SUMS.sig and a signature is required "
                "(store.require_signature); upload the signature and it is deployed then",
                model,
                newest.name,
                extra={"model": model, "release": newest.name},
            )
        return True

    def _when_free(self, model: str, key: Key) -> None:
        """The model is busy: try the auto-deploy again as soon as that operation has ended."""
        self._retry.add(key)
        self._tasks.spawn(f"watch-busy-{model}", self._scan_after(model))

    async def _scan_after(self, model: str) -> None:
        """Scan again once the operation holding ``model`` has ended: a release heard while
        the model was busy (retiring its old slot, say) is deployed then, not a poll later
        (which with notifications may be minutes)."""
        await self._client.until_free(model)
        self._wake()

    async def _follow(self, operation: Operation, key: Key) -> None:
        outcome = await self._client.wait(operation.id)
        if outcome.succeeded:
            return
        code = outcome.code or ""
        if outcome.retryable:
            self._retry.add(key)
            log.warning(
                "auto-deploy of %s %s failed (%s); retrying at the next scan", *key[:2], code
            )
            return
        log.error("auto-deploy of %s %s failed (%s); waiting for a new release", *key[:2], code)
        if self._deploy.fleet is not None:  # the release stops here: no other member tries it
            await self._deploy.fleet.claim_failed(key[0], key[1], outcome.error)
