"""The fleet's records in a directory store: ``<store>/_controlplane/{desired,members}/``.

A write goes to a temp file beside its target, is fsynced, and renamed over it (atomic inside
one directory, also on NFS), so a reader sees a whole record. The compare-and-swap of a
desired state holds a lock file per model (``<model>.lock``, a POSIX record lock, which NFSv4
and the lock daemon of NFSv3 honour across hosts) while it reads the generation and renames
the new record in; a thread lock per lock file covers the threads of one process, which POSIX
locks do not tell apart (and closing any descriptor of the file drops the process's lock), so it
is one per file in the process, shared by every :class:`LocalDesiredStates` on that store. A
lock not had within :data:`LOCK_WAIT` seconds is ``store_unavailable``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from controlplane.adapters.stores.fleet_records import (
    DESIRED_DIR,
    MAX_RECORD_BYTES,
    MEMBERS_DIR,
    SUFFIX,
    conflict,
    decode_beat,
    decode_desired,
    encode_beat,
    encode_desired,
    read_desired,
    require_named,
    utc_now,
)
from controlplane.adapters.stores.local import missing_store
from controlplane.adapters.stores.markers import read_at_most
from controlplane.domain.errors import ControlPlaneError, StoreError, StoreUnavailable
from controlplane.domain.fleet import RESERVED_PREFIX, DesiredModel, MemberBeat
from controlplane.domain.names import validate_member_name, validate_model_name
from controlplane.domain.refusals import Refusal

LOCK_WAIT = 10.0
LOCK_POLL = 0.01
_THREAD_LOCKS: dict[str, threading.Lock] = {}  # lock file (real path) -> its lock in this process
_THREAD_LOCKS_GUARD = threading.Lock()


class LocalDesiredStates:
    """``clock``: the reader's time (the daemon's clock), on which heartbeats are said to
    have landed (:attr:`MemberBeat.landed`, from each file's mtime)."""

    def __init__(self, root: Path, *, clock: Callable[[], datetime] = utc_now) -> None:
        self._root = root
        self._desired = root / DESIRED_DIR
        self._members = root / MEMBERS_DIR
        self._bad_beats: dict[str, Refusal] = {}  # the member records the last listing refused
        # path -> (inode, size, mtime), and the record there or why it is refused
        self._seen: dict[Path, tuple[tuple[int, int, int], DesiredModel | Refusal | None]] = {}
        self._clock = clock
        # How far the store's clock (its files' mtimes: this kernel's, or a file server's) is
        # behind this reader's; measured at each write of this member's own heartbeat.
        self._offset: timedelta | None = None

    @property
    def where(self) -> str:
        return (self._root / DESIRED_DIR).parent.as_uri()

    def read(self, model: str, *, patient: bool = False) -> DesiredModel | None:
        # A directory answers at once or not at all: nothing to wait for, patient or not.
        self._require_root()
        path = self._desired / f"{validate_model_name(model)}{SUFFIX}"
        data = _read(path)
        if data is None:
            return None
        desired = decode_desired(data, str(path))
        require_named(desired, model, str(path))
        return desired

    def read_all(self, named: Collection[str] = ()) -> dict[str, DesiredModel]:
        """Every record (``named`` changes nothing: every record is looked at); a file is read
        again only when its inode, size or mtime changed (every write renames a new file in,
        so a change is a new inode): every member reads every poll interval, so an idle fleet
        costs one stat per model."""
        self._require_root()
        found: dict[str, DesiredModel] = {}
        seen: dict[Path, tuple[tuple[int, int, int], DesiredModel | Refusal | None]] = {}
        for path in _records(self._desired):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _translated(exc, path) from None
            key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            cached = self._seen.get(path)
            desired = cached[1] if cached is not None and cached[0] == key else self._decode(path)
            seen[path] = (key, desired)
            if isinstance(desired, DesiredModel):
                found[desired.model] = desired
        self._seen = seen  # one assignment: a concurrent reader sees the old or the new
        return found

    def unreadable(self) -> dict[str, Refusal]:
        desired = {
            str(path): why for path, (_, why) in self._seen.items() if isinstance(why, Refusal)
        }
        return {**desired, **self._bad_beats}

    def _decode(self, path: Path) -> DesiredModel | Refusal | None:
        """The record in ``path``, or why it is not a readable record of its name; None when
        it is gone."""
        data = _read(path)
        return None if data is None else read_desired(data, str(path), path.name)

    def swap(self, desired: DesiredModel) -> None:
        self._require_root()
        model = validate_model_name(desired.model)
        path = self._desired / f"{model}{SUFFIX}"
        with self._locked(model):
            data = _read(path)
            current = None if data is None else decode_desired(data, str(path))
            if current is not None:
                require_named(current, model, str(path))
            if (current.generation if current else 0) != desired.generation - 1:
                raise conflict(desired, current, str(path))
            _write(path, encode_desired(desired))

    def beat(self, beat: MemberBeat) -> None:
        self._require_root()
        path = self._members / f"{validate_member_name(beat.member)}{SUFFIX}"
        _write(path, encode_beat(beat))
        with contextlib.suppress(OSError):  # measured at the next write, or by a probe
            self._offset = self._clock() - _mtime(path.stat().st_mtime_ns)

    def beats(self) -> dict[str, MemberBeat]:
        found: dict[str, MemberBeat] = {}
        bad: dict[str, Refusal] = {}
        for path in _records(self._members):
            beat = self._read_beat(path)
            if isinstance(beat, MemberBeat):
                found[beat.member] = beat
            elif beat is not None:
                bad[str(path)] = beat
        self._bad_beats = bad  # one assignment, as for the desired states
        return found

    def beat_of(self, member: str) -> MemberBeat | None:
        beat = self._read_beat(self._members / f"{validate_member_name(member)}{SUFFIX}")
        return beat if isinstance(beat, MemberBeat) else None

    def _read_beat(self, path: Path) -> MemberBeat | Refusal | None:
        """The heartbeat in ``path``, landed when its file was last written (the mtime of
        the file that was read, on this reader's clock); why it is not one; None: gone."""
        try:
            with path.open("rb") as stream:
                written = os.fstat(stream.fileno()).st_mtime_ns
                data = read_at_most(stream, MAX_RECORD_BYTES)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _translated(exc, path) from None
        beat = decode_beat(data, str(path), path.name)
        if not isinstance(beat, MemberBeat):
            return beat
        return replace(beat, landed=_mtime(written) + self._store_offset())

    def _store_offset(self) -> timedelta:
        """How far the store's clock is behind this reader's: from this member's last beat,
        else from a file written to ask (a member reads the fleet before its first beat)."""
        if self._offset is None:
            probe = self._root / RESERVED_PREFIX / f".clock-{uuid.uuid4().hex}"
            with _mapped(probe):
                probe.parent.mkdir(parents=True, exist_ok=True)
                try:
                    probe.write_bytes(b"")
                    self._offset = self._clock() - _mtime(probe.stat().st_mtime_ns)
                finally:
                    probe.unlink(missing_ok=True)
        return self._offset

    def forget(self, member: str) -> None:
        path = self._members / f"{validate_member_name(member)}{SUFFIX}"
        with _mapped(path):
            path.unlink(missing_ok=True)

    def _require_root(self) -> None:
        """The store itself must be there: a share that is not mounted (or a link that points
        nowhere) is an unreachable store, never an empty fleet, and nothing is created in its
        place (it would be written onto the disk under the mount point)."""
        if not self._root.is_dir():
            raise missing_store(self._root)

    @contextlib.contextmanager
    def _locked(self, model: str) -> Iterator[None]:
        path = self._desired / f"{model}.lock"
        with _THREAD_LOCKS_GUARD:
            thread_lock = _THREAD_LOCKS.setdefault(os.path.realpath(path), threading.Lock())
        if not thread_lock.acquire(timeout=LOCK_WAIT):
            raise StoreUnavailable(
                f"the desired state of {model} stayed locked for {LOCK_WAIT:g} s"
            )
        try:
            with _mapped(path):
                self._desired.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                deadline = time.monotonic() + LOCK_WAIT
                while True:
                    try:
                        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as exc:
                        if exc.errno not in (errno.EACCES, errno.EAGAIN):
                            raise StoreError(f"cannot lock {path}: {exc}") from None
                        if time.monotonic() > deadline:
                            raise StoreUnavailable(
                                f"{path} stayed locked for {LOCK_WAIT:g} s (another member "
                                "is writing, or one died holding it on a filesystem that "
                                "does not release dead holders' locks)"
                            ) from None
                        time.sleep(LOCK_POLL)
                yield
            finally:
                os.close(fd)  # releases the lock
        finally:
            thread_lock.release()


def _records(directory: Path) -> list[Path]:
    try:
        return sorted(
            p for p in directory.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith(".")
        )
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _translated(exc, directory) from None


def _mtime(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


def _read(path: Path) -> bytes | None:
    try:
        with path.open("rb") as stream:
            return read_at_most(stream, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _translated(exc, path) from None


def _write(path: Path, data: bytes) -> None:
    """Temp file, fsync, rename over ``path``, fsync the dir: all of it or none of it."""
    with _mapped(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(name, 0o644)
            os.replace(name, path)
        except BaseException:
            Path(name).unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise _translated(exc, path) from None


def _translated(exc: OSError, path: Path) -> ControlPlaneError:
    # Refusals a retry cannot cure: no permission, a read-only mount, and a regular file where
    # the store's directories should be (ENOTDIR on the way down, EEXIST from mkdir).
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST):
        return StoreError(
            f"cannot use the fleet's records at {path} ({exc.strerror}): the store must be a "
            "directory writable by every member (its desired state and heartbeats live under "
            "_controlplane/)",
            details={"path": str(path)},
        )
    return StoreUnavailable(f"{path}: {exc.strerror or exc}")
