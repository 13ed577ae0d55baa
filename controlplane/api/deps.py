"""What the routes share: the settings, the container, the readiness gate for writers, the
documented name parameters, the trigger a request carries, and the one account of why the
daemon is not ready.

The container is built by the app's lifespan and kept on ``app.state``; a route asks for it as
a ``Reader`` or, when it changes something, as a ``Writer``: a write is refused with 503
``not_ready``, saying why, until start-up reconcile is done. The settings are kept there by
``create_app`` itself (``Configured``), so they are known before the lifespan runs.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Query, Request

from controlplane.api.schemas.names import MODEL_NAME_SCHEMA
from controlplane.domain.errors import InvalidRequest, TransientError
from controlplane.domain.operations import Trigger
from controlplane.services.fleet import FleetService
from controlplane.settings import Settings
from controlplane.wiring import Container

CLIENT_HEADER = "x-controlplane-client"
SLOW_ANSWER = 1.0  # a liveness check unanswered this long is said to be waiting for Triton


class NotReady(TransientError):
    code = "not_ready"


def container(request: Request) -> Container:
    found: Container = request.app.state.container
    return found


def settings_of(request: Request) -> Settings:
    """The settings the app was made with: known before the lifespan builds the container."""
    found: Settings = request.app.state.settings
    return found


def ready_container(request: Request) -> Container:
    found = container(request)  # the token was checked before the request got here
    if not found.ready.is_set():
        raise NotReady(why_not_ready(found))
    return found


def trigger_of(request: Request) -> Trigger:
    """Who asked: the CLI says so in a header; anything else is a caller of the API."""
    return Trigger.CLI if request.headers.get(CLIENT_HEADER) == "cli" else Trigger.API


Reader = Annotated[Container, Depends(container)]
Writer = Annotated[Container, Depends(ready_container)]
Caller = Annotated[Trigger, Depends(trigger_of)]
Configured = Annotated[Settings, Depends(settings_of)]
ModelName = Annotated[
    str, Path(description="The model's name.", json_schema_extra=MODEL_NAME_SCHEMA)
]
ModelFilter = Annotated[
    str | None, Query(description="Only this model.", json_schema_extra=MODEL_NAME_SCHEMA)
]


def fleet_of(c: Container) -> FleetService:
    """The fleet this daemon is a member of; refused (400) when it is none's."""
    if c.fleet_view is None:
        raise InvalidRequest(
            "this daemon is not a member of a fleet (fleet.enabled: false): its desired state "
            "lives in its own database; see GET /v1/models, and leave out 'fleet': true (the "
            "CLI's --fleet) to wait for this daemon alone"
        )
    return c.fleet_view


def why_not_ready(c: Container) -> str:
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
