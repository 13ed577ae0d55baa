"""The REST API: thin routes that parse, call a service, and render.

Mutating routes answer 202 with the operation, or, with ``"wait": true``, the finished
operation: 200 when it succeeded, the error's status (with the operation) when it failed.
The app owns the daemon's lifetime: the lifespan builds the services, runs start-up
reconcile and the other background jobs under a supervisor (``/readyz`` answers 503 until
start-up reconcile is done and while a managed model does not serve), and stops every
background task on shutdown.

Requests pass three ASGI gates before any route, in this order: the tokens (401 or 403, from
the headers alone), the media type (415), the body's size (413). Each route names the error codes
it can answer (``api/answers.py``); the OpenAPI document derives its statuses from them.
Pages for people live beside the API, out of its document: the status page at ``/``
(``api/page``) and Swagger UI at ``/docs`` from files that ship with the daemon
(``api/docs.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from controlplane import __version__
from controlplane.api.answers import (
    DEPLOY_REFUSALS,
    DEPLOYED,
    LOAD_FAILURES,
    RELOAD_REFUSALS,
    ROLLBACK_REFUSALS,
    STARTED,
    SUCCEEDED,
    UNLOAD_FAILURES,
    UNLOAD_REFUSALS,
    WRITE_REFUSALS,
    answers,
)
from controlplane.api.docs import install_docs
from controlplane.api.errors import error_body, install_handlers, status_for
from controlplane.api.limits import BodyLimit
from controlplane.api.media import JsonBodies
from controlplane.api.model_pages import ModelPages
from controlplane.api.openapi import DocumentedAPI
from controlplane.api.page.routes import install_page
from controlplane.api.schemas import (
    MODEL_NAME_SCHEMA,
    AlertmanagerNotification,
    DeployRequest,
    FleetWait,
    OperationEnvelope,
    OperationFailure,
    RollbackFailure,
    RollbackRequest,
    UnloadRequest,
    alert_json,
    job_json,
    leak_trend_json,
    memory_sample_json,
    model_json,
    notifications_json,
    operation_json,
    rollback_result_json,
)
from controlplane.api.security import Authenticate
from controlplane.domain.errors import (
    ControlPlaneError,
    InvalidRequest,
    NoFallback,
    OperationNotFound,
    TransientError,
)
from controlplane.domain.operations import Cause, Operation, OperationStatus, Trigger, Unchanged
from controlplane.services.fleet import FleetService, fleet_json, fleet_json_model
from controlplane.settings import Settings
from controlplane.wiring import Container, build

log = logging.getLogger(__name__)
CLIENT_HEADER = "x-controlplane-client"
SLOW_ANSWER = 1.0  # a liveness check unanswered this long is said to be waiting for Triton
DEFAULT_PAGE, MAX_PAGE = 100, 1000  # models per answer of GET /v1/models


class NotReady(TransientError):
    code = "not_ready"


def _container(request: Request) -> Container:
    found: Container = request.app.state.container
    return found


def _mutating(request: Request) -> Container:
    found = _container(request)  # the token was checked before the request got here
    if not found.ready.is_set():
        raise NotReady(_starting(found))
    return found


def fleet_of(c: Container) -> FleetService:
    if c.fleet_view is None:
        raise InvalidRequest(
            "this daemon is not a member of a fleet (fleet.enabled: false): its desired state "
            "lives in its own database; see GET /v1/models"
        )
    return c.fleet_view


def fleet_request(c: Container, body: FleetWait) -> None:
    """Refuse a fleet wait that cannot be had, before anything starts."""
    if body.fleet:
        fleet_of(c)


def _starting(c: Container) -> str:
    """Why the daemon is not ready yet: Triton cannot be reached (or has not answered yet),
    start-up reconcile runs, or keeps failing."""
    last = c.reconciler.last
    url = c.settings.triton.grpc_url
    if last is not None and not last.triton_live:
        problem = last.triton_problem or f"Triton at {url} is not live (triton.grpc_url)"
        return f"{problem}. Start-up waits for Triton: retry once it can be reached"
    waited = c.reconciler.waiting_for_triton() or 0.0
    if last is None and waited >= SLOW_ANSWER:
        return (
            f"Triton at {url} has not answered for {waited:.0f} s (triton.grpc_url; a call "
            f"gives up after {c.settings.triton.call_timeout_seconds:g} s, "
            "triton.call_timeout_seconds); start-up waits for it"
        )
    job = next((s for s in c.supervisor.statuses() if s.name == "reconcile"), None)
    if job is not None and job.last_error is not None:
        return (
            f"start-up reconcile failed ({job.last_error}); it is retried "
            f"(Triton at {c.settings.triton.grpc_url}); retry in a few seconds"
        )
    return "the daemon is reconciling at start-up; retry in a few seconds"


Reader = Annotated[Container, Depends(_container)]
Writer = Annotated[Container, Depends(_mutating)]
ModelName = Annotated[
    str, Path(description="The model's name.", json_schema_extra=MODEL_NAME_SCHEMA)
]
ModelFilter = Annotated[
    str | None, Query(description="Only this model.", json_schema_extra=MODEL_NAME_SCHEMA)
]


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        container = build(settings)
        app.state.container = container
        jobs = asyncio.create_task(container.supervisor.run(), name="supervisor")
        try:
            yield
        finally:
            jobs.cancel()
            await asyncio.gather(jobs, return_exceptions=True)
            await container.close()

    token = settings.api.token.get_secret_value() if settings.api.token else None
    read_token = settings.api.read_token.get_secret_value() if settings.api.read_token else None
    app = DocumentedAPI(
        bearer=token is not None,
        reads_guarded=read_token is not None,
        title="controlplane",
        version=__version__,
        description="Safe, fast model updates for NVIDIA Triton Inference Server.",
        lifespan=lifespan,
        strict_content_type=False,  # a JSON body without Content-Type is read as JSON
        docs_url=None,  # FastAPI's docs pages load from a CDN: api/docs.py serves them offline
        redoc_url=None,
    )
    install_handlers(app)
    install_docs(app)
    install_page(app)  # the status page at /
    pages = ModelPages()  # each model's JSON, kept while its view is unchanged
    writes = WRITE_REFUSALS  # the token gate's refusals are documented by DocumentedAPI

    def trigger_of(request: Request) -> Trigger:
        return Trigger.CLI if request.headers.get(CLIENT_HEADER) == "cli" else Trigger.API

    async def answer(
        c: Container, operation: Operation | Unchanged, request: FleetWait
    ) -> JSONResponse:
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

    @app.get("/healthz", tags=["probes"])
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
            }
        return body

    @app.get(
        "/readyz",
        tags=["probes"],
        responses=answers(("not_ready", "triton_unavailable", "not_serving")),
    )
    async def readyz(c: Reader) -> JSONResponse:
        """Readiness: start-up reconcile is done, Triton is live, and every managed model
        serves its desired release."""
        if not c.ready.is_set():
            return JSONResponse(error_body("not_ready", _starting(c)), status_code=503)
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

    @app.get("/metrics", tags=["probes"], response_class=PlainTextResponse)
    async def metrics(c: Reader) -> Response:
        """Prometheus metrics: operations, step durations, rollbacks, alerts, what serves."""
        body, content_type = c.telemetry.render(await c.figures.gather())
        return Response(content=body, media_type=content_type)

    @app.get(
        "/v1/fleet",
        tags=["fleet"],
        responses=answers(("invalid_request", "store_error", "store_unavailable")),
    )
    async def fleet(c: Reader) -> dict[str, Any]:
        """The fleet: every member (alive or not, what it serves per model, its GPU verdict)
        and every model's desired state (release, generation, whether every live member serves
        it, the rollout phase), read from the store."""
        service = fleet_of(c)
        return fleet_json(
            await service.snapshot(), stale=service.stale, name_conflict=service.name_conflict
        )

    @app.post(
        "/v1/fleet/wake",
        tags=["fleet"],
        status_code=202,
        # No token (api/security.py); the body gates still stand in front of it.
        responses=answers(("invalid_request", "unsupported_media_type", "request_too_large")),
    )
    async def fleet_wake(c: Reader) -> dict[str, Any]:
        """Read the fleet's desired state now rather than at the next poll: another member
        changed it. It carries nothing and needs no token (the members never send theirs to
        an address read from the store); woken more than once a second, this member reads at
        most once a second."""
        member = fleet_of(c).member  # refused when this daemon is not a fleet's member
        if c.fleet is not None:
            c.fleet.poke()
        return {"member": member, "woken": True}

    @app.get("/v1/memory", tags=["models"])
    async def memory(c: Reader) -> dict[str, Any]:
        """Triton's memory after recent swaps, the leak trend, and whether the audit can see
        Triton's processes."""
        skipped = await asyncio.to_thread(c.memory.skipped)
        return {
            "audit": {"active": skipped is None, "skipped": skipped},
            "samples": [memory_sample_json(s) for s in await c.memory.recent()],
            "trends": [leak_trend_json(t) for t in await c.memory.trends()],
        }

    @app.get(
        "/v1/models",
        tags=["models"],
        response_model=dict[str, Any],
        responses=answers(("invalid_request", "invalid_name")),
    )
    async def list_models(
        c: Reader,
        limit: Annotated[
            int, Query(ge=1, le=MAX_PAGE, description="At most this many models in the answer.")
        ] = DEFAULT_PAGE,
        after: Annotated[
            str | None,
            Query(
                description="Only models after this one: the previous answer's `next`.",
                json_schema_extra=MODEL_NAME_SCHEMA,
            ),
        ] = None,
    ) -> Response:
        """Every model managed here or present in the store, in natural name order, a page at
        a time: `models` holds at most `limit` of them, and `next` is the value to pass as
        `after` for the next page (null on the last one). A store of up to 100 models fits the
        default page. Releases are those the release watcher listed at its last look, Triton's
        states those of an index read at most a second ago (none of the daemon's operations
        saved since); `as_of` says when: `store` (the watcher's last look; with a local store's
        events, one at the models that changed), `store_full_scan` (its last look at every
        model) and `triton`. `ignored_models` lists the store's dirs (or S3 prefixes) that
        the watcher's last listing left out because their names are no model's, each with the
        rule it breaks (at most 100, the first by name; the log names each once); each model's
        `ignored_releases` does the same for its release dirs. `GET /v1/models/{name}` reads
        the store and Triton."""
        page = await c.status.list_models(limit=limit, after=after)
        return Response(content=pages.render(page), media_type="application/json")

    @app.get(
        "/v1/models/{name}", tags=["models"], responses=answers(("invalid_name", "model_not_found"))
    )
    async def get_model(name: ModelName, c: Reader) -> dict[str, Any]:
        """One model: active and previous release, Triton's state, releases in the store (and
        in `ignored_releases`, at most 100, the release dirs or prefixes left out because their
        names are no release's, with the rule each breaks), and (in a fleet) what the fleet
        wants of this member and whether it can read the store."""
        body = model_json(await c.status.get_model(name))
        if c.fleet is not None:
            body["fleet"] = c.fleet.model_status(name)
        return body

    @app.post(
        "/v1/models/{name}/deploy",
        tags=["operations"],
        status_code=202,
        responses={
            **STARTED,
            **DEPLOYED,
            **answers((*writes, *DEPLOY_REFUSALS), LOAD_FAILURES, body=OperationFailure),
        },
    )
    async def deploy(
        name: ModelName, body: DeployRequest, request: Request, c: Writer
    ) -> JSONResponse:
        """Serve ``release`` of model ``name``."""
        fleet_request(c, body)
        operation = await c.client.start(
            partial(
                c.deploy.deploy,
                name,
                body.release,
                trigger=trigger_of(request),
                force=body.force,
                cause=Cause(reason=body.reason),
                patient=body.wait or body.fleet,  # a caller that waits rides out an outage
            ),
            # A deploy waits for an old slot being freed, rather than refused for it.
            patience=c.deploy.behind_housekeeping(name),
        )
        return await answer(c, operation, body)

    @app.post(
        "/v1/models/{name}/rollback",
        tags=["operations"],
        status_code=202,
        responses={
            **STARTED,
            **DEPLOYED,
            **answers((*writes, *ROLLBACK_REFUSALS), LOAD_FAILURES, body=OperationFailure),
        },
    )
    async def rollback(
        name: ModelName, body: RollbackRequest, request: Request, c: Writer
    ) -> JSONResponse:
        """Serve the previous release again (or the one named in ``to``)."""
        fleet_request(c, body)
        operation = await c.client.start(
            partial(
                c.deploy.rollback,
                name,
                to=body.to,
                trigger=trigger_of(request),
                cause=Cause(reason=body.reason),
                patient=body.wait or body.fleet,
            )
        )
        return await answer(c, operation, body)

    @app.post(
        "/v1/models/{name}/unload",
        tags=["operations"],
        status_code=202,
        responses={
            **STARTED,
            **SUCCEEDED,
            **answers((*writes, *UNLOAD_REFUSALS), UNLOAD_FAILURES, body=OperationFailure),
        },
    )
    async def unload(
        name: ModelName, body: UnloadRequest, request: Request, c: Writer
    ) -> JSONResponse:
        """Unload the model from Triton and remove its dir from the repository."""
        fleet_request(c, body)
        operation = await c.client.start(
            partial(
                c.deploy.unload, name, trigger=trigger_of(request), cause=Cause(reason=body.reason)
            )
        )
        return await answer(c, operation, body)

    @app.get(
        "/v1/operations/{operation_id}",
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

    @app.get(
        "/v1/operations",
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

    @app.post("/v1/alerts", tags=["alerts"], responses=answers(writes))
    async def receive_alerts(body: AlertmanagerNotification, c: Writer) -> dict[str, Any]:
        """Alertmanager's webhook (version 4): each alert stored, deduped on
        (fingerprint, startsAt); a new firing alert rolls back the model its label names,
        or every model with a fallback."""
        answers = await c.alerts.receive([alert.to_domain() for alert in body.alerts])
        return {
            "alerts": [
                {
                    "fingerprint": a.fingerprint,
                    "status": a.status,
                    "receipt": a.receipt.value,
                    "action": a.action,
                }
                for a in answers
            ]
        }

    @app.get("/v1/alerts", tags=["alerts"], responses=answers(("invalid_request",)))
    async def list_alerts(
        c: Reader, limit: Annotated[int, Query(ge=1, le=500)] = 50
    ) -> dict[str, Any]:
        """Alerts received, newest first, with how often Alertmanager sent each."""
        return {"alerts": [alert_json(record) for record in await c.alerts.recent(limit)]}

    @app.post(
        "/api/v1/model/reload",
        tags=["operations"],
        responses=answers((*writes, *RELOAD_REFUSALS), body=RollbackFailure),
    )
    async def reload_fallback(
        request: Request,
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
        reason = f"requested through POST /api/v1/model/reload ({trigger_of(request).value})"
        results = [
            await c.rollback.act(name, trigger=trigger_of(request), reason=reason)
            for name in models
        ]
        body = {"rollbacks": [rollback_result_json(result) for result in results]}
        if all(result.acted for result in results):
            return JSONResponse(body, status_code=200)
        return JSONResponse(
            error_body("rollback_failed", "the fallback and the CPU-only reload failed", **body),
            status_code=status_for("rollback_failed"),
        )

    # Added innermost first: the token is checked before the media type, the size after both.
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes)
    app.add_middleware(JsonBodies)
    app.add_middleware(Authenticate, token=token, read_token=read_token)
    return app
