"""What the store held at the watcher's last look, for answers that must not list the store.

The watcher lists every model's releases on every beat anyway; ``GET /v1/models`` used to list
the whole store again for each call (every release's marker read, for 200 models x 20 releases
a quarter of a second). The watcher writes what it found here, model by model, and the status
service reads it: a listing is at most one beat old, which is what the watcher acts on too.

With a store's change events a beat lists only the models that changed (see the watcher): the
catalog is then as fresh as the last beat for every model, as far as events tell, and as fresh
as the last full scan (:attr:`StoreCatalog.full_scan`) whatever happened.

Nothing here is persisted: the catalog is empty after a start until the first scan, and status
lists the store itself until then (:attr:`StoreCatalog.scanned` is None).

What the listings left out because of their names (:mod:`controlplane.domain.ignored`) is kept
beside them, at most :data:`KEPT_IGNORED` per model and of the models (the first in name order),
so a store full of stray dirs cannot fill the memory: the answers show no more than that.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.domain.ignored import IgnoredName
from controlplane.domain.releases import ReleaseInfo

KEPT_IGNORED = 100


@dataclass(frozen=True)
class Listing:
    """One model's releases as last listed, or why its last listing failed, and the release
    dirs the listing left out because of their names."""

    releases: tuple[ReleaseInfo, ...]
    error: str | None = None  # the releases are from an earlier look, when there was one
    ignored: tuple[IgnoredName, ...] = ()


def kept(ignored: Sequence[IgnoredName]) -> tuple[IgnoredName, ...]:
    """What is kept of the entries a listing left out: the first :data:`KEPT_IGNORED` by name,
    in that order (a listing meets them in no particular order)."""
    return tuple(heapq.nsmallest(KEPT_IGNORED, ignored)) if ignored else ()


class StoreCatalog:
    def __init__(self) -> None:
        self._models: dict[str, Listing] = {}
        self.scanned: datetime | None = None  # when the last look (full, or what changed) ended
        self.full_scan: datetime | None = None  # when the last look at every model ended
        self.error: str | None = None  # why the last full look could not list the models
        self.version = 0  # moves whenever what the catalog holds changes (not its times)
        self.ignored_models: tuple[IgnoredName, ...] = ()  # as the last look at the models found

    def models(self) -> list[str]:
        return list(self._models)

    def get(self, model: str) -> Listing | None:
        return self._models.get(model)

    def listed(
        self,
        model: str,
        releases: Sequence[ReleaseInfo],
        ignored: tuple[IgnoredName, ...] = (),
    ) -> None:
        """``model``'s releases as just listed; ``ignored`` as :func:`kept` keeps them."""
        before = self._models.get(model)
        if (
            before is not None
            and before.error is None
            and before.releases == tuple(releases)
            and before.ignored == ignored
        ):
            return  # as it was: the same Listing, so readers can tell nothing changed
        self._models[model] = Listing(tuple(releases), ignored=ignored)
        self.version += 1

    def ignoring(self, models: tuple[IgnoredName, ...]) -> None:
        """The store's entries that a listing of the models left out (as :func:`kept` keeps
        them)."""
        if models != self.ignored_models:
            self.ignored_models = models
            self.version += 1

    def failing(self) -> set[str]:
        """The models whose last listing failed: looked at again on every beat."""
        return {name for name, listing in self._models.items() if listing.error is not None}

    def forget(self, model: str) -> None:
        """``model`` is no longer in the store."""
        if self._models.pop(model, None) is not None:
            self.version += 1

    def failed(self, model: str, error: str) -> None:
        """Listing ``model`` failed: keep what it held before, and say why it is stale."""
        before = self._models.get(model)
        if before is not None and before.error == error:
            return
        self._models[model] = (
            Listing(before.releases, error, before.ignored) if before else Listing((), error)
        )
        self.version += 1

    def finished(self, models: Iterable[str], at: datetime) -> None:
        """A look at every model ended: forget the models that are no longer in the store."""
        keep = set(models)
        for gone in [name for name in self._models if name not in keep]:
            del self._models[gone]
            self.version += 1
        self.scanned = self.full_scan = at
        self.set_error(None)

    def set_error(self, error: str | None) -> None:
        """Why the last full look could not list the models (None: it could)."""
        if error != self.error:
            self.error = error
            self.version += 1

    def looked(self, at: datetime) -> None:
        """A look at the models that changed ended (the others are as they were)."""
        self.scanned = at
