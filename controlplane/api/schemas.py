"""Request bodies, and how domain values are rendered as JSON."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from controlplane.domain.operations import Operation
from controlplane.domain.slots import Slot
from controlplane.services.status import ModelView


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeployRequest(_Body):
    release: str = Field(description="Release name in the store, e.g. 'r2' or '2026-11-29.1'.")
    wait: bool = Field(False, description="Answer only when the operation has finished.")


class RollbackRequest(_Body):
    to: str = Field("previous", description="'previous' or a release name.")
    wait: bool = Field(False, description="Answer only when the operation has finished.")


class UnloadRequest(_Body):
    wait: bool = Field(False, description="Answer only when the operation has finished.")


def _time(value: Any) -> str | None:
    return None if value is None else value.isoformat()


def operation_json(op: Operation) -> dict[str, Any]:
    return {
        "id": op.id,
        "kind": op.kind.value,
        "model": op.model,
        "release": op.release,
        "from_release": op.from_release,
        "trigger": op.trigger.value,
        "status": op.status.value,
        "created_at": _time(op.created_at),
        "finished_at": _time(op.finished_at),
        "duration_seconds": op.duration_seconds,
        "steps": [
            {
                "name": step.name,
                "status": step.status.value,
                "started_at": _time(step.started_at),
                "finished_at": _time(step.finished_at),
                "duration_seconds": step.duration_seconds,
                "detail": dict(step.detail),
            }
            for step in op.steps
        ],
        "error": None if op.error is None else {"code": op.error.code, "message": op.error.message},
        "detail": dict(op.detail),
    }


ROLES = {"ACTIVE": "active", "RETIRING": "retiring", "READY": "standby"}


def slot_json(slot: Slot, triton_state: str | None = None) -> dict[str, Any]:
    return {
        "name": slot.name,
        "role": ROLES.get(slot.state.value, "idle"),
        "state": slot.state.value,
        "triton_state": triton_state,
        "release": slot.release,
        "trigger": slot.trigger,
        "reason": slot.reason,
        "since": _time(slot.since),
    }


def model_json(view: ModelView) -> dict[str, Any]:
    return {
        "name": view.name,
        "active_release": view.active_release,
        "previous_release": view.previous_release,
        "strategy": view.strategy,
        "alias_target": view.alias_target,
        "triton": {"state": view.triton_state, "reason": view.triton_reason},
        "slots": [slot_json(slot, view.slot_triton_states.get(slot.name)) for slot in view.slots],
        "releases": [{"name": r.name, "complete": r.complete} for r in view.releases],
        "store_error": view.store_error,
        "running_operation": view.running_operation,
        "last_operation": None
        if view.last_operation is None
        else operation_json(view.last_operation),
    }
