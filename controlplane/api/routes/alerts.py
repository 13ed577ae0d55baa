"""Alertmanager's webhook, the alerts received, and the runbook's reload.

The webhook stores each alert (deduped on fingerprint and start) and lets the rollback
service act on a new firing one. The reload (``POST /api/v1/model/reload?target=fallback``)
is the runbook's lever for a person: it serves the fallback now, cooldown or not.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from controlplane.api.answers import RELOAD_REFUSALS, WRITE_REFUSALS, answers
from controlplane.api.deps import Caller, ModelFilter, Reader, Writer
from controlplane.api.errors import error_body, status_for
from controlplane.api.schemas.alerts import AlertmanagerNotification, alert_json
from controlplane.api.schemas.envelopes import RollbackFailure
from controlplane.api.schemas.model import rollback_result_json
from controlplane.domain.errors import InvalidRequest, NoFallback

router = APIRouter()


@router.post(
    "/v1/alerts",
    summary="Receive Alertmanager's webhook and roll back on a new firing alert.",
    tags=["alerts"],
    responses=answers(WRITE_REFUSALS),
)
async def receive_alerts(body: AlertmanagerNotification, c: Writer) -> dict[str, Any]:
    """Alertmanager's webhook (version 4): each alert stored, deduped on
    (fingerprint, startsAt); a new firing alert rolls back the model its label names,
    or every model with a fallback."""
    receipts = await c.alerts.receive([alert.to_domain() for alert in body.alerts])
    return {
        "alerts": [
            {
                "fingerprint": a.fingerprint,
                "status": a.status,
                "receipt": a.receipt.value,
                "action": a.action,
            }
            for a in receipts
        ]
    }


@router.get(
    "/v1/alerts",
    summary="List the alerts received, newest first.",
    tags=["alerts"],
    responses=answers(("invalid_request",)),
)
async def list_alerts(c: Reader, limit: Annotated[int, Query(ge=1, le=500)] = 50) -> dict[str, Any]:
    """Alerts received, newest first, with how often Alertmanager sent each."""
    return {"alerts": [alert_json(record) for record in await c.alerts.recent(limit)]}


@router.post(
    "/api/v1/model/reload",
    summary="Serve the fallback release now (the runbook's reload).",
    tags=["operations"],
    responses=answers((*WRITE_REFUSALS, *RELOAD_REFUSALS), body=RollbackFailure),
)
async def reload_fallback(
    trigger: Caller,
    c: Writer,
    target: Annotated[
        str, Query(description="What to serve now.", json_schema_extra={"enum": ["fallback"]})
    ],
    model: ModelFilter = None,
) -> JSONResponse:
    """Runbook action: serve the fallback now (``target=fallback``), for ``model`` or for
    every model with a fallback; the CPU-only reload if the fallback fails. Not held back
    by the cooldown: a person asked."""
    if target != "fallback":
        raise InvalidRequest(f"target {target[:64]!r} is not supported; use target=fallback")
    models = [model] if model is not None else await c.rollback.candidates(automatic=False)
    if not models:
        raise NoFallback(
            "no model serving here has a fallback release; name one with ?model=NAME "
            "(the CPU-only reload is tried when it has none)"
        )
    reason = f"requested through POST /api/v1/model/reload ({trigger.value})"
    results = [await c.rollback.act(name, trigger=trigger, reason=reason) for name in models]
    body = {"rollbacks": [rollback_result_json(result) for result in results]}
    if all(result.acted for result in results):
        return JSONResponse(body, status_code=200)
    return JSONResponse(
        error_body("rollback_failed", "the fallback and the CPU-only reload failed", **body),
        status_code=status_for("rollback_failed"),
    )
