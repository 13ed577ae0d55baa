"""What each model serves, and Triton's memory after the swaps.

``GET /v1/models`` answers a page at a time from what was seen last (the release watcher's
listing, Triton's index of at most a second ago) and renders through the app's
:class:`~controlplane.api.model_pages.ModelPages`, which keeps each model's JSON while its view
is unchanged. ``GET /v1/models/{name}`` reads the store and Triton.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from controlplane.api.answers import answers
from controlplane.api.deps import ModelName, Reader
from controlplane.api.model_pages import ModelPages
from controlplane.api.schemas.memory import leak_trend_json, memory_sample_json
from controlplane.api.schemas.model import model_json
from controlplane.api.schemas.names import MODEL_NAME_SCHEMA

DEFAULT_PAGE, MAX_PAGE = 100, 1000  # models per answer of GET /v1/models

router = APIRouter()


def model_pages(request: Request) -> ModelPages:
    """The app's one renderer of model pages (``create_app`` builds it)."""
    found: ModelPages = request.app.state.model_pages
    return found


@router.get(
    "/v1/memory",
    summary="Show Triton's memory after recent swaps and the leak trend.",
    tags=["models"],
)
async def memory(c: Reader) -> dict[str, Any]:
    """Triton's memory after recent swaps, the leak trend, and whether the audit can see
    Triton's processes."""
    skipped = await asyncio.to_thread(c.memory.skipped)
    return {
        "audit": {"active": skipped is None, "skipped": skipped},
        "samples": [memory_sample_json(s) for s in await c.memory.recent()],
        "trends": [leak_trend_json(t) for t in await c.memory.trends()],
    }


@router.get(
    "/v1/models",
    summary="List the models: what serves, what Triton says, the releases.",
    tags=["models"],
    response_model=dict[str, Any],
    responses=answers(("invalid_request", "invalid_name")),
)
async def list_models(
    c: Reader,
    pages: Annotated[ModelPages, Depends(model_pages)],
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
    saved since); `as_of` says when: `store` (the watcher's last look; with a store's events
    it trusts, inotify or a queue of the member's own, one at the models that changed),
    `store_full_scan` (its last look at every model) and `triton`. `ignored_models` lists
    the store's dirs (or S3 prefixes) that the watcher's last listing left out because their
    names are no model's, each with the rule it breaks (at most 100, the first by name; the
    log names each once); each model's `ignored_releases` does the same for its release
    dirs. `GET /v1/models/{name}` reads the store and Triton."""
    page = await c.status.list_models(limit=limit, after=after)
    return Response(content=pages.render(page), media_type="application/json")


@router.get(
    "/v1/models/{name}",
    summary="Show one model: its releases, Triton's state, its last operation.",
    tags=["models"],
    responses=answers(("invalid_name", "model_not_found")),
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
