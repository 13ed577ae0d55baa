"""What should serve per model, and its slots, in SQLite (tables ``models`` and ``slots``).

A change to a model (what serves, what served before, any of its slots) is written by
:meth:`SqliteServing.commit` in one transaction, so a crash never leaves the serving record and
the slots at odds (a switch is three rows: the model, the new active slot, the retiring one).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from datetime import datetime

from controlplane.adapters.persistence.database import Database
from controlplane.domain.operations import Trigger
from controlplane.domain.slots import Slot, SlotState
from controlplane.ports import ModelRecord, Serving


class SqliteServing:
    def __init__(self, database: Database) -> None:
        self._db = database
        self._writes = 0

    @property
    def writes(self) -> int:
        return self._writes

    async def get(self, model: str) -> ModelRecord | None:
        def job(db: sqlite3.Connection) -> ModelRecord | None:
            row = db.execute("SELECT * FROM models WHERE name = ?", (model,)).fetchone()
            return None if row is None else _record(db, row)

        return await self._db.read(job)

    async def all(self) -> list[ModelRecord]:
        def job(db: sqlite3.Connection) -> list[ModelRecord]:
            rows = db.execute("SELECT * FROM models ORDER BY name").fetchall()
            return [_record(db, row) for row in rows]

        return await self._db.read(job)

    async def commit(
        self,
        model: str,
        at: datetime,
        *,
        serving: Serving | None = None,
        slots: Sequence[Slot] = (),
    ) -> None:
        def job(db: sqlite3.Connection) -> None:
            if serving is None:
                db.execute(
                    "INSERT INTO models (name, updated_at) VALUES (?, ?) "
                    "ON CONFLICT(name) DO NOTHING",
                    (model, at.isoformat()),
                )
            else:
                db.execute(
                    "INSERT INTO models (name, active_release, previous_release, updated_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
                    "active_release = excluded.active_release, "
                    "previous_release = excluded.previous_release, "
                    "updated_at = excluded.updated_at",
                    (model, serving.active, serving.previous, at.isoformat()),
                )
            for slot in slots:
                db.execute(
                    "INSERT INTO slots "
                    "(model, slot, state, release, trigger, reason, since, cpu_only) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(model, slot) DO UPDATE SET "
                    "state = excluded.state, release = excluded.release, "
                    "trigger = excluded.trigger, reason = excluded.reason, "
                    "since = excluded.since, cpu_only = excluded.cpu_only",
                    (
                        model,
                        slot.name,
                        slot.state.value,
                        slot.release,
                        slot.trigger.value if slot.trigger is not None else "",
                        slot.reason,
                        slot.since.isoformat(),
                        int(slot.cpu_only),
                    ),
                )

        self._writes += 1  # counted as submitted: a read submitted later sees it
        await self._db.write(job)

    async def forget_slots(self, model: str, names: Sequence[str]) -> None:
        """Drop slot rows that no longer mean anything (a spare whose dir is gone)."""

        def job(db: sqlite3.Connection) -> None:
            db.executemany(
                "DELETE FROM slots WHERE model = ? AND slot = ?", [(model, n) for n in names]
            )

        self._writes += 1  # counted as submitted: a read submitted later sees it
        await self._db.write(job)


def _record(db: sqlite3.Connection, row: sqlite3.Row) -> ModelRecord:
    slots = db.execute("SELECT * FROM slots WHERE model = ? ORDER BY slot", (row["name"],))
    return ModelRecord(
        name=row["name"],
        active_release=row["active_release"],
        previous_release=row["previous_release"],
        updated_at=datetime.fromisoformat(row["updated_at"]),
        slots=tuple(
            Slot(
                name=s["slot"],
                state=SlotState(s["state"]),
                release=s["release"],
                trigger=_trigger(s["trigger"]),
                reason=s["reason"],
                since=datetime.fromisoformat(s["since"]),
                cpu_only=bool(s["cpu_only"]),
            )
            for s in slots.fetchall()
        ),
    )


def _trigger(stored: str) -> Trigger | None:
    """The trigger a row names; None for a slot never moved (or a word of an older release)."""
    try:
        return Trigger(stored) if stored else None
    except ValueError:
        return None
