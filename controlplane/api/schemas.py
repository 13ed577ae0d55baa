"""Request bodies, how domain values are rendered as JSON, and the documented answer shapes.

The ``*Answer`` / ``*Failure`` models below only document answers in the OpenAPI document (the
routes render with the ``*_json`` functions); the API fuzzer checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal, Protocol

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from controlplane.domain.alerts import Alert, AlertRecord, AlertStatus
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.memory import LeakTrend, MemorySample
from controlplane.domain.names import MAX_NAME_LENGTH
from controlplane.domain.notifications import NotificationHealth
from controlplane.domain.operations import (
    Operation,
    OperationKind,
    OperationStatus,
    StepStatus,
    Trigger,
)
from controlplane.domain.rollback import RollbackRecord
from controlplane.domain.slots import Slot
from controlplane.services.overload import OverloadView
from controlplane.services.rollback import RollbackResult
from controlplane.services.status import AsOf, ModelView
from controlplane.services.supervisor import JobStatus

# domain/names.py's rule for model and release names, written for the OpenAPI document without
# a lookahead so that client generators and fuzzers can use it: a letter or digit, then letters,
# digits, '.', '_' and '-', never two dots in a row. Documented, not enforced here: the domain
# check answers 400 invalid_name with the rule that was broken. A unit test keeps them equal.
NAME_PATTERN = r"^[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
NAME_SCHEMA: dict[str, Any] = {"pattern": NAME_PATTERN, "maxLength": MAX_NAME_LENGTH}
# A model name is a release name without '__', which the daemon's slot names reserve.
MODEL_NAME_PATTERN = r"^(?!.*__)[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
MODEL_NAME_SCHEMA: dict[str, Any] = {"pattern": MODEL_NAME_PATTERN, "maxLength": MAX_NAME_LENGTH}


def _encodable(text: str) -> str:
    # JSON can spell a lone surrogate ("\ud800"); such a string cannot be stored or answered
    # as UTF-8, so it is refused here rather than failing later in SQLite or in an answer.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (a lone surrogate is not)") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]


class _Body(BaseModel):
    # strict: "wait": "yes" is refused, not read as true; the document says boolean.
    model_config = ConfigDict(extra="forbid", strict=True)


class FleetWait(Protocol):
    """What the mutating routes' bodies say about waiting."""

    wait: bool
    fleet: bool
    fleet_timeout_seconds: float


class DeployRequest(_Body):
    release: str = Field(
        description="Release name in the store, e.g. 'r2' or '2026-11-29.1'.",
        json_schema_extra=NAME_SCHEMA,
    )
    wait: bool = Field(False, description="Answer only when the operation has finished.")
    force: bool = Field(
        False, description="Load even when the headroom check finds too little free memory."
    )
    fleet: bool = Field(
        False,
        description="Answer only when every live member of the fleet serves it (or one reports "
        "that it cannot), with each member's state under 'fleet'; implies wait.",
    )
    fleet_timeout_seconds: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="With fleet: how long to wait for the other members (fleet_timeout after).",
    )
    reason: Text | None = Field(
        None,
        max_length=500,
        description="Why, in words (a ticket, the CI pipeline's address): recorded on the "
        "operation, and shown by GET /v1/operations and controlplane history.",
    )


class RollbackRequest(_Body):
    to: str = Field(
        "previous", description="'previous' or a release name.", json_schema_extra=NAME_SCHEMA
    )
    wait: bool = Field(False, description="Answer only when the operation has finished.")
    fleet: bool = Field(
        False,
        description="Answer only when every live member of the fleet serves it (or one reports "
        "that it cannot), with each member's state under 'fleet'; implies wait.",
    )
    fleet_timeout_seconds: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="With fleet: how long to wait for the other members (fleet_timeout after).",
    )
    reason: Text | None = Field(
        None,
        max_length=500,
        description="Why, in words (a ticket, the CI pipeline's address): recorded on the "
        "operation, and shown by GET /v1/operations and controlplane history.",
    )


class UnloadRequest(_Body):
    wait: bool = Field(False, description="Answer only when the operation has finished.")
    fleet: bool = Field(
        False,
        description="Answer only when every live member of the fleet serves it (or one reports "
        "that it cannot), with each member's state under 'fleet'; implies wait.",
    )
    fleet_timeout_seconds: float = Field(
        600.0,
        gt=0,
        le=86400,
        description="With fleet: how long to wait for the other members (fleet_timeout after).",
    )
    reason: Text | None = Field(
        None,
        max_length=500,
        description="Why, in words (a ticket, the CI pipeline's address): recorded on the "
        "operation, and shown by GET /v1/operations and controlplane history.",
    )


class AlertmanagerAlert(BaseModel):
    """One alert of Alertmanager's webhook (version 4); fields not used here are ignored."""

    model_config = ConfigDict(extra="ignore")
    status: Literal["firing", "resolved"]
    labels: dict[Text, Text] = Field(max_length=64)
    annotations: dict[Text, Text] = Field(default_factory=dict, max_length=64)
    startsAt: AwareDatetime  # noqa: N815 (Alertmanager's field name)
    fingerprint: str = Field(pattern=r"^[A-Za-z0-9]{1,64}$")

    @field_validator("startsAt", mode="before")
    @classmethod
    def _rfc3339_text(cls, value: object) -> object:
        # Lax datetime parsing would take a number as seconds since 1970: the document says a
        # date-time string, and a number is a broken sender, not an alert from 1970.
        if not isinstance(value, str):
            raise ValueError("startsAt must be an RFC 3339 date-time string")
        return value

    def to_domain(self) -> Alert:
        return Alert(
            fingerprint=self.fingerprint,
            starts_at=self.startsAt,
            status=AlertStatus(self.status),
            labels=self.labels,
            annotations=self.annotations,
        )


class AlertmanagerNotification(BaseModel):
    """Alertmanager's webhook body, version 4."""

    model_config = ConfigDict(extra="ignore")
    version: str = Field(json_schema_extra={"enum": ["4"]})  # refused below with a reason
    status: Literal["firing", "resolved"]
    receiver: Text = ""
    alerts: list[AlertmanagerAlert] = Field(min_length=1, max_length=1000)

    @field_validator("version")
    @classmethod
    def _version_4(cls, version: str) -> str:
        if version != "4":
            raise ValueError(f"Alertmanager webhook version {version!r}; only '4' is understood")
        return version


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
        "member": op.member,
        "reason": op.cause.reason,
        "set_by": op.cause.set_by,
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


def rollback_json(record: RollbackRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "id": record.id,
        "at": _time(record.at),
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
        "at": _time(view.at),
    }


def memory_sample_json(sample: MemorySample) -> dict[str, Any]:
    return {
        "at": _time(sample.at),
        "operation_id": sample.operation_id,
        "model": sample.model,
        "host_bytes": sample.host_bytes,
        "gpu_bytes": sample.gpu_bytes,
    }


def leak_trend_json(trend: LeakTrend) -> dict[str, Any]:
    return {
        "kind": trend.kind,
        "samples": trend.samples,
        "growth_bytes": trend.growth,
        "leak_suspected": trend.flagged,
    }


def alert_json(record: AlertRecord) -> dict[str, Any]:
    alert = record.alert
    return {
        "fingerprint": alert.fingerprint,
        "starts_at": _time(alert.starts_at),
        "status": alert.status.value,
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "first_received": _time(record.first_received),
        "last_received": _time(record.last_received),
        "receipts": record.receipts,
    }


def as_of_json(as_of: AsOf | None) -> dict[str, Any] | None:
    if as_of is None:
        return None
    return {
        "store": _time(as_of.store),
        "store_full_scan": _time(as_of.store_full_scan),
        "triton": _time(as_of.triton),
    }


def ignored_json(ignored: Iterable[IgnoredName]) -> list[dict[str, str]]:
    """Store entries left out for their names: the name (untrusted text, made printable; the
    JSON encoder escapes it) and the rule it breaks. Where it is stays in the log."""
    return [{"name": entry.name, "reason": entry.reason} for entry in ignored]


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
        "overload": overload_json(view.overload),
        "rollback": {
            "fallback": view.fallback,
            "last": rollback_json(view.last_rollback),
            "degraded": [
                {"release": d.release, "at": _time(d.at), "reason": d.reason} for d in view.degraded
            ],
            "cooldown_until": _time(view.cooldown_until),
        },
        "drift": view.drift,
        "last_repair": None if view.last_repair is None else operation_json(view.last_repair),
    }


def job_json(status: JobStatus) -> dict[str, Any]:
    return {
        "name": status.name,
        "state": status.state.value,
        "restarts": status.restarts,
        "last_error": status.last_error,
        "since": _time(status.since),
        "restart_at": _time(status.restart_at),
    }


def notifications_json(health: NotificationHealth) -> dict[str, Any]:
    """The store's event notifications (an SQS queue), as /healthz shows them."""
    return {
        "queue": health.source,
        "state": health.state.value,
        "since": _time(health.since),
        "problem": health.problem,
        "retry_at": _time(health.retry_at),
    }


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StepAnswer(_Answer):
    name: str
    status: StepStatus
    started_at: str | None
    finished_at: str | None
    duration_seconds: float | None
    detail: dict[str, Any]


class ErrorDetail(_Answer):
    code: str = Field(description="Machine-readable error code; see the table in docs/api.md.")
    message: str = Field(description="What is wrong and what to do about it.")


class OperationAnswer(_Answer):
    id: str
    kind: OperationKind
    model: str
    release: str | None
    from_release: str | None
    trigger: Trigger
    status: OperationStatus
    created_at: str | None
    finished_at: str | None
    duration_seconds: float | None
    steps: list[StepAnswer]
    error: ErrorDetail | None
    detail: dict[str, Any]
    member: str | None = Field(
        description="The daemon that ran it (fleet.member); each member knows only its own."
    )
    reason: str | None = Field(
        description="Why, when there is more to say than the trigger: the reason a person gave, "
        "a rollback's reason, what a repair found, or the fleet's desired state it followed."
    )
    set_by: str | None = Field(
        description="Trigger fleet: the member that set the desired state this one followed."
    )


class OperationEnvelope(_Answer):
    """A mutating route's answer: the operation started (202) or finished (200)."""

    operation: OperationAnswer
    fleet: dict[str, Any] | None = Field(
        None, description="With fleet: the model across the fleet, member by member."
    )


class UnchangedAnswer(_Answer):
    """A deploy of the release that already serves, unchanged in the store: nothing to do."""

    unchanged: Literal[True]
    model: str
    release: str
    message: str
    fleet: dict[str, Any] | None = Field(
        None, description="With fleet: the model across the fleet, member by member."
    )


class ErrorBody(_Answer):
    """Every error answer."""

    error: ErrorDetail
    operation_id: str | None = Field(
        None, description="The operation concerned: the running one for operation_in_progress."
    )


class OperationFailure(ErrorBody):
    """An error answer of a mutating route: with ``wait``, the finished, failed operation."""

    operation: OperationAnswer | None = Field(
        None, description="With wait: the operation, which failed with this error."
    )
    fleet: dict[str, Any] | None = Field(
        None, description="With fleet: the model across the fleet, member by member."
    )


class RollbackFailure(ErrorBody):
    """The runbook route's answer when the fallback and the CPU-only reload both failed."""

    rollbacks: list[dict[str, Any]] | None = Field(
        None, description="What was tried for each model, as in the route's 200 answer."
    )
