"""Triton's memory after each swap, in SQLite (``memory_samples``), for the leak trend."""

from __future__ import annotations

import sqlite3
from datetime import datetime

from controlplane.adapters.persistence.database import Database
from controlplane.domain.memory import MemorySample


class SqliteMemoryBook:
    def __init__(self, database: Database) -> None:
        self._db = database

    async def record(self, sample: MemorySample) -> None:
        row = (
            sample.at.isoformat(),
            sample.operation_id,
            sample.model,
            sample.host_bytes,
            sample.gpu_bytes,
        )

        def job(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO memory_samples (at, operation_id, model, host_bytes, gpu_bytes) "
                "VALUES (?, ?, ?, ?, ?)",
                row,
            )

        await self._db.write(job)

    async def recent(self, limit: int) -> list[MemorySample]:
        """The newest ``limit`` samples, oldest first."""

        def job(db: sqlite3.Connection) -> list[MemorySample]:
            rows = db.execute(
                "SELECT * FROM memory_samples ORDER BY rowid DESC LIMIT ?", (limit,)
            ).fetchall()
            return [
                MemorySample(
                    at=datetime.fromisoformat(row["at"]),
                    operation_id=row["operation_id"],
                    model=row["model"],
                    host_bytes=row["host_bytes"],
                    gpu_bytes=row["gpu_bytes"],
                )
                for row in reversed(rows)
            ]

        return await self._db.read(job)
