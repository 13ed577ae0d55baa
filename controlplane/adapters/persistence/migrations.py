"""The schema, as the ordered list of steps that built it.

``PRAGMA user_version`` says how many steps a file has had. Opening a file applies the missing
ones in order, each in one transaction together with its new ``user_version`` (SQLite's DDL is
transactional), so a crash during an upgrade leaves the file at the step before, never between
an ``ALTER`` and its version. A file newer than this code is refused rather than guessed at.

Steps are never edited once released: the file a user has was made by them. A schema change is
a new step at the end, with a test that upgrades a file of the version before (see
tests/unit/test_migrations.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

MIGRATIONS: tuple[str, ...] = (
    # 1: desired state, slots, releases seen, operations.
    """
    CREATE TABLE IF NOT EXISTS models (
        name TEXT PRIMARY KEY,
        active_release TEXT,
        previous_release TEXT,
        updated_at TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS slots (
        model TEXT NOT NULL,
        slot TEXT NOT NULL,
        state TEXT NOT NULL,
        release TEXT,
        trigger TEXT NOT NULL,
        reason TEXT NOT NULL,
        since TEXT NOT NULL,
        PRIMARY KEY (model, slot)
    );
    CREATE TABLE IF NOT EXISTS releases (
        model TEXT NOT NULL,
        release TEXT NOT NULL,
        complete INTEGER NOT NULL,
        first_seen TEXT NOT NULL,
        last_seen TEXT NOT NULL,
        PRIMARY KEY (model, release)
    );
    CREATE TABLE IF NOT EXISTS operations (
        id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        model TEXT NOT NULL,
        release TEXT,
        from_release TEXT,
        trigger TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at TEXT NOT NULL,
        finished_at TEXT,
        error_code TEXT,
        error_message TEXT,
        steps TEXT NOT NULL,
        detail TEXT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS operations_by_model ON operations (model, created_at);
    CREATE INDEX IF NOT EXISTS operations_by_status ON operations (status);
    """,
    # 2: a release remembers its SHA256SUMS revision, so a republish is seen.
    "ALTER TABLE releases ADD COLUMN revision TEXT;",
    # 3: automatic rollback: its records, the degraded latch, Alertmanager's alerts.
    """
    CREATE TABLE IF NOT EXISTS rollbacks (
        id TEXT PRIMARY KEY,
        model TEXT NOT NULL,
        at TEXT NOT NULL,
        trigger TEXT NOT NULL,
        reason TEXT NOT NULL,
        from_release TEXT,
        to_release TEXT,
        outcome TEXT NOT NULL,
        operations TEXT NOT NULL,
        detail TEXT NOT NULL,
        suppressed INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX IF NOT EXISTS rollbacks_by_model ON rollbacks (model, at);
    CREATE TABLE IF NOT EXISTS degraded (
        model TEXT NOT NULL,
        release TEXT NOT NULL,
        at TEXT NOT NULL,
        reason TEXT NOT NULL,
        PRIMARY KEY (model, release)
    );
    CREATE TABLE IF NOT EXISTS alerts (
        fingerprint TEXT NOT NULL,
        starts_at TEXT NOT NULL,
        status TEXT NOT NULL,
        labels TEXT NOT NULL,
        annotations TEXT NOT NULL,
        first_received TEXT NOT NULL,
        last_received TEXT NOT NULL,
        receipts INTEGER NOT NULL,
        PRIMARY KEY (fingerprint, starts_at)
    );
    """,
    # 4: Triton's memory after each swap, for the leak trend.
    """
    CREATE TABLE IF NOT EXISTS memory_samples (
        at TEXT NOT NULL,
        operation_id TEXT NOT NULL,
        model TEXT NOT NULL,
        host_bytes INTEGER,
        gpu_bytes INTEGER
    );
    """,
    # 5: who ran an operation and why (controlplane history): the member, the reason, and for
    # an operation that followed the fleet, the member that set the desired state.
    """
    ALTER TABLE operations ADD COLUMN member TEXT;
    ALTER TABLE operations ADD COLUMN reason TEXT;
    ALTER TABLE operations ADD COLUMN set_by TEXT;
    """,
    # 6: a slot the CPU-only reload left says so in a column of its own, no longer in words of
    # its reason (the rows written before say it there: read once, here).
    """
    ALTER TABLE slots ADD COLUMN cpu_only INTEGER NOT NULL DEFAULT 0;
    UPDATE slots SET cpu_only = 1
        WHERE state IN ('READY', 'ACTIVE', 'RETIRING')
        AND reason LIKE '%on CPU-only instances%';
    """,
    # 7: the newest operation of each kind of a model is one index look (status's last
    # operation and last housekeeping), however long the model's history.
    "CREATE INDEX IF NOT EXISTS operations_by_model_kind ON operations (model, kind, created_at);",
)
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    """The file was written by a newer controlplane."""


def migrate(connection: sqlite3.Connection, path: Path) -> int:
    """Apply the steps ``path`` has not had; return the version it started at."""
    start = int(connection.execute("PRAGMA user_version").fetchone()[0])
    if start > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"database {path} has schema version {start}, newer than this controlplane "
            f"({SCHEMA_VERSION}); upgrade controlplane or point database.path at another file"
        )
    for version in range(start + 1, SCHEMA_VERSION + 1):
        connection.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(MIGRATIONS[version - 1]):
                connection.execute(statement)
            connection.execute(f"PRAGMA user_version={version}")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    return start


def _statements(script: str) -> list[str]:
    """Split a step into statements (``executescript`` would commit on its own)."""
    statements: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement in a migration: {pending.strip()[:80]}")
    return statements
