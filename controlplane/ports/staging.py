"""The seam of staging and the model repository: temp dirs, the content cache, verification,
and the one atomic step that places a release where Triton reads it.

Nothing half-written is ever in the repository: a release is staged beside it, verified, and
placed by one rename (:meth:`Staging.place`), which :meth:`Staging.restore` undoes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from controlplane.domain.checksums import FileDigest
from controlplane.ports.store import ReleaseListing


@dataclass(frozen=True)
class ReleaseMarker:
    """Written into every dir the daemon places, so the repository says what it holds."""

    model: str
    release: str
    operation_id: str
    revision: str | None = None  # the store's revision of the release (SHA256SUMS digest, ETag)
    # Its files changed since it was placed (edited by hand): it no longer holds the release.
    edited: bool = False


@dataclass(frozen=True)
class CachedFiles:
    """What the content cache gave a release before its fetch."""

    linked: Mapping[str, FileDigest]  # path -> digest: hardlinked, the fetch skips them
    # Paths whose hash the cache held but did not give: the entry's size is not the one the
    # store lists, its bytes do not match its name (it was deleted), or the store does not
    # vouch that the file holds those bytes (a version the cache has not seen, unconfirmed).
    # They are fetched.
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """The result of placing a staged dir: where the replaced dir went, if there was one."""

    model: str
    target: Path
    replaced: Path | None


class Staging(Protocol):
    """Temp dirs beside the repository, verification, and atomic placement into it."""

    def create(self, operation_id: str) -> Path:
        """A fresh, empty staging dir for one operation; the release goes in ``<it>/model``."""
        ...

    def free_bytes(self) -> int:
        """Bytes this process may still write on the staging filesystem."""
        ...

    def link_cached(
        self,
        dest: Path,
        manifest: Mapping[str, str] | None,
        listing: ReleaseListing,
        *,
        confirm: Callable[[str, str, threading.Event], bool] | None = None,
        cancel: threading.Event | None = None,
    ) -> CachedFiles:
        """Create ``dest`` and hardlink into it every manifest file the content cache holds
        with the size ``listing`` gives it, and for which the store vouches: the file's listed
        version is one the cache has seen hold the entry's bytes (:meth:`remember`), or
        ``confirm(path, sha256, cancel)`` says it holds them (:meth:`ModelStore.confirm`). An
        entry this process has not hashed as it is now (inode, size, mtime) is hashed first;
        one that does not match its name is deleted. Once ``cancel`` is set,
        :class:`Interrupted`."""
        ...

    def remember(
        self, root: Path, files: Mapping[str, FileDigest], listing: ReleaseListing
    ) -> None:
        """Add verified files to the content cache (hardlinks), with the store versions of
        ``listing`` they were fetched at, then evict to the bound."""
        ...

    def verify(
        self,
        root: Path,
        manifest: Mapping[str, str] | None,
        files: Mapping[str, FileDigest],
        *,
        named: str = "SHA256SUMS",
    ) -> None:
        """Refuse symlinks, special files and anything the manifest (as refusals name it:
        ``SHA256SUMS`` or ``model.sig``) does not match."""
        ...

    def finalize(self, root: Path, marker: ReleaseMarker) -> None:
        """Byte-compile Python sources, write the marker, fsync everything."""
        ...

    def place(self, staged: Path, name: str, *, owner: str) -> Placement:
        """Make ``staged`` the repository's ``name`` dir in one atomic step.

        A dir already there must have been placed for model ``owner`` (its marker says so);
        anything else is :class:`NameConflict` and nothing moves."""
        ...

    def restore(self, placement: Placement) -> None:
        """Undo :meth:`place`: the repository holds exactly what it held before."""
        ...

    def discard(self, placement: Placement) -> None:
        """Delete the dir that :meth:`place` replaced, once the new one serves."""
        ...

    def remove(self, model: str) -> bool:
        """Take ``model``'s dir out of the repository atomically, then delete it."""
        ...

    def read_marker(self, name: str) -> ReleaseMarker | None: ...

    def placed(self) -> dict[str, ReleaseMarker]:
        """Every dir in the repository that holds a placed release, by name."""
        ...

    def ensure_alias_dir(self, model: str) -> None:
        """Make ``<repository>/<model>/1/``, the home of the alias ensemble, if missing."""
        ...

    def is_alias_dir(self, model: str) -> bool: ...

    def release_dir(self, operation_dir: Path) -> Path: ...

    def cleanup(self, operation_id: str) -> None: ...

    def clean_all(self) -> list[str]:
        """Delete every leftover staging dir (start-up); return what was removed."""
        ...


class ModelConfigEditor(Protocol):
    """Reads and rewrites ``config.pbtxt`` with Triton's own schema."""

    def prepare(self, config_path: Path, name: str) -> ModelSummary: ...


@dataclass(frozen=True)
class ModelSummary:
    name: str
    backend: str
    decoupled: bool = False
    sequence_batching: bool = False
    instance_kinds: tuple[str, ...] = ()
    memory_hint: int | None = None  # bytes the release says its load needs
    instances: int = 1  # instances the config asks for (a lower bound: KIND_GPU is per GPU)

    @property
    def may_use_gpu(self) -> bool:
        """KIND_GPU, or KIND_AUTO (Triton's default: a GPU when there is one)."""
        return not self.instance_kinds or any(k != "KIND_CPU" for k in self.instance_kinds)
