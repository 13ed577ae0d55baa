"""SQLite persistence: one file, one thread, one repository per aggregate.

:class:`SqliteRepos` opens the file and builds the repositories the services use; each owns
its tables and converts between rows and the domain's frozen values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controlplane.adapters.persistence.database import Database
from controlplane.adapters.persistence.journal import SqliteOperationLog, SqliteReleaseBook
from controlplane.adapters.persistence.memory import SqliteMemoryBook
from controlplane.adapters.persistence.rollbacks import SqliteAlertBook, SqliteRollbackBook
from controlplane.adapters.persistence.serving import SqliteServing


@dataclass(frozen=True)
class SqliteRepos:
    database: Database
    serving: SqliteServing
    operations: SqliteOperationLog
    releases: SqliteReleaseBook
    rollbacks: SqliteRollbackBook
    alerts: SqliteAlertBook
    memory: SqliteMemoryBook

    @classmethod
    def open(cls, path: Path) -> SqliteRepos:
        database = Database(path)
        return cls(
            database=database,
            serving=SqliteServing(database),
            operations=SqliteOperationLog(database),
            releases=SqliteReleaseBook(database),
            rollbacks=SqliteRollbackBook(database),
            alerts=SqliteAlertBook(database),
            memory=SqliteMemoryBook(database),
        )

    def close(self) -> None:
        self.database.close()
