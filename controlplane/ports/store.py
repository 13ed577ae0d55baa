"""The model store's seam: where releases come from, what a fetch writes, and what changed.

A store lists a release (:class:`ReleaseListing`: every file with its size and the store's
version of it) before anything is fetched, and a fetch writes exactly that listing and no more.
Its change events (:class:`ChangeEvents`) and the publisher keys that sign its releases
(:class:`SignatureVerifier`) are read beside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from controlplane.domain.checksums import FileDigest
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.releases import ReleaseInfo


@dataclass(frozen=True)
class FetchProgress:
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


@dataclass(frozen=True)
class StoredFile:
    """One file of a release as the store lists it, before anything is fetched."""

    size: int  # the listed size (apparent size for a sparse file): what a fetch writes
    # The store's version of it: an S3 ETag, a directory store's device, inode, size and
    # mtime. A fetch insists on it, and the content cache gives a file only for a version it
    # has seen hold the entry's bytes (or that the store confirms: ModelStore.confirm).
    version: str | None = None


@dataclass(frozen=True)
class ReleaseListing:
    """A release's files (path below the release dir -> :class:`StoredFile`), paths checked,
    ``SHA256SUMS`` included when the release has one. What a fetch may write, and no more."""

    model: str
    release: str
    files: Mapping[str, StoredFile]

    @property
    def sizes(self) -> dict[str, int]:
        return {rel: stored.size for rel, stored in self.files.items()}

    def only(self, rels: Collection[str]) -> ReleaseListing:
        """The same listing restricted to ``rels``."""
        return replace(self, files={r: f for r, f in self.files.items() if r in rels})


@dataclass(frozen=True)
class FetchedRelease:
    """What a store wrote into a staging dir, hashed while it was written."""

    manifest: Mapping[str, str] | None  # the SHA256SUMS it wrote, parsed; None without one
    files: Mapping[str, FileDigest]
    bytes_total: int  # bytes of the whole release
    bytes_fetched: int = 0  # bytes actually transferred (the rest came from the cache)
    refetched: int = 0  # fetches repeated because a file's digest did not match SHA256SUMS
    retries: int = 0  # requests tried again after a transient fault (throttling, 5xx, ...)


@dataclass(frozen=True)
class MarkerFiles:
    """The raw bytes of a release's ``SHA256SUMS`` and ``SHA256SUMS.sig``, each None when the
    release has none. A signature is checked over exactly these bytes, and the manifest a
    deploy fetches by is parsed from them: what was verified is what is used."""

    manifest: bytes | None
    signature: bytes | None


class ModelStore(Protocol):
    """Where releases come from: ``<store>/<model>/<release>/``."""

    @property
    def uri(self) -> str: ...

    def close(self) -> None:
        """Release connections and stop retries in flight (a no-op for stores without)."""
        ...

    def list_models(self, *, ignored: Callable[[IgnoredName], None] | None = None) -> list[str]:
        """The models in the store, in natural order. Each entry left out because its name is
        no model's (and may be a misnamed one: :mod:`controlplane.domain.ignored`) is passed to
        ``ignored``, when given, as the listing meets it."""
        ...

    def list_releases(
        self, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
    ) -> list[ReleaseInfo]:
        """Every release of ``model``, complete or not, in natural order; each dir (or key
        prefix) left out because its name is no release's is passed to ``ignored``."""
        ...

    def list_store(
        self, *, ignored: Callable[[str | None, IgnoredName], None] | None = None
    ) -> dict[str, list[ReleaseInfo]]:
        """Every model in the store with its releases, models in natural order: what
        :meth:`list_models` and then :meth:`list_releases` of each model say, as cheaply as
        the store can say it (S3: one paginated listing of the whole store, not one per
        model). A model gone between the two looks is left out (it is not in the store),
        never :class:`ModelNotFound`; an empty store is ``{}``. Each entry left out for its
        name is passed to ``ignored`` with the model it is under (None: the store's top)."""
        ...

    def describe(self, model: str, release: str, *, patient: bool = False) -> ReleaseInfo:
        """The release, or :class:`ReleaseNotFound`. A store that does not answer is tried
        again for a few seconds, then :class:`StoreUnavailable`; ``patient`` (a caller that
        waits for the operation anyway) tries as long as a fetch does (``retry_seconds``)."""
        ...

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        """The bytes of ``SHA256SUMS`` (at most its bound: a larger one is
        :class:`UnsafeRelease`) and of ``SHA256SUMS.sig`` (at most one byte past its bound, so
        a verifier can tell it is too long), each read once."""
        ...

    def list_files(self, model: str, release: str) -> ReleaseListing:
        """Every file of the release with its size, nothing fetched: :class:`ReleaseNotFound`
        when it is gone, :class:`UnsafeRelease` for symlinks, special files or unsafe paths."""
        ...

    def confirm(
        self,
        listing: ReleaseListing,
        rel: str,
        sha256: str,
        cancel: threading.Event | None = None,
    ) -> bool:
        """Whether the store's file ``rel`` of ``listing``, at its listed version, holds bytes
        that hash to ``sha256``, when the store can tell without a fetch: a directory store
        reads the file; an S3 store cannot (a read is a download) and says False. Once
        ``cancel`` is set, :class:`Interrupted`."""
        ...

    def fetch(
        self,
        listing: ReleaseListing,
        dest: Path,
        *,
        manifest: Mapping[str, str] | None,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> FetchedRelease:
        """Write the files of ``listing`` (and nothing else) under the existing dir ``dest``.

        Each file is hashed while it is written. One whose digest differs from ``manifest`` is
        fetched again; the same wrong digest twice is returned as it is (verification then
        calls it ``checksum_mismatch``), a different one every time is :class:`StoreUnavailable`.
        A file fetched in parts is judged part by part: only the parts whose fetches disagree
        are fetched again, until two fetches of each agree, for as long as a transient fault
        is retried; then it holds the store's bytes, right or wrong.
        Files named in ``have`` are already there (linked from the content cache with the
        digest the manifest lists): they are not fetched again, and are returned as they are.
        Once ``cancel`` is set, the fetch stops at its next chunk or backoff, deletes what it
        was writing and raises :class:`Interrupted`.
        """
        ...


@dataclass(frozen=True)
class StoreChanges:
    """What a store's change events said since the watcher last asked.

    ``models``: the models whose dirs had an event. ``complete``: events were watched the whole
    time since the last ask, so no other model changed, as far as events can tell (a kernel
    may still drop some, hence the full scans on a slower beat). Not complete: list them all.
    ``others``: an entry at the store's top that is no model's changed (a misnamed model dir
    may have appeared or gone): list the models once to see it.
    """

    models: frozenset[str] = frozenset()
    complete: bool = False
    others: bool = False


class SignatureVerifier(Protocol):
    """The keyring of publisher keys (:mod:`controlplane.adapters.keyring`)."""

    def verify_release(self, model: str, release: str, manifest: bytes, signature: bytes) -> str:
        """The name of the trusted key whose ``signature`` is over ``release`` of ``model``
        with these ``SHA256SUMS`` bytes (:func:`~controlplane.domain.signatures.statement`),
        or :class:`SignatureInvalid`, :class:`SignatureUnbound` or :class:`UnknownSigner`
        saying why there is none."""
        ...


class ChangeEvents(Protocol):
    """A store's change notifications (a local store's inotify, an S3 bucket's events through
    SQS), read by the release watcher."""

    def take(self) -> StoreChanges:
        """What changed since the last call; forgotten once returned. Called in the event
        loop."""
        ...

    def handled(self, models: frozenset[str]) -> None:
        """The watcher has listed ``models`` (and acted on what it found: recorded new
        releases, claimed or started their auto-deploys) since the last :meth:`take`: what
        named them is done with. A source whose events can be redelivered (SQS) drops them
        only now, so a daemon that dies before this hears them again. Called in the event
        loop, after each scan that did not fail as a whole."""
        ...
