"""The running daemon's settings, so a person or a tool asks the daemon rather than guessing
from an environment that may not be the one it started in.

The answer is the same masked tree ``controlplane config --effective`` prints
(:func:`~controlplane.settings.shown`): it is a read, behind the read token when one is set,
and it never carries a token or a password.
"""

from __future__ import annotations

from fastapi import APIRouter

from controlplane.api.deps import Configured
from controlplane.api.schemas.config import EffectiveSettings, effective_settings

router = APIRouter()


@router.get(
    "/v1/config",
    tags=["config"],
    summary="Show the settings this daemon runs with, secrets masked.",
    response_model=EffectiveSettings,
)
async def get_config(settings: Configured) -> EffectiveSettings:
    """Every setting as the daemon loaded it at start-up (defaults < its settings file <
    its ``CONTROLPLANE_*`` variables), with each secret and each password in a URL shown as
    ``********``; ``controlplane config --effective --url URL`` prints it as YAML."""
    return effective_settings(settings)
