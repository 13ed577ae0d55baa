"""The revision of each release's ``SHA256SUMS`` in a local store, hashed only when it changed.

The watcher lists every release on every beat, and every member of a fleet does so. Hashing
every marker each time made a beat cost as much as the store is big (4,000 reads and hashes
for 200 models x 20 releases); here a marker is read and hashed again only when its stat
differs from the one it had when it was last hashed: device, inode, size, mtime or ctime (ns).
Otherwise the digest found then is the revision, and the :class:`ReleaseInfo` made then is
returned again (the same object, so comparing two listings is cheap).

What is seen as a change, and what is not:

* caught: a marker renamed over the old one (how a publisher should write it: a new inode),
  deleted and written again, grown or shrunk, rewritten in place later, or copied in with its
  old mtime kept (``cp -p``, ``rsync -t``: the ctime still moves, and no call sets it);
* a rewrite in place with the same size *within the same timestamp tick* as the read that
  hashed it would leave every field equal (filesystems stamp times from a coarse clock, and
  some keep whole seconds). So a digest is only remembered for a marker whose mtime and ctime
  were at least :data:`RACY_SECONDS` old when it was read (git's "racily clean" rule): a
  younger one is hashed again at every look, and any write after a remembered read stamps a
  time later than the remembered one, so its stat differs;
* not caught: a filesystem whose clock (an NFS server's) runs behind this host's by more than
  :data:`RACY_SECONDS`, a clock stepped back that far, or a filesystem that does not move
  mtime or ctime on a write (some FUSE mounts of object stores). There a same-size rewrite in
  place can go unseen until the marker's stat changes for another reason; publishing by
  rename, as docs/store.md says, is seen everywhere.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import BinaryIO

from controlplane.domain.checksums import MAX_MANIFEST_BYTES
from controlplane.domain.model_signing import MODEL_SIGNATURE_NAME
from controlplane.domain.releases import ReleaseInfo

RACY_SECONDS = 2.0  # FAT's granularity; above NTFS's, ext3's and HFS+'s, and most NFS skew
# st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns packed in 40 bytes: a tuple of five ints
# took 240 (one per release in the store).
_Signature = bytes
_PACKED = struct.Struct("<QQqqq")


@dataclass(frozen=True, slots=True)
class _Seen:
    signature: _Signature
    info: ReleaseInfo


_NOTHING: dict[str, _Seen] = {}


class MarkerRevisions:
    """Remembered revisions of the markers of one store, by (model, release).

    Safe to call from several threads (the watcher's, a status request's, a deploy's). The
    memory holds one entry per complete release listed; :meth:`keep_only` forgets releases
    that are gone.
    """

    def __init__(self, *, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._seen: dict[str, dict[str, _Seen]] = {}
        self.hashed = 0  # markers read and hashed so far: what the bench and tests count

    def info(self, model: str, release: str, marker: str) -> ReleaseInfo:
        """The release as its marker at path ``marker`` (its ``SHA256SUMS``) says now, and
        whether it is signed (``<marker>.sig`` or a ``model.sig`` beside it): one more lstat
        or two per complete release. A release without ``SHA256SUMS`` is complete when it has a
        ``model.sig`` (OpenSSF Model Signing), which is then its marker."""
        found = _regular(marker)
        prefix = ""
        bundle = os.path.join(os.path.dirname(marker), MODEL_SIGNATURE_NAME)
        if found is None:
            found = _regular(bundle)
            if found is None:
                return ReleaseInfo(model, release, complete=False)
            marker, prefix, signed = bundle, f"{MODEL_SIGNATURE_NAME}:", True
        else:
            signed = _is_file(marker + ".sig") or _is_file(bundle)
        # Read without the lock: a dict lookup is atomic, and entries are replaced, never edited.
        seen = self._seen.get(model, _NOTHING).get(release)
        if seen is not None and seen.signature == _signature(found):
            if seen.info.signed == signed:
                return seen.info
            info = replace(seen.info, signed=signed)
            with self._lock:
                self._seen.setdefault(model, {})[release] = _Seen(seen.signature, info)
            return info
        if found.st_size > MAX_MANIFEST_BYTES:  # not read: a deploy refuses it; still, it changed
            revision = f"oversized-{found.st_size}-{found.st_mtime_ns}"
            return ReleaseInfo(model, release, True, revision, signed)
        read = self._read(marker)
        if read is None:  # gone or replaced by something else between the two looks
            return ReleaseInfo(model, release, complete=False)
        read_stat, digest = read  # the stat of the file that was read, not of the lstat
        info = ReleaseInfo(model, release, True, revision=prefix + digest, signed=signed)
        youngest = max(read_stat.st_mtime_ns, read_stat.st_ctime_ns)
        if youngest <= (self._wall_clock() - RACY_SECONDS) * 1e9:
            with self._lock:
                self._seen.setdefault(model, {})[release] = _Seen(_signature(read_stat), info)
        return info

    def keep_only(self, model: str, releases: Iterable[str]) -> None:
        """Forget the remembered releases of ``model`` that are not in ``releases``."""
        keep = set(releases)
        with self._lock:
            seen = self._seen.get(model)
            if seen is None:
                return
            for name in [name for name in seen if name not in keep]:
                del seen[name]
            if not seen:
                del self._seen[model]

    def forget_models_except(self, models: Iterable[str]) -> None:
        """Forget every model not in ``models`` (gone from the store)."""
        keep = set(models)
        with self._lock:
            for name in [name for name in self._seen if name not in keep]:
                del self._seen[name]

    def _read(self, marker: str) -> tuple[os.stat_result, str] | None:
        """The marker's stat and digest, both from one open file (never a symlink)."""
        try:
            fd = os.open(marker, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        with os.fdopen(fd, "rb") as stream:
            found = os.fstat(stream.fileno())
            if not stat.S_ISREG(found.st_mode):
                return None
            data = read_at_most(stream, MAX_MANIFEST_BYTES)
        with self._lock:
            self.hashed += 1
        return found, hashlib.sha256(data).hexdigest()


def _regular(path: str) -> os.stat_result | None:
    try:
        found = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return found if stat.S_ISREG(found.st_mode) else None


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _signature(found: os.stat_result) -> _Signature:
    return _PACKED.pack(
        found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns
    )


# --- reading a small file, sized by the file ---------------------------------------------------


def read_at_most(stream: BinaryIO, limit: int) -> bytes:
    """The file's bytes, at most ``limit + 1`` of them (one more than allowed tells a file too
    big), whatever its size."""
    size = os.fstat(stream.fileno()).st_size
    data = stream.read(min(size, limit) + 1)
    if len(data) <= size or len(data) > limit:
        return data  # all of it (or already too much)
    return data + stream.read(limit + 1 - len(data))  # it grew since the stat: read on
