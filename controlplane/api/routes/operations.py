"""Deploy, rollback and unload, and the operations they leave behind.

A mutating route starts its operation through the operation client and hands it to
:func:`answer`: 202 with the operation; with ``"wait": true`` the finished operation, 200 when
it succeeded, its error's status (with the operation) when it failed; with ``"fleet": true``,
once it succeeded here, the model across the fleet when every live member serves it. A deploy
of the release that serves already, unchanged in the store, answers 200 ``unchanged``.
Each route documents the refusals of the body gates and of a daemon still reconciling
(``WRITE_REFUSALS``); the token gate's are added to the document by ``DocumentedAPI``.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from controlplane.api.answers import (
    DEPLOY_REFUSALS,
    DEPLOYED,
    LOAD_FAILURES,
    ROLLBACK_REFUSALS,
    STARTED,
    SUCCEEDED,
    UNLOAD_FAILURES,
    UNLOAD_REFUSALS,
    WRITE_REFUSALS,
    answers,
)
from controlplane.api.deps import Caller, ModelFilter, ModelName, Reader, Writer, fleet_of
from controlplane.api.errors import error_body, status_for
from controlplane.api.schemas.envelopes import OperationEnvelope, OperationFailure
from controlplane.api.schemas.operation import operation_json
from controlplane.api.schemas.requests import (
    DeployRequest,
    FleetWait,
    RollbackRequest,
    UnloadRequest,
)
from controlplane.domain.errors import ControlPlaneError, OperationNotFound
from controlplane.domain.operations import Cause, Operation, OperationStatus, Unchanged
from controlplane.services.fleet import fleet_json_model
from controlplane.wiring import Container

router = APIRouter()


def fleet_request(c: Container, body: FleetWait) -> None:
    """Refuse a fleet wait that cannot be had, before anything starts."""
    if body.fleet:
        fleet_of(c)


async def answer(
    c: Container, operation: Operation | Unchanged, request: FleetWait
) -> JSONResponse:
    """The HTTP answer to an operation just started (see the module docstring)."""
    if isinstance(operation, Unchanged):
        body: dict[str, Any] = {
            "unchanged": True,
            "model": operation.model,
            "release": operation.release,
            "message": operation.message,
        }
        if request.fleet:
            fleet = await _fleet_wait(c, operation.model, operation.release, request)
            if isinstance(fleet, JSONResponse):
                return fleet
            body["fleet"] = fleet
        return JSONResponse(body, status_code=200)
    if not (request.wait or request.fleet):  # waiting for the fleet waits for this member
        return JSONResponse({"operation": operation_json(operation)}, status_code=202)
    outcome = await c.client.wait(operation.id)
    done = outcome.operation or await c.deploy.get_operation(operation.id)
    body = {"operation": operation_json(done)}
    if done.status is not OperationStatus.SUCCEEDED:
        code = done.error.code if done.error else "internal_error"
        message = done.error.message if done.error else done.status.value
        return JSONResponse(error_body(code, message, **body), status_code=status_for(code))
    if request.fleet:
        fleet = await _fleet_wait(c, done.model, done.release, request, **body)
        if isinstance(fleet, JSONResponse):
            return fleet
        body["fleet"] = fleet
    return JSONResponse(body, status_code=200)


async def _fleet_wait(
    c: Container, model: str, release: str | None, request: FleetWait, **body: Any
) -> dict[str, Any] | JSONResponse:
    """The model across the fleet once every member serves it; an error answer when one
    cannot, or not within the bound."""
    try:
        snapshot = await fleet_of(c).wait_for(model, release, request.fleet_timeout_seconds)
    except ControlPlaneError as exc:
        return JSONResponse(
            error_body(exc.code, exc.message, **{**exc.details, **body}),
            status_code=status_for(exc.code),
        )
    return fleet_json_model(snapshot, model)


@router.post(
    "/v1/models/{name}/deploy",
    summary="Deploy a release of a model.",
    tags=["operations"],
    status_code=202,
    responses={
        **STARTED,
        **DEPLOYED,
        **answers((*WRITE_REFUSALS, *DEPLOY_REFUSALS), LOAD_FAILURES, body=OperationFailure),
    },
)
async def deploy(name: ModelName, body: DeployRequest, trigger: Caller, c: Writer) -> JSONResponse:
    """Serve ``release`` of model ``name``."""
    fleet_request(c, body)
    operation = await c.client.start(
        partial(
            c.deploy.deploy,
            name,
            body.release,
            trigger=trigger,
            force=body.force,
            cause=Cause(reason=body.reason),
            patient=body.wait or body.fleet,  # a caller that waits rides out an outage
        ),
        # A deploy (a rollback, an unload) waits for an old slot being freed, not refused.
        patience=c.deploy.behind_housekeeping(name),
    )
    return await answer(c, operation, body)


@router.post(
    "/v1/models/{name}/rollback",
    summary="Roll a model back to its previous release (or a named one).",
    tags=["operations"],
    status_code=202,
    responses={
        **STARTED,
        **DEPLOYED,
        **answers((*WRITE_REFUSALS, *ROLLBACK_REFUSALS), LOAD_FAILURES, body=OperationFailure),
    },
)
async def rollback(
    name: ModelName, body: RollbackRequest, trigger: Caller, c: Writer
) -> JSONResponse:
    """Serve the previous release again (or the one named in ``to``)."""
    fleet_request(c, body)
    operation = await c.client.start(
        partial(
            c.deploy.rollback,
            name,
            to=body.to,
            trigger=trigger,
            cause=Cause(reason=body.reason),
            patient=body.wait or body.fleet,
        ),
        patience=c.deploy.behind_housekeeping(name),  # as a deploy: a retire is no refusal
    )
    return await answer(c, operation, body)


@router.post(
    "/v1/models/{name}/unload",
    summary="Unload a model from Triton and remove it from the repository.",
    tags=["operations"],
    status_code=202,
    responses={
        **STARTED,
        **SUCCEEDED,
        **answers((*WRITE_REFUSALS, *UNLOAD_REFUSALS), UNLOAD_FAILURES, body=OperationFailure),
    },
)
async def unload(name: ModelName, body: UnloadRequest, trigger: Caller, c: Writer) -> JSONResponse:
    """Unload the model from Triton and remove its dir from the repository."""
    fleet_request(c, body)
    operation = await c.client.start(
        partial(c.deploy.unload, name, trigger=trigger, cause=Cause(reason=body.reason)),
        patience=c.deploy.behind_housekeeping(name),
    )
    return await answer(c, operation, body)


@router.get(
    "/v1/operations/{operation_id}",
    summary="Show one operation with its steps and outcome.",
    tags=["operations"],
    responses={
        200: {"model": OperationEnvelope, "description": "The operation."},
        **answers(("operation_not_found",)),
    },
)
async def get_operation(operation_id: str, c: Reader) -> dict[str, Any]:
    """One operation with its steps, timings, trigger and outcome."""
    if not (len(operation_id) <= 64 and operation_id.isalnum()):
        raise OperationNotFound(f"no operation with id {operation_id[:64]!r}")
    return {"operation": operation_json(await c.deploy.get_operation(operation_id))}


@router.get(
    "/v1/operations",
    summary="List recent operations, newest first.",
    tags=["operations"],
    responses=answers(("invalid_request", "invalid_name")),
)
async def list_operations(
    c: Reader,
    model: ModelFilter = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 20,
) -> dict[str, Any]:
    """Recent operations, newest first, optionally for one model."""
    operations = await c.deploy.list_operations(model, limit)
    return {"operations": [operation_json(op) for op in operations]}
