"""The app: the daemon's lifetime, the API's routers, and the gates in front of them.

The lifespan builds the services, runs start-up reconcile and the other background jobs under
a supervisor (``/readyz`` answers 503 until start-up reconcile is done and while a managed
model does not serve), and stops every background task on shutdown. The routes live in
``api/routes/``, one router per thing they serve, and share ``api/deps.py``.

Requests pass three ASGI gates before any route, in this order: the tokens (401 or 403, from
the headers alone), the media type (415), the body's size (413). Each route names the error codes
it can answer (``api/answers.py``); the OpenAPI document derives its statuses from them.
Pages for people live beside the API, out of its document: the status page at ``/``
(``api/page``) and Swagger UI at ``/docs`` from files that ship with the daemon
(``api/docs.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from fastapi import FastAPI

from controlplane import __version__
from controlplane.api.docs import install_docs
from controlplane.api.errors import install_handlers
from controlplane.api.limits import BodyLimit
from controlplane.api.media import JsonBodies
from controlplane.api.model_pages import ModelPages
from controlplane.api.openapi import DocumentedAPI
from controlplane.api.page.routes import install_page
from controlplane.api.routes import alerts, config, fleet, models, operations, probes, rollout
from controlplane.api.security import Authenticate
from controlplane.settings import Settings
from controlplane.wiring import build

# In the order the routes were declared in, which is the order of the OpenAPI document.
ROUTERS = (
    probes.router,
    fleet.router,
    models.router,
    operations.router,
    rollout.router,
    alerts.router,
    config.router,
)


def create_app(settings: Settings) -> FastAPI:
    token = settings.api.token.get_secret_value() if settings.api.token else None
    read_token = settings.api.read_token.get_secret_value() if settings.api.read_token else None
    app = DocumentedAPI(
        bearer=token is not None,
        reads_guarded=read_token is not None,
        title="controlplane",
        version=__version__,
        description="Safe, fast model updates for NVIDIA Triton Inference Server.",
        lifespan=_lifespan(settings),
        strict_content_type=False,  # a JSON body without Content-Type is read as JSON
        docs_url=None,  # FastAPI's docs pages load from a CDN: api/docs.py serves them offline
        redoc_url=None,
    )
    app.state.settings = settings  # what GET /v1/config shows, masked
    install_handlers(app)
    install_docs(app)
    install_page(app)  # the status page at /
    app.state.model_pages = ModelPages()  # each model's JSON, kept while its view is unchanged
    for router in ROUTERS:
        app.include_router(router)
    # Added innermost first: the token is checked before the media type, the size after both.
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes)
    app.add_middleware(JsonBodies)
    app.add_middleware(Authenticate, token=token, read_token=read_token)
    return app


def _lifespan(settings: Settings) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The daemon's lifetime: the container built, its jobs run, then stopped and closed."""

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

    return lifespan
