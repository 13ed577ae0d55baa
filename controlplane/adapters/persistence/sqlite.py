"""SQLite state: desired state per model, slots, releases seen, and every operation.

One file in WAL mode: readers never block the writer, and a killed process loses nothing that
was committed. The persisted shape (rows, JSON for steps) is converted to and from the domain's
frozen values here and nowhere else. Schema changes go through ``PRAGMA user_version``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from controlplane.domain.alerts import Alert, AlertRecord, AlertStatus, Receipt
from controlplane.domain.memory import MemorySample
from controlplane.domain.operations import (
    Operation,
    OperationError,
    OperationKind,
    OperationStatus,
    Step,
    StepStatus,
    Trigger,
)
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.rollback import DegradedRelease, RollbackOutcome, RollbackRecord
from controlplane.domain.slots import Slot, SlotState
from controlplane.ports import ModelRecord

SCHEMA_VERSION = 4
_SCHEMA = """
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
    revision TEXT,
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
CREATE TABLE IF NOT EXISTS memory_samples (
    at TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    model TEXT NOT NULL,
    host_bytes INTEGER,
    gpu_bytes INTEGER
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
"""


class SqliteStateRepo:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        with self._lock:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                self._db.close()
                raise RuntimeError(
                    f"database {path} has schema version {version}, newer than this "
                    f"controlplane ({SCHEMA_VERSION}); upgrade controlplane or use another file"
                )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            if version == 1:  # 1 -> 2: releases remember their SHA256SUMS revision
                self._db.execute("ALTER TABLE releases ADD COLUMN revision TEXT")
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- models and slots -------------------------------------------------------------

    def get_model(self, model: str) -> ModelRecord | None:
        row = self._one("SELECT * FROM models WHERE name = ?", (model,))
        if row is None:
            return None
        return self._model_from_row(row)

    def list_models(self) -> list[ModelRecord]:
        rows = self._all("SELECT * FROM models ORDER BY name", ())
        return [self._model_from_row(row) for row in rows]

    def set_serving(
        self, model: str, *, active: str | None, previous: str | None, at: datetime
    ) -> None:
        self._execute(
            "INSERT INTO models (name, active_release, previous_release, updated_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET "
            "active_release = excluded.active_release, "
            "previous_release = excluded.previous_release, updated_at = excluded.updated_at",
            (model, active, previous, at.isoformat()),
        )

    def save_slot(self, model: str, slot: Slot) -> None:
        self._execute(
            "INSERT INTO models (name, updated_at) VALUES (?, ?) ON CONFLICT(name) DO NOTHING",
            (model, slot.since.isoformat()),
        )
        self._execute(
            "INSERT INTO slots (model, slot, state, release, trigger, reason, since) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(model, slot) DO UPDATE SET "
            "state = excluded.state, release = excluded.release, trigger = excluded.trigger, "
            "reason = excluded.reason, since = excluded.since",
            (
                model,
                slot.name,
                slot.state.value,
                slot.release,
                slot.trigger,
                slot.reason,
                slot.since.isoformat(),
            ),
        )

    def record_releases(self, releases: Sequence[ReleaseInfo], at: datetime) -> None:
        stamp = at.isoformat()
        with self._lock:
            self._db.execute("BEGIN")
            try:
                for info in releases:
                    self._db.execute(
                        "INSERT INTO releases "
                        "(model, release, complete, first_seen, last_seen, revision) "
                        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(model, release) DO UPDATE SET "
                        "complete = excluded.complete, last_seen = excluded.last_seen, "
                        "revision = excluded.revision",
                        (info.model, info.name, int(info.complete), stamp, stamp, info.revision),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def list_releases(self, model: str) -> list[ReleaseInfo]:
        rows = self._all("SELECT * FROM releases WHERE model = ?", (model,))
        return [
            ReleaseInfo(row["model"], row["release"], bool(row["complete"]), row["revision"])
            for row in rows
        ]

    # --- operations -------------------------------------------------------------------

    def save_operation(self, operation: Operation) -> None:
        self._execute(
            "INSERT INTO operations (id, kind, model, release, from_release, trigger, status, "
            "created_at, finished_at, error_code, error_message, steps, detail) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET "
            "status = excluded.status, from_release = excluded.from_release, "
            "finished_at = excluded.finished_at, error_code = excluded.error_code, "
            "error_message = excluded.error_message, steps = excluded.steps, "
            "detail = excluded.detail",
            _operation_to_row(operation),
        )

    def get_operation(self, operation_id: str) -> Operation | None:
        row = self._one("SELECT * FROM operations WHERE id = ?", (operation_id,))
        return None if row is None else _operation_from_row(row)

    def list_operations(self, model: str | None = None, limit: int = 20) -> list[Operation]:
        if model is None:
            rows = self._all(
                "SELECT * FROM operations ORDER BY created_at DESC, rowid DESC LIMIT ?", (limit,)
            )
        else:
            rows = self._all(
                "SELECT * FROM operations WHERE model = ? "
                "ORDER BY created_at DESC, rowid DESC LIMIT ?",
                (model, limit),
            )
        return [_operation_from_row(row) for row in rows]

    def unfinished_operations(self) -> list[Operation]:
        rows = self._all(
            "SELECT * FROM operations WHERE status IN (?, ?) ORDER BY created_at",
            (OperationStatus.PENDING.value, OperationStatus.RUNNING.value),
        )
        return [_operation_from_row(row) for row in rows]

    # --- automatic rollback -----------------------------------------------------------

    def save_rollback(self, record: RollbackRecord) -> None:
        self._execute(
            "INSERT INTO rollbacks (id, model, at, trigger, reason, from_release, to_release, "
            "outcome, operations, detail, suppressed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET outcome = excluded.outcome, "
            "to_release = excluded.to_release, operations = excluded.operations, "
            "detail = excluded.detail",
            (
                record.id,
                record.model,
                record.at.isoformat(),
                record.trigger.value,
                record.reason,
                record.from_release,
                record.to_release,
                record.outcome.value,
                json.dumps(list(record.operation_ids)),
                json.dumps(dict(record.detail)),
                record.suppressed,
            ),
        )

    def last_rollback(self, model: str) -> RollbackRecord | None:
        row = self._one(
            "SELECT * FROM rollbacks WHERE model = ? ORDER BY at DESC, rowid DESC LIMIT 1",
            (model,),
        )
        return None if row is None else _rollback_from_row(row)

    def count_suppressed(self, rollback_id: str) -> None:
        self._execute(
            "UPDATE rollbacks SET suppressed = suppressed + 1 WHERE id = ?", (rollback_id,)
        )

    def mark_degraded(self, latch: DegradedRelease) -> None:
        self._execute(
            "INSERT INTO degraded (model, release, at, reason) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(model, release) DO UPDATE SET at = excluded.at, reason = excluded.reason",
            (latch.model, latch.release, latch.at.isoformat(), latch.reason),
        )

    def clear_degraded(self, model: str, release: str) -> bool:
        with self._lock:
            cursor = self._db.execute(
                "DELETE FROM degraded WHERE model = ? AND release = ?", (model, release)
            )
            return cursor.rowcount > 0

    def degraded(self, model: str) -> list[DegradedRelease]:
        rows = self._all("SELECT * FROM degraded WHERE model = ? ORDER BY at", (model,))
        return [
            DegradedRelease(
                row["model"], row["release"], datetime.fromisoformat(row["at"]), row["reason"]
            )
            for row in rows
        ]

    def record_alert(self, alert: Alert, at: datetime) -> Receipt:
        """Store one receipt of ``alert`` (before the webhook answers) and say what it is."""
        key = (alert.fingerprint, alert.starts_at.isoformat())
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT status FROM alerts WHERE fingerprint = ? AND starts_at = ?", key
                ).fetchone()
                if row is None:
                    self._db.execute(
                        "INSERT INTO alerts (fingerprint, starts_at, status, labels, annotations, "
                        "first_received, last_received, receipts) VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
                        (
                            *key,
                            alert.status.value,
                            json.dumps(dict(alert.labels)),
                            json.dumps(dict(alert.annotations)),
                            at.isoformat(),
                            at.isoformat(),
                        ),
                    )
                else:
                    self._db.execute(
                        "UPDATE alerts SET status = ?, last_received = ?, receipts = receipts + 1 "
                        "WHERE fingerprint = ? AND starts_at = ?",
                        (alert.status.value, at.isoformat(), *key),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        if alert.status is AlertStatus.RESOLVED:
            return Receipt.RESOLVED
        return Receipt.NEW if row is None else Receipt.DUPLICATE

    def list_alerts(self, limit: int = 50) -> list[AlertRecord]:
        rows = self._all("SELECT * FROM alerts ORDER BY last_received DESC LIMIT ?", (limit,))
        return [
            AlertRecord(
                alert=Alert(
                    fingerprint=row["fingerprint"],
                    starts_at=datetime.fromisoformat(row["starts_at"]),
                    status=AlertStatus(row["status"]),
                    labels=json.loads(row["labels"]),
                    annotations=json.loads(row["annotations"]),
                ),
                first_received=datetime.fromisoformat(row["first_received"]),
                last_received=datetime.fromisoformat(row["last_received"]),
                receipts=int(row["receipts"]),
            )
            for row in rows
        ]

    # --- memory trend -------------------------------------------------------------------

    def record_memory(self, sample: MemorySample) -> None:
        self._execute(
            "INSERT INTO memory_samples (at, operation_id, model, host_bytes, gpu_bytes) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                sample.at.isoformat(),
                sample.operation_id,
                sample.model,
                sample.host_bytes,
                sample.gpu_bytes,
            ),
        )

    def recent_memory(self, limit: int) -> list[MemorySample]:
        rows = self._all("SELECT * FROM memory_samples ORDER BY rowid DESC LIMIT ?", (limit,))
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

    # --- plumbing ---------------------------------------------------------------------

    def _model_from_row(self, row: sqlite3.Row) -> ModelRecord:
        slots = self._all("SELECT * FROM slots WHERE model = ? ORDER BY slot", (row["name"],))
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
                    trigger=s["trigger"],
                    reason=s["reason"],
                    since=datetime.fromisoformat(s["since"]),
                )
                for s in slots
            ),
        )

    def _execute(self, sql: str, params: Sequence[Any]) -> None:
        with self._lock:
            self._db.execute(sql, params)

    def _one(self, sql: str, params: Sequence[Any]) -> sqlite3.Row | None:
        with self._lock:
            row: sqlite3.Row | None = self._db.execute(sql, params).fetchone()
            return row

    def _all(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, params).fetchall())


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _operation_to_row(op: Operation) -> tuple[Any, ...]:
    steps = [
        {
            "name": s.name,
            "status": s.status.value,
            "started_at": s.started_at.isoformat(),
            "finished_at": _iso(s.finished_at),
            "detail": dict(s.detail),
        }
        for s in op.steps
    ]
    return (
        op.id,
        op.kind.value,
        op.model,
        op.release,
        op.from_release,
        op.trigger.value,
        op.status.value,
        op.created_at.isoformat(),
        _iso(op.finished_at),
        op.error.code if op.error else None,
        op.error.message if op.error else None,
        json.dumps(steps),
        json.dumps(dict(op.detail)),
    )


def _rollback_from_row(row: sqlite3.Row) -> RollbackRecord:
    return RollbackRecord(
        id=row["id"],
        model=row["model"],
        at=datetime.fromisoformat(row["at"]),
        trigger=Trigger(row["trigger"]),
        reason=row["reason"],
        from_release=row["from_release"],
        to_release=row["to_release"],
        outcome=RollbackOutcome(row["outcome"]),
        operation_ids=tuple(json.loads(row["operations"])),
        detail=json.loads(row["detail"]),
        suppressed=int(row["suppressed"]),
    )


def _operation_from_row(row: sqlite3.Row) -> Operation:
    steps = tuple(
        Step(
            name=s["name"],
            status=StepStatus(s["status"]),
            started_at=datetime.fromisoformat(s["started_at"]),
            finished_at=_parse(s["finished_at"]),
            detail=s["detail"],
        )
        for s in json.loads(row["steps"])
    )
    error = (
        OperationError(code=row["error_code"], message=row["error_message"] or "")
        if row["error_code"]
        else None
    )
    return Operation(
        id=row["id"],
        kind=OperationKind(row["kind"]),
        model=row["model"],
        release=row["release"],
        from_release=row["from_release"],
        trigger=Trigger(row["trigger"]),
        status=OperationStatus(row["status"]),
        created_at=datetime.fromisoformat(row["created_at"]),
        finished_at=_parse(row["finished_at"]),
        steps=steps,
        error=error,
        detail=json.loads(row["detail"]),
    )
