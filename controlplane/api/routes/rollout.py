"""A person's hand on a model's fleet rollout: pause, resume, promote, abort.

Each writes the model's desired state (a new generation, who, when and why recorded) through
this member and answers the model across the fleet as it is then (the shape of
``GET /v1/fleet``'s model, with each member's state), as a deploy with ``"fleet": true`` does.
A daemon that is no fleet's member answers 400 ``invalid_request``; a model the fleet has no
record of, 404 ``model_not_found``; nothing to do, 409 with the control's code.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from controlplane.api.answers import WRITE_REFUSALS, answers
from controlplane.api.deps import Caller, ModelName, Writer, fleet_of
from controlplane.api.schemas.requests import RolloutControlRequest
from controlplane.domain.operations import Trigger
from controlplane.services.fleet import fleet_json_model
from controlplane.services.rollout_controls import Control
from controlplane.wiring import Container

router = APIRouter()

CONTROL_REFUSALS = (
    *WRITE_REFUSALS,
    "invalid_name",
    "model_not_found",
    "desired_state_conflict",
    "store_error",
    "store_unavailable",
)
Controlled = Annotated[RolloutControlRequest | None, Body()]


async def _control(
    c: Container, name: str, control: Control, trigger: Trigger, body: RolloutControlRequest | None
) -> dict[str, Any]:
    fleet = fleet_of(c)  # refused when this daemon is no fleet's member
    assert c.rollout is not None  # built beside the fleet view
    reason = body.reason if body is not None and body.reason else ""
    await c.rollout.apply(name, control, trigger=trigger.value, reason=reason)
    return fleet_json_model(await fleet.snapshot(name), name)


@router.post(
    "/v1/models/{name}/rollout/pause",
    summary="Pause a model's canary rollout.",
    tags=["fleet"],
    responses=answers((*CONTROL_REFUSALS, "no_rollout_in_progress", "rollout_already_paused")),
)
async def pause(
    name: ModelName, trigger: Caller, c: Writer, body: Controlled = None
) -> dict[str, Any]:
    """Hold the model's rollout where it stands: it does not move on (a bake's clock stops),
    no member starts towards a release it does not serve yet, none takes a rolling turn.
    Members mid-operation finish it. Refused when nothing is spreading."""
    return await _control(c, name, Control.PAUSE, trigger, body)


@router.post(
    "/v1/models/{name}/rollout/resume",
    summary="Resume a paused canary rollout.",
    tags=["fleet"],
    responses=answers((*CONTROL_REFUSALS, "rollout_not_paused")),
)
async def resume(
    name: ModelName, trigger: Caller, c: Writer, body: Controlled = None
) -> dict[str, Any]:
    """Let a paused rollout go on where it stood; the time paused does not count towards
    its bake."""
    return await _control(c, name, Control.RESUME, trigger, body)


@router.post(
    "/v1/models/{name}/rollout/promote",
    summary="Promote a canary rollout to every member.",
    tags=["fleet"],
    responses=answers((*CONTROL_REFUSALS, "no_rollout_in_progress")),
)
async def promote(
    name: ModelName, trigger: Caller, c: Writer, body: Controlled = None
) -> dict[str, Any]:
    """End the canary rollout now (canary or baking, paused or not): every member follows
    the release."""
    return await _control(c, name, Control.PROMOTE, trigger, body)


@router.post(
    "/v1/models/{name}/rollout/abort",
    summary="Abort a canary rollout and return every member to the stable release.",
    tags=["fleet"],
    responses=answers((*CONTROL_REFUSALS, "no_rollout_in_progress")),
)
async def abort(
    name: ModelName, trigger: Caller, c: Writer, body: Controlled = None
) -> dict[str, Any]:
    """Stop the canary rollout: every member that moved goes back to the stable release,
    ``rolled_back`` with a note of who and why. The release is not latched degraded: it can
    be deployed again."""
    return await _control(c, name, Control.ABORT, trigger, body)
