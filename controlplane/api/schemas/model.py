"""A model as ``GET /v1/models`` and ``GET /v1/models/{name}`` show it: its releases, its
slots, what Triton says of it, its last operation (deploy, rollback, unload or cpu-fallback),
its last housekeeping (retire or repair) and its last repair, its overload verdict and its
rollback state; and what a page of models says of itself (when it was seen, what was left out).

``api/model_pages.py`` splits a model's JSON around its ``overload`` key, the one part that is
new every second: keep that key in :func:`model_json`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controlplane.api.schemas.operation import operation_json
from controlplane.api.schemas.timestamps import iso
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.rollback import RollbackRecord
from controlplane.domain.slots import Slot
from controlplane.services.overload import OverloadView
from controlplane.services.rollback import RollbackResult
from controlplane.services.views import AsOf, ModelView

ROLES = {"ACTIVE": "active", "RETIRING": "retiring", "READY": "standby"}


def model_json(view: ModelView) -> dict[str, Any]:
    return {
        "name": view.name,
        "active_release": view.active_release,
        "signer": view.signer,
        "cpu_only": view.cpu_only,
        "previous_release": view.previous_release,
        "strategy": view.strategy,
        "alias_target": view.alias_target,
        "triton": {"state": view.triton_state, "reason": view.triton_reason},
        "slots": [slot_json(slot, view.slot_triton_states.get(slot.name)) for slot in view.slots],
        "releases": [
            {"name": r.name, "complete": r.complete, "signed": r.signed} for r in view.releases
        ],
        "ignored_releases": ignored_json(view.ignored_releases),
        "store_error": view.store_error,
        "running_operation": view.running_operation,
        "last_operation": None
        if view.last_operation is None
        else operation_json(view.last_operation),
        "last_housekeeping": None
        if view.last_housekeeping is None
        else operation_json(view.last_housekeeping),
        "overload": overload_json(view.overload),
        "rollback": {
            "fallback": view.fallback,
            "last": rollback_json(view.last_rollback),
            "degraded": [
                {"release": d.release, "at": iso(d.at), "reason": d.reason} for d in view.degraded
            ],
            "cooldown_until": iso(view.cooldown_until),
        },
        "out_of_rotation": None
        if view.out_of_rotation is None
        else {"reason": view.out_of_rotation.kind.value, "message": view.out_of_rotation.reason},
        "drift": view.drift,
        "last_repair": None if view.last_repair is None else operation_json(view.last_repair),
    }


def slot_json(slot: Slot, triton_state: str | None = None) -> dict[str, Any]:
    return {
        "name": slot.name,
        "role": ROLES.get(slot.state.value, "idle"),
        "state": slot.state.value,
        "triton_state": triton_state,
        "release": slot.release,
        "trigger": slot.trigger,
        "reason": slot.reason,
        "since": iso(slot.since),
    }


def rollback_json(record: RollbackRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "id": record.id,
        "at": iso(record.at),
        "trigger": record.trigger.value,
        "reason": record.reason,
        "from_release": record.from_release,
        "to_release": record.to_release,
        "outcome": record.outcome.value,
        "operations": list(record.operation_ids),
        "detail": dict(record.detail),
        "suppressed_in_cooldown": record.suppressed,
    }


def rollback_result_json(result: RollbackResult) -> dict[str, Any]:
    """What the runbook route did for one model: rolled back, or why not."""
    return {
        "model": result.model,
        "acted": result.acted,
        "note": result.note,
        "rollback": rollback_json(result.record),
    }


def overload_json(view: OverloadView | None) -> dict[str, Any] | None:
    if view is None:
        return None
    evaluation = view.evaluation
    return {
        "source": view.source,
        "verdict": evaluation.verdict.value,
        "reason": evaluation.reason,
        "covered_seconds": round(evaluation.covered_seconds, 3),
        "samples": evaluation.samples,
        "last_value": view.last_value,
        "note": view.note or None,
        "at": iso(view.at),
    }


def as_of_json(as_of: AsOf | None) -> dict[str, Any] | None:
    if as_of is None:
        return None
    return {
        "store": iso(as_of.store),
        "store_full_scan": iso(as_of.store_full_scan),
        "triton": iso(as_of.triton),
    }


def ignored_json(ignored: Iterable[IgnoredName]) -> list[dict[str, str]]:
    """Store entries left out for their names: the name (untrusted text, made printable; the
    JSON encoder escapes it) and the rule it breaks. Where it is stays in the log."""
    return [{"name": entry.name, "reason": entry.reason} for entry in ignored]
