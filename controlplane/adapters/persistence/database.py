"""The SQLite file and the one thread that does all of its work.

Invariants:

* Every statement runs on one worker thread that owns the connection, so the event loop never
  waits on the disk or on SQLite's locks: callers ``await`` a future (:meth:`Database.read`,
  :meth:`Database.write`) or queue a write and go on (:meth:`Database.enqueue`).
* The worker takes jobs in order, so a read submitted after a write sees it, and queued writes
  land in the order they were queued (an operation's step records never go back in time).
* Every write job is one transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``): a change that spans
  rows or tables is all there after a crash, or none of it is.
* The schema is brought up to date at open by :mod:`.migrations`, each step in its own
  transaction together with its ``user_version``.

A job that is awaited by a task that gets cancelled still runs to its end: the caller stops
waiting, the database does not stop half way.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from controlplane.adapters.persistence.migrations import migrate

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK = 500  # values bound in one ``IN (...)``: below SQLite's limit on bound parameters
Job = Callable[[sqlite3.Connection], T]


class Database:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._connection: sqlite3.Connection | None = None
        try:
            self._executor.submit(self._open).result()
        except BaseException:
            self._executor.shutdown(wait=True)
            raise

    # --- for the repositories ---------------------------------------------------------------

    async def read(self, job: Job[T]) -> T:
        """Run ``job`` on the worker and return its result."""
        return await asyncio.wrap_future(self._executor.submit(self._run, job))

    async def write(self, job: Job[T]) -> T:
        """Run ``job`` in one transaction on the worker; return once it is committed."""
        return await asyncio.wrap_future(self._executor.submit(self._transaction, job))

    def enqueue(self, job: Job[object], what: str) -> None:
        """Queue ``job`` as one transaction and return at once (any thread may call this).

        For records whose order matters but whose caller must not wait (an operation's
        progress, written from a download thread); a failure is logged with ``what``.
        """

        def report(done: Future[object]) -> None:
            if not done.cancelled() and (exc := done.exception()) is not None:
                log.error("could not write %s to %s: %s", what, self.path, exc)

        try:
            future = self._executor.submit(self._transaction, job)
        except RuntimeError:  # closed: the daemon is stopping
            log.warning("database closed; %s was not written", what)
            return
        future.add_done_callback(report)

    def close(self) -> None:
        """Finish queued jobs, then close the file."""
        try:
            self._executor.submit(self._close).result()
        except RuntimeError:
            return  # closed already
        self._executor.shutdown(wait=True)

    # --- on the worker thread ---------------------------------------------------------------

    def _open(self) -> None:
        connection = sqlite3.connect(self.path, isolation_level=None)
        connection.row_factory = sqlite3.Row
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute("PRAGMA busy_timeout=5000")
            migrate(connection, self.path)
        except BaseException:
            connection.close()
            raise
        self._connection = connection

    def _run(self, job: Job[T]) -> T:
        return job(self._conn())

    def _transaction(self, job: Job[T]) -> T:
        connection = self._conn()
        connection.execute("BEGIN IMMEDIATE")
        try:
            result = job(connection)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
        return result

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _conn(self) -> sqlite3.Connection:
        if self._connection is None:
            raise RuntimeError(f"database {self.path} is closed")
        return self._connection


def chunks(values: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``values`` cut into pieces small enough to bind, each with its ``(?, ?, ...)``."""
    pieces = [list(values[i : i + CHUNK]) for i in range(0, len(values), CHUNK)]
    return [("(" + ", ".join("?" * len(piece)) + ")", piece) for piece in pieces]
