"""An operation as every answer shows it: its steps with their timings, its outcome, and why
it ran (trigger, reason, and in a fleet the member that ran it and who set what it followed).

One rendering for every route (the mutating routes' answers, ``GET /v1/operations``, a
model's last operation and last repair), so a client reads an operation one way.
"""

from __future__ import annotations

from typing import Any

from controlplane.api.schemas.timestamps import iso
from controlplane.domain.operations import Operation


def operation_json(op: Operation) -> dict[str, Any]:
    return {
        "id": op.id,
        "kind": op.kind.value,
        "model": op.model,
        "release": op.release,
        "from_release": op.from_release,
        "trigger": op.trigger.value,
        "status": op.status.value,
        "created_at": iso(op.created_at),
        "finished_at": iso(op.finished_at),
        "duration_seconds": op.duration_seconds,
        "steps": [
            {
                "name": step.name,
                "status": step.status.value,
                "started_at": iso(step.started_at),
                "finished_at": iso(step.finished_at),
                "duration_seconds": step.duration_seconds,
                "detail": dict(step.detail),
            }
            for step in op.steps
        ],
        "error": None if op.error is None else {"code": op.error.code, "message": op.error.message},
        "detail": dict(op.detail),
        "member": op.member,
        "reason": op.cause.reason,
        "set_by": op.cause.set_by,
    }
