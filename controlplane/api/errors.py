"""The one table from error code to HTTP status, and the error body every answer uses.

Every error answer is ``{"error": {"code": ..., "message": ...}}``; a refusal that names an
operation also carries its ``operation_id``, and a failed waited operation the ``operation``.
A transient refusal answered 503 (the store or Triton is away: nothing was started) carries
``Retry-After`` (RFC 9110), so a client knows to come back, and when.
Domain errors know nothing of HTTP; this module is the only place that maps them, for the
exception handlers, for the ASGI gates that answer before a route runs (:func:`send_error`),
and for the OpenAPI document (``api/openapi.py`` derives each route's statuses from here).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import iter_route_contexts
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Send

from controlplane.domain.errors import ControlPlaneError

log = logging.getLogger(__name__)

STATUS_BY_CODE: dict[str, int] = {
    "invalid_request": 400,
    "invalid_name": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "model_not_found": 404,
    "release_not_found": 404,
    "operation_not_found": 404,
    "method_not_allowed": 405,
    "operation_in_progress": 409,
    "name_conflict": 409,
    "release_incomplete": 409,
    "release_exists": 409,  # the CLI's release publish; no route answers it
    "no_previous_release": 409,
    "no_fallback": 409,
    "insufficient_memory": 409,
    "memory_not_returned": 503,
    "would_be_an_outage": 409,
    "invalid_transition": 409,
    "release_changed": 409,
    "superseded": 409,
    "desired_state_conflict": 409,
    "no_rollout_in_progress": 409,
    "rollout_not_paused": 409,
    "rollout_already_paused": 409,
    "request_too_large": 413,
    "unsupported_media_type": 415,
    "checksum_mismatch": 422,
    "signature_missing": 422,
    "signature_invalid": 422,
    "signature_unbound": 422,
    "unknown_signer": 422,
    "release_below_floor": 422,
    "invalid_release": 422,
    "invalid_model_config": 422,
    "triton_load_failed": 422,
    "preflight_failed": 422,
    "strategy_unsupported": 422,
    "release_too_large": 422,
    "internal_error": 500,
    "rollback_failed": 502,
    "interrupted": 500,
    "staging_failed": 500,
    "triton_error": 502,
    "member_failed": 502,
    "store_error": 502,
    "triton_unavailable": 503,
    "not_ready": 503,
    "out_of_rotation": 503,
    "not_serving": 503,
    "store_unavailable": 503,
    "triton_timeout": 504,
    "budget_exceeded": 504,
    "fleet_timeout": 504,
    "insufficient_disk": 507,
}


RETRY_AFTER_SECONDS = 5  # what a 503 refusal advises: about the store's longest backoff


def status_for(code: str) -> int:
    return STATUS_BY_CODE.get(code, 500)


def statuses_for(codes: Iterable[str]) -> dict[int, list[str]]:
    """The statuses ``codes`` are answered with, each with its codes in the given order."""
    by_status: dict[int, list[str]] = {}
    for code in codes:
        if code not in STATUS_BY_CODE:
            raise KeyError(f"error code {code!r} has no status in STATUS_BY_CODE")
        named = by_status.setdefault(STATUS_BY_CODE[code], [])
        if code not in named:
            named.append(code)
    return dict(sorted(by_status.items()))


def error_body(code: str, message: str, /, **extra: Any) -> dict[str, Any]:
    """``{"error": {code, message}, **extra}``; ``extra`` may carry keys of any name (an
    error's details), so ``code`` and ``message`` are positional only and ``error`` stays ours."""
    extra.pop("error", None)
    return {"error": {"code": code, "message": message}, **extra}


def error_response(
    code: str, message: str, headers: Mapping[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(
        error_body(code, message, **extra), status_code=status_for(code), headers=headers
    )


async def send_error(
    send: Send, code: str, message: str, headers: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """Answer from an ASGI gate, before any route runs. The connection is closed after it,
    since the request's body (if any) was never read."""
    body = json.dumps(error_body(code, message)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status_for(code),
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _allowed_methods(request: Request) -> str:
    """Every method the request's path has (RFC 9110's Allow). Starlette names only those of
    the first route that matched the path, so ``GET`` and ``POST /v1/alerts`` need this. The
    app's routes are a tree (each included router one node): walked flat, every route seen."""
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.router.routes):
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ControlPlaneError)
    async def _domain(_request: Request, exc: ControlPlaneError) -> JSONResponse:
        extra: dict[str, Any] = {}
        if "operation_id" in exc.details:
            extra["operation_id"] = exc.details["operation_id"]
        headers = None
        if exc.retryable and status_for(exc.code) == 503:
            headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return error_response(exc.code, exc.message, headers, **extra)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error while answering a request", exc_info=exc)
        return error_response("internal_error", f"unexpected error: {type(exc).__name__}")

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
            problems.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
        return error_response("invalid_request", "; ".join(problems) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return error_response(
                "not_found",
                f"no route for {request.method} {request.url.path}; model and release names "
                "cannot contain '/' (see /docs)",
            )
        if exc.status_code == 405:
            return error_response(
                "method_not_allowed",
                f"{request.method} is not allowed on {request.url.path}",
                headers={"Allow": _allowed_methods(request)},
            )
        code = "unauthorized" if exc.status_code == 401 else "invalid_request"
        return JSONResponse(
            error_body(code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )
