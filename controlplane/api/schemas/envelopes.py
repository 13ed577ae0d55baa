"""The documented answer shapes: what the OpenAPI document says each answer looks like.

These models only document: the routes render with the ``*_json`` functions of the sibling
modules, and the API fuzzer checks that the two agree. Closed (``extra="forbid"``), so the
document says no more fields than the answers carry.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from controlplane.domain.operations import OperationKind, OperationStatus, StepStatus, Trigger


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
