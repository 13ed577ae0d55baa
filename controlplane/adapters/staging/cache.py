"""The content-addressed cache of verified files: ``<staging>/cas/<sha256>``.

Large models often change a few files between releases. Every file that passed verification
is hardlinked here under its SHA256; the next release that lists the same hash in its
``SHA256SUMS`` gets a hardlink instead of a download. Hardlinks cost no space while a placed
release uses the file, which is also how eviction knows what is unused: a cache entry whose
link count is 1 is referenced by nothing else. The least recently linked of those go first
(linking updates an inode's ctime; mtimes are never touched, because Triton reads them to
decide whether a model changed).

Entries are made read-only: the inode is shared with the model dirs in the repository.

Operations verify releases in worker threads at the same time, so adding and evicting are
serialized by a lock: eviction also removes ``.tmp-`` leftovers, and it must never see a
link another thread has made and not yet renamed into place.
"""

from __future__ import annotations

import logging
import os
import re
import stat
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

from controlplane.domain.checksums import FileDigest, safe_relpath

log = logging.getLogger(__name__)
CACHE_DIR = "cas"
_DIGEST = re.compile(r"[0-9a-f]{64}")


class ContentCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()

    def link_into(self, dest: Path, manifest: Mapping[str, str] | None) -> dict[str, FileDigest]:
        """Hardlink every manifest file the cache holds into ``dest``; return what was linked."""
        linked: dict[str, FileDigest] = {}
        if manifest is None or self.max_bytes == 0:
            return linked
        for rel, digest in manifest.items():
            entry = self.root / digest
            try:
                size = entry.stat().st_size
            except FileNotFoundError:
                continue
            target = dest / safe_relpath(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(entry, target)
            except FileNotFoundError:  # evicted meanwhile: fetch it instead
                continue
            linked[rel] = FileDigest(size=size, sha256=digest)
        return linked

    def add(self, root: Path, files: Mapping[str, FileDigest]) -> None:
        """Remember verified files, then evict unused entries down to the bound."""
        if self.max_bytes == 0:
            return
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            for rel, digest in files.items():
                entry = self.root / digest.sha256
                if entry.exists() or digest.size > self.max_bytes:
                    continue
                source = root / safe_relpath(rel)
                tmp = self.root / f".tmp-{uuid.uuid4().hex}"
                os.link(source, tmp)
                os.chmod(tmp, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
                tmp.replace(entry)
            self._evict()

    def evict(self) -> list[str]:
        """Delete unused entries, least recently linked first, until under the bound."""
        with self._lock:
            return self._evict()

    def _evict(self) -> list[str]:
        entries = []
        total = 0
        if not self.root.is_dir():
            return []
        for entry in self.root.iterdir():
            if entry.name.startswith(".tmp-"):
                entry.unlink(missing_ok=True)
                continue
            if not _DIGEST.fullmatch(entry.name):
                continue
            info = entry.stat()
            total += info.st_size
            entries.append((info.st_ctime_ns, info.st_nlink, info.st_size, entry))
        evicted = []
        for _ctime, links, size, entry in sorted(entries):
            if total <= self.max_bytes:
                break
            if links > 1:
                continue  # a placed release (or a staging dir) still uses it
            entry.unlink(missing_ok=True)
            total -= size
            evicted.append(entry.name)
        if evicted:
            log.info("content cache evicted %d file(s), %d bytes remain", len(evicted), total)
        return evicted

    def size(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(e.stat().st_size for e in self.root.iterdir() if _DIGEST.fullmatch(e.name))
