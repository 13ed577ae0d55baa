"""One daemon per state: exclusive locks on the repository, staging dir and database it manages.

Two daemons on one repository or one database undo each other's work: the second one's
start-up reconcile takes the first one's running deploy for a crashed one, marks it
interrupted, unloads its slot and empties staging under it. So ``controlplane serve`` takes an
exclusive, non-blocking ``flock(2)`` on one lock file per place before anything reads or writes
that state, and holds it for the life of the process:

- ``<repository>/.controlplane.lock``, inside the repository, so every daemon that manages it
  meets the same file by whatever path or mount it reaches the dir. A regular file there is
  harmless: Triton takes only directories for models (a lock *dir* would be listed).
- ``<staging>/.controlplane.lock``: two repositories in one parent dir share the default
  staging dir, and each daemon empties staging at start-up (``StagingArea.clean_all`` keeps
  this file).
- ``<database>.lock`` beside the SQLite file. Not the database file itself: SQLite's own POSIX
  locks on it must not meet ours (NFS emulates ``flock`` with them).

Why ``flock`` rather than ``lockf``/``fcntl``: a POSIX record lock belongs to the process and is
dropped when *any* descriptor of the file is closed, by any code in the process; an ``flock``
belongs to the one open file description held here. Either way the kernel releases it when the
process dies, SIGKILL and OOM kills included, so a restarted daemon needs no clean-up. The
descriptor is close-on-exec (Python's default), so no child inherits the lock and outlives us.

Lock files are never deleted: a daemon that removed its file on the way out could let the next
one lock a fresh inode while a third still waited on the old one. After taking a lock the holder
writes who it is (pid, host, start time, API address) into the file, so a refused daemon can
name it. Errors::

    InstanceLockError        the daemon must not start; the message says why and what to do
    └── StateInUse           another process holds a lock: names the holder and the file
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

__all__ = ["LOCK_NAME", "InstanceLock", "InstanceLockError", "Place", "StateInUse", "places"]

LOCK_NAME = ".controlplane.lock"
_HOLDER_MAX_BYTES = 4096


class InstanceLockError(Exception):
    """The daemon must not start: the state it would manage cannot be locked for it alone."""


class StateInUse(InstanceLockError):
    """Another process holds the lock on a repository, staging dir or database."""


@dataclass(frozen=True)
class Place:
    """One piece of state only one daemon may manage, and the file that guards it."""

    what: str  # "the repository /models/repository", for messages
    lock_file: Path
    setting: str  # the setting that gives a second daemon a place of its own


def places(*, repository: Path, staging: Path, database: Path) -> list[Place]:
    """The places a daemon locks, in the order it locks them."""
    return [
        Place(f"the repository {repository}", repository / LOCK_NAME, "repository.path"),
        Place(f"the staging dir {staging}", staging / LOCK_NAME, "staging.path"),
        Place(
            f"the database {database}",
            database.with_name(database.name + ".lock"),
            "database.path",
        ),
    ]


class InstanceLock:
    """Exclusive locks on every place, held until :meth:`release` or the process ends."""

    def __init__(self, held: Sequence[tuple[Place, int]]) -> None:
        self._held = list(held)

    @classmethod
    def acquire(cls, to_lock: Sequence[Place], *, api: str) -> InstanceLock:
        """Lock every place, or none: raise and release what was taken when one is refused.

        ``api`` is this daemon's API address, written into each file for a refused daemon to
        report. Never blocks: a held lock means another daemon is running, not one to wait for.
        """
        holder = json.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": datetime.now(UTC).isoformat(timespec="seconds"),
                "api": api,
            }
        )
        held: list[tuple[Place, int]] = []
        try:
            for place in to_lock:
                held.append((place, _lock(place, holder)))
        except BaseException:
            InstanceLock(held).release()
            raise
        return cls(held)

    @property
    def files(self) -> list[Path]:
        return [place.lock_file for place, _fd in self._held]

    def release(self) -> None:
        """Unlock and close every file (they stay on disk; see the module docstring)."""
        while self._held:
            _place, fd = self._held.pop()
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> InstanceLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _lock(place: Place, holder: str) -> int:
    """Open, lock and sign ``place.lock_file``; return its descriptor."""
    path = place.lock_file
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # No O_TRUNC: the file may be another daemon's, still holding its signature.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise InstanceLockError(
            f"cannot open the lock file {path} for {place.what}: {exc.strerror}; the daemon "
            f"needs to create and write it (check the permissions of {path.parent})"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        signature = _read(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateInUse(_in_use(place, signature)) from None
        raise InstanceLockError(
            f"cannot lock {path} for {place.what}: {exc.strerror}; the filesystem must support "
            "flock(2)"
        ) from exc
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder + "\n").encode("utf-8"), 0)
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        raise InstanceLockError(
            f"cannot write {path} for {place.what}: {exc.strerror}; free space or fix its "
            "permissions"
        ) from exc
    return fd


def _read(fd: int) -> str:
    try:
        return os.pread(fd, _HOLDER_MAX_BYTES, 0).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _in_use(place: Place, signature: str) -> str:
    return (
        f"{place.what} is in use by another controlplane daemon:\n"
        f"  {_describe(signature)}\n"
        f"  lock file: {place.lock_file}\n"
        "Two daemons on it would undo each other's deploys. Stop that daemon first (its lock "
        "goes when its process ends, even when killed), or give this one a "
        f"{place.setting} of its own."
    )


def _describe(signature: str) -> str:
    """The holder, as it signed the file: pid, host, start time and API address."""
    try:
        data = json.loads(signature)
        return (
            f"pid {int(data['pid'])} on host {data['host']}, started {data['started']}, "
            f"API {data['api']}"
        )
    except (ValueError, KeyError, TypeError):
        return "it has not written who it is yet"
