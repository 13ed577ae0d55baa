"""The content-addressed cache of verified files: ``<staging>/cas/<sha256>``.

Large models often change a few files between releases. Every file that passed verification
is hardlinked here under its SHA256; the next release that lists the same hash in its
``SHA256SUMS`` gets a hardlink instead of a download. Hardlinks cost no space while a placed
release uses the file, which is also how eviction knows what is unused: a cache entry whose
link count is 1 is referenced by nothing else. The least recently linked of those go first
(linking updates an inode's ctime; mtimes are never touched, because Triton reads them to
decide whether a model changed).

Entries are made read-only: the inode is shared with the model dirs in the repository.

An entry is not trusted for its name alone, so that a release gets the same verdict on every
host whatever its cache holds. A release gets an entry only if:

- its size is the size the store lists for the file;
- the store vouches for it: the file's listed version (an S3 ETag, a directory store's
  device, inode, size and mtime) is one at which a fetch of it was verified to hash to the
  entry's name (:mod:`.evidence`), or the store confirms that the file holds those bytes
  (a directory store reads it). A publisher who edited a file after writing ``SHA256SUMS``,
  same size or not, gets the file fetched and refused (``checksum_mismatch``), as on a host
  whose cache lacks the hash. The same bytes under another key or in another dir still hit:
  an S3 ETag is the MD5 of the content (for a single-part upload; a multipart one's depends
  on the part size too), and a directory store's file is read;
- its bytes are its name's: it is hashed again before it is linked, unless this process made
  or hashed that very inode and its size and mtime are unchanged since (``_known``); after a
  restart, the first use of each entry hashes it once. An entry whose bytes do not match its
  name is deleted, with a warning, and the file is fetched from the store. A change that
  keeps the inode, its size and its mtime (a deliberate ``touch -r``) is not seen until the
  daemon restarts.

Operations verify releases in worker threads at the same time, so adding and evicting are
serialized by a lock: eviction also removes ``.tmp-`` leftovers, and it must never see a
link another thread has made and not yet renamed into place.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import stat
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from controlplane.domain.checksums import FileDigest, safe_relpath
from controlplane.domain.errors import Interrupted
from controlplane.ports import CachedFiles, StoredFile

log = logging.getLogger(__name__)
CACHE_DIR = "cas"
CHUNK = 1024 * 1024
_DIGEST = re.compile(r"[0-9a-f]{64}")

# What identifies the bytes this process hashed: (st_dev, st_ino, st_size, st_mtime_ns). Not
# ctime: every link and unlink of the inode changes it.
_Identity = tuple[int, int, int, int]


def _identity(info: os.stat_result) -> _Identity:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


class ContentCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._known: dict[str, _Identity] = {}  # digest -> the inode this process hashed
        self._evidence = Evidence(root)  # digest -> the store versions seen to hold it

    def link_into(
        self,
        dest: Path,
        manifest: Mapping[str, str] | None,
        listed: Mapping[str, StoredFile],
        *,
        confirm: Callable[[str, str, threading.Event], bool] | None = None,
        cancel: threading.Event | None = None,
    ) -> CachedFiles:
        """Hardlink into ``dest`` every manifest file the cache holds with the size ``listed``
        (path -> the store's listing of it) gives it and the bytes its name says, for which
        the store vouches: a listed version seen to hold those bytes, or ``confirm(path,
        sha256, cancel)``."""
        linked: dict[str, FileDigest] = {}
        refused: list[str] = []
        if manifest is None or self.max_bytes == 0:
            return CachedFiles(linked)
        stop = cancel or threading.Event()
        for rel, digest in manifest.items():
            if stop.is_set():
                raise Interrupted("linking from the content cache was cancelled")
            stored = listed.get(rel)
            if stored is None or not _DIGEST.fullmatch(digest):
                continue  # not in the listing: the plan already refused it
            size = stored.size
            entry = self.root / digest
            try:
                # O_NONBLOCK: a FIFO put in the cache's place must not hang the open.
                fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                self._drop(entry, None, f"{entry} is a symlink, not a cached file")
                refused.append(rel)
                continue
            try:
                identity = self._check(fd, entry, digest, size, stop)
            finally:
                os.close(fd)
            if identity is None or not self._vouched(rel, digest, stored, confirm, stop):
                refused.append(rel)
                continue
            if self._link(entry, dest / safe_relpath(rel), identity):
                linked[rel] = FileDigest(size=size, sha256=digest)
        return CachedFiles(linked, tuple(refused))

    def _check(
        self, fd: int, entry: Path, digest: str, size: int, stop: threading.Event
    ) -> _Identity | None:
        """The identity of the entry open as ``fd`` if it may be linked for a file listed with
        ``size``; None (and a damaged entry deleted) if not."""
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            log.warning("content cache entry %s is not a regular file; not using it", entry)
            return None
        if info.st_size != size:
            # The store's file is not the one the manifest names (or the entry is damaged:
            # then the verified download replaces it, see add()). Fetch it and let
            # verification judge.
            log.info(
                "content cache entry %s is %d bytes but the store lists %d; fetching the file",
                digest,
                info.st_size,
                size,
            )
            return None
        identity = _identity(info)
        with self._lock:
            if self._known.get(digest) == identity:
                return identity
        actual = _hash(fd, stop)
        if actual != digest:
            self._drop(entry, info, f"content cache entry {entry} holds bytes hashing to {actual}")
            return None
        with self._lock:
            self._known[digest] = identity
        return identity

    def _vouched(
        self,
        rel: str,
        digest: str,
        stored: StoredFile,
        confirm: Callable[[str, str, threading.Event], bool] | None,
        stop: threading.Event,
    ) -> bool:
        """Whether the store's file ``rel`` is known (or confirmed) to hold ``digest``'s bytes."""
        with self._lock:
            if self._evidence.vouches(digest, stored.version):
                return True
        if confirm is None or not confirm(rel, digest, stop):
            log.info(
                "content cache entry %s is not used for %s: the store's file (version %s) was "
                "never seen to hold those bytes; fetching it",
                digest,
                rel,
                stored.version,
            )
            return False
        with self._lock:
            self._evidence.add(digest, stored.version)
        return True

    def _link(self, entry: Path, target: Path, identity: _Identity) -> bool:
        """Hardlink ``entry`` to ``target``, insisting it is still the inode that was checked."""
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(entry, target, follow_symlinks=False)
        except FileNotFoundError:  # evicted meanwhile: fetch it instead
            return False
        if _identity(target.stat()) != identity:  # replaced or written since it was hashed
            target.unlink()
            return False
        return True

    def _drop(self, entry: Path, checked: os.stat_result | None, why: str) -> None:
        """Delete a damaged entry, unless another thread has put a new one in its place."""
        with self._lock:
            try:
                now = entry.lstat()
            except FileNotFoundError:
                return
            if checked is not None and (now.st_dev, now.st_ino) != (
                checked.st_dev,
                checked.st_ino,
            ):
                return
            log.warning("%s; deleted it, the file is fetched from the store instead", why)
            entry.unlink(missing_ok=True)
            self._known.pop(entry.name, None)
            self._evidence.forget(entry.name)

    def add(
        self,
        root: Path,
        files: Mapping[str, FileDigest],
        listed: Mapping[str, StoredFile] | None = None,
    ) -> None:
        """Remember verified files, and the store versions (``listed``) they were fetched at,
        then evict unused entries down to the bound.

        An entry of another size than the verified file is damaged (a hash names one content,
        so one size): the verified file replaces it."""
        if self.max_bytes == 0:
            return
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            for rel, digest in files.items():
                entry = self.root / digest.sha256
                if digest.size > self.max_bytes:
                    continue
                stored = (listed or {}).get(rel)
                version = None if stored is None else stored.version
                try:
                    if entry.lstat().st_size == digest.size:
                        self._evidence.add(digest.sha256, version)
                        continue
                    self._evidence.forget(digest.sha256)  # what was seen of the damaged one
                except FileNotFoundError:
                    pass
                source = root / safe_relpath(rel)
                tmp = self.root / f".tmp-{uuid.uuid4().hex}"
                os.link(source, tmp)
                os.chmod(tmp, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
                # Hashed as it was fetched, by this process: trusted without a second read.
                self._known[digest.sha256] = _identity(tmp.stat())
                tmp.replace(entry)
                self._evidence.add(digest.sha256, version)
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
            self._known.pop(entry.name, None)
            total -= size
            evicted.append(entry.name)
        self._evidence.clean({e.name for *_, e in entries} - set(evicted))
        if evicted:
            log.info("content cache evicted %d file(s), %d bytes remain", len(evicted), total)
        return evicted

    def size(self) -> int:
        if not self.root.is_dir():
            return 0
        return sum(e.stat().st_size for e in self.root.iterdir() if _DIGEST.fullmatch(e.name))


def _hash(fd: int, stop: threading.Event) -> str:
    """SHA256 of the file open as ``fd``, read from its start (the file offset is not used)."""
    digest = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        if stop.is_set():
            raise Interrupted("linking from the content cache was cancelled")
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


# --- evidence: the store versions a cached file was verified at --------------------------------


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
