"""The fleet as this member reads it from the store, and the wake its peers send it.

Both answer 400 ``invalid_request`` on a daemon that is no fleet's member. The wake carries
nothing and needs no token (``api/security.py``): a member never sends its token to an
address read from the store.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from controlplane.api.answers import answers
from controlplane.api.deps import Reader, fleet_of
from controlplane.services.fleet import fleet_json

router = APIRouter()


@router.get(
    "/v1/fleet",
    summary="Show the fleet's members and every model's desired state.",
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


@router.post(
    "/v1/fleet/wake",
    summary="Read the fleet's desired state now (another member changed it).",
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
