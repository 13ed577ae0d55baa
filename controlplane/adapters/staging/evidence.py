"""What the content cache knows of the store: the versions each entry was verified against.

A cache entry is named by the SHA256 ``SHA256SUMS`` lists, but ``SHA256SUMS`` says what a
file should hold, not what the store holds: a file edited after it was written keeps its
listed hash. A hit judged by the name alone served the cached (right) bytes on a host that had
them, while a host without them fetched the store's (wrong) bytes and refused the release. So
a hit needs evidence that the store's file holds the entry's bytes: a store version (an S3
ETag, the MD5 of the content for a single-part upload; a directory store's device, inode,
size and mtime) at which a fetch of that file was verified to hash to the entry's name.

Kept per entry in ``<cas>/.evidence/<sha256>``, one version a line, the most recent last, at
most :data:`MAX_VERSIONS`: it outlives a restart as the entries do (a cache that forgot it
would fetch every file again), and goes with its entry when that is evicted or deleted.
Callers hold the cache's lock.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

log = logging.getLogger(__name__)
EVIDENCE_DIR = ".evidence"
MAX_VERSIONS = 32  # versions kept per entry: one per release that re-uploaded the file
MAX_VERSION_CHARS = 256  # an S3 ETag is 34-40; a directory store's identity fewer


class Evidence:
    """The store versions each cache entry was verified against, on disk under ``root``."""

    def __init__(self, cache_root: Path) -> None:
        self.root = cache_root / EVIDENCE_DIR
        self._loaded: dict[str, list[str]] = {}

    def vouches(self, digest: str, version: str | None) -> bool:
        """Whether a fetch at ``version`` was verified to hold the bytes named ``digest``."""
        return version is not None and version in self._versions(digest)

    def add(self, digest: str, version: str | None) -> None:
        """Remember that the store's ``version`` holds the bytes named ``digest``."""
        if version is None or not _storable(version):
            return
        versions = self._versions(digest)
        if versions and versions[-1] == version:
            return
        older = [v for v in versions if v != version][-(MAX_VERSIONS - 1) :]
        kept = [*older, version]
        self._loaded[digest] = kept
        self._write(digest, kept)

    def forget(self, digest: str) -> None:
        """The entry is gone (evicted, deleted) or replaced: what was seen of it goes too."""
        self._loaded.pop(digest, None)
        (self.root / digest).unlink(missing_ok=True)

    def clean(self, digests: set[str]) -> None:
        """Delete the evidence of entries not in ``digests``, and temp files left over."""
        if not self.root.is_dir():
            return
        for path in self.root.iterdir():
            if path.name not in digests:
                path.unlink(missing_ok=True)
                self._loaded.pop(path.name, None)

    def _versions(self, digest: str) -> list[str]:
        if digest not in self._loaded:
            try:
                text = (self.root / digest).read_text(encoding="utf-8")
            except FileNotFoundError:
                text = ""
            except (OSError, UnicodeDecodeError) as exc:
                log.warning("cannot read %s (%s); the entry is fetched again", digest, exc)
                text = ""
            self._loaded[digest] = [v for v in text.splitlines() if _storable(v)]
        return self._loaded[digest]

    def _write(self, digest: str, versions: list[str]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{uuid.uuid4().hex}"
        try:
            tmp.write_text("".join(f"{v}\n" for v in versions), encoding="utf-8")
            os.replace(tmp, self.root / digest)
        except OSError as exc:  # a full disk: the file is fetched next time, no harm done
            tmp.unlink(missing_ok=True)
            log.warning("cannot record what the store holds for %s: %s", digest, exc)


def _storable(version: str) -> bool:
    return 0 < len(version) <= MAX_VERSION_CHARS and version.isprintable()
