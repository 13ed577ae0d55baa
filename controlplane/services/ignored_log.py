"""The log's word about each store entry a listing left out because of its name: once per run.

The watcher lists the store on every beat; a warning per beat about the same misnamed dir
would bury everything else in the log, and none at all left a publisher's typo unexplained
(``m/r 5`` simply never appeared). So each entry is warned about the first time a listing
leaves it out, by where it is (its path or key) and the rule its name breaks, and not again
while the daemon runs. The API answers say it on every call (``ignored_releases``,
``ignored_models``).

What is remembered is bounded (:data:`MAX_LOGGED` entries): past it, one last warning says that
the others are shown by the API and not logged one by one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from controlplane.domain.ignored import IgnoredName

log = logging.getLogger(__name__)
MAX_LOGGED = 10_000


class IgnoredNamesLog:
    """Warns about each ignored entry once. Used from the event loop only."""

    def __init__(self, limit: int = MAX_LOGGED) -> None:
        self._limit = limit
        self._logged: set[str] = set()
        self._full = False

    def report(self, ignored: Iterable[IgnoredName], *, model: str | None = None) -> None:
        """Warn about each entry of ``ignored`` not warned about yet: dirs (or key prefixes)
        under ``model`` whose names are no release's, or (``model`` None) at the store's top
        whose names are no model's."""
        for entry in ignored:
            if entry.where in self._logged or self._full:
                continue
            if len(self._logged) >= self._limit:
                self._full = True
                log.warning(
                    "more than %d entries of the store are ignored for their names; the others "
                    "are not logged one by one: GET /v1/models and GET /v1/models/{name} list "
                    "them (ignored_models, ignored_releases)",
                    self._limit,
                )
                continue
            self._logged.add(entry.where)
            if model is None:
                log.warning(
                    "ignoring %s in the store: %s; rename it to be seen as a model (the naming "
                    "rules are in docs/store.md); this is logged once",
                    entry.where,
                    entry.reason,
                    extra={"ignored": entry.name},
                )
            else:
                log.warning(
                    "ignoring %s in the store: %s; rename it to be seen as a release of %s (the "
                    "naming rules are in docs/store.md); this is logged once",
                    entry.where,
                    entry.reason,
                    model,
                    extra={"model": model, "ignored": entry.name},
                )
