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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from controlplane.domain.releases import ReleaseInfo


@dataclass(frozen=True)
class Listing:
    """One model's releases as last listed, or why its last listing failed."""

    releases: tuple[ReleaseInfo, ...]
    error: str | None = None  # the releases are from an earlier look, when there was one


class StoreCatalog:
    def __init__(self) -> None:
        self._models: dict[str, Listing] = {}
        self.scanned: datetime | None = None  # when the last look (full, or what changed) ended
        self.full_scan: datetime | None = None  # when the last look at every model ended
        self.error: str | None = None  # why the last full look could not list the models
        self.version = 0  # moves whenever what the catalog holds changes (not its times)

    def models(self) -> list[str]:
        return list(self._models)

    def get(self, model: str) -> Listing | None:
        return self._models.get(model)

    def listed(self, model: str, releases: Sequence[ReleaseInfo]) -> None:
        before = self._models.get(model)
        if before is not None and before.error is None and before.releases == tuple(releases):
            return  # as it was: the same Listing, so readers can tell nothing changed
        self._models[model] = Listing(tuple(releases))
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
        self._models[model] = Listing(before.releases if before else (), error)
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
