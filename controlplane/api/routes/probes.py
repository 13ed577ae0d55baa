"""The probes: liveness (``/healthz``), readiness (``/readyz``) and Prometheus' ``/metrics``.

Liveness makes no call: it says what the background jobs and the reconcile loop last saw, so
it answers while Triton or the store hangs. Readiness asks Triton, and answers 503 until
start-up reconcile is done and while a managed model does not serve its desired release.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from controlplane.api.answers import answers
from controlplane.api.deps import Reader, why_not_ready
from controlplane.api.errors import error_body
from controlplane.api.schemas.health import job_json, notifications_json
from controlplane.domain.errors import TransientError
from controlplane.services.fleet_refusals import refusal_json

router = APIRouter()


@router.get(
    "/healthz", summary="Check liveness and say which background job is down.", tags=["probes"]
)
async def healthz(c: Reader) -> dict[str, Any]:
    """Liveness: the process answers. Also says which background job is down, and why
    (a job that fails is restarted; restarting the process would not help it)."""
    body: dict[str, Any] = {
        "status": "ok",
        "jobs": [job_json(s) for s in c.supervisor.statuses()],
    }
    last = c.reconciler.last  # what the reconcile loop last saw of Triton: no call here
    body["triton"] = {
        "url": c.settings.triton.grpc_url,
        "live": None if last is None else last.triton_live,
        "problem": None if last is None else last.triton_problem,
    }
    health = c.notifications() if c.notifications is not None else None
    body["store"] = {
        "uri": c.store.uri,
        "notifications": None if health is None else notifications_json(health),
    }
    if c.fleet is not None:  # what this member knows of itself, with no store read
        body["fleet"] = {
            "member": c.fleet.member.name,
            "stale": c.fleet.stale,
            "name_conflict": c.fleet.name_conflict,
            # the fleet's records this member refuses, as of its last pass
            "refused_records": [
                refusal_json(where, refusal)
                for where, refusal in sorted(c.fleet.refusals.book.now.items())
            ],
        }
    return body


@router.get(
    "/readyz",
    summary="Check readiness: reconciled, in rotation, Triton live, every model serving.",
    tags=["probes"],
    responses=answers(("not_ready", "out_of_rotation", "triton_unavailable", "not_serving")),
)
async def readyz(c: Reader) -> JSONResponse:
    """Readiness: start-up reconcile is done, no rolling update holds this member out of
    rotation, Triton is live, and every managed model serves its desired release."""
    if not c.ready.is_set():
        return JSONResponse(error_body("not_ready", why_not_ready(c)), status_code=503)
    out = c.rotation.reasons()
    if out:
        return JSONResponse(
            error_body("out_of_rotation", "; ".join(out.values()), models=out), status_code=503
        )
    problem = await c.triton.liveness()
    if problem is not None:
        return JSONResponse(error_body("triton_unavailable", problem), status_code=503)
    try:
        missing = await c.reconciler.not_serving()
    except TransientError as exc:
        return JSONResponse(error_body(exc.code, exc.message), status_code=503)
    if c.fleet is not None:
        missing = {**c.fleet.not_serving(), **missing}
    if missing:
        names = ", ".join(f"{model} ({why})" for model, why in sorted(missing.items()))
        return JSONResponse(
            error_body(
                "not_serving",
                f"{len(missing)} model(s) do not serve what they should: {names}; the "
                "reconcile loop is repairing them",
                models=missing,
            ),
            status_code=503,
        )
    return JSONResponse({"status": "ready"})


@router.get(
    "/metrics",
    summary="Export Prometheus metrics.",
    tags=["probes"],
    response_class=PlainTextResponse,
)
async def metrics(c: Reader) -> Response:
    """Prometheus metrics: operations, step durations, rollbacks, alerts, what serves."""
    body, content_type = c.telemetry.render(await c.figures.gather())
    return Response(content=body, media_type=content_type)
