"""The bodies of the mutating routes: deploy, rollback and unload, and what they share.

Bodies are strict and closed: ``"wait": "yes"`` is refused rather than read as true (the
document says boolean), and a field this API does not know is refused rather than ignored.
What the three share (waiting, for this member or for the fleet, and the reason given) is
declared once and answered alike.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from controlplane.api.schemas.names import NAME_SCHEMA


def _encodable(text: str) -> str:
    # JSON can spell a lone surrogate ("\ud800"); such a string cannot be stored or answered
    # as UTF-8, so it is refused here rather than failing later in SQLite or in an answer.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (a lone surrogate is not)") from None
    return text


Text = Annotated[str, AfterValidator(_encodable)]

Wait = Annotated[bool, Field(description="Answer only when the operation has finished.")]
FleetWaits = Annotated[
    bool,
    Field(
        description="Answer only when every live member of the fleet serves it (or one reports "
        "that it cannot), with each member's state under 'fleet'; implies wait."
    ),
]
FleetTimeout = Annotated[
    float,
    Field(
        gt=0,
        le=86400,
        description="With fleet: how long to wait for the other members (fleet_timeout after).",
    ),
]
Reason = Annotated[
    Annotated[str, Field(max_length=500), AfterValidator(_encodable)] | None,  # 500 characters
    Field(
        description="Why, in words (a ticket, the CI pipeline's address): recorded on the "
        "operation, and shown by GET /v1/operations and controlplane history.",
    ),
]


class _Body(BaseModel):
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
    wait: Wait = False
    force: bool = Field(
        False, description="Load even when the headroom check finds too little free memory."
    )
    fleet: FleetWaits = False
    fleet_timeout_seconds: FleetTimeout = 600.0
    reason: Reason = None


class RollbackRequest(_Body):
    to: str = Field(
        "previous", description="'previous' or a release name.", json_schema_extra=NAME_SCHEMA
    )
    wait: Wait = False
    fleet: FleetWaits = False
    fleet_timeout_seconds: FleetTimeout = 600.0
    reason: Reason = None


class UnloadRequest(_Body):
    wait: Wait = False
    fleet: FleetWaits = False
    fleet_timeout_seconds: FleetTimeout = 600.0
    reason: Reason = None


class RolloutControlRequest(_Body):
    reason: Reason = None
