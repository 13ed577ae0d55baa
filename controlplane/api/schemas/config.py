"""``GET /v1/config``: the running daemon's settings as they may be shown (secrets masked)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from controlplane.settings import Settings, derived, shown


class EffectiveSettings(BaseModel):
    settings: dict[str, Any] = Field(
        description="Every setting the daemon runs with, by group (as in the settings file): "
        "each secret ('api.token', 'api.read_token') is '********' when set, and so is the "
        "password of every URL."
    )
    derived: dict[str, Any] = Field(
        description="What the daemon uses where a setting is null, by the setting's dotted "
        "name (e.g. 'staging.path'), masked the same way."
    )


def effective_settings(settings: Settings) -> EffectiveSettings:
    return EffectiveSettings(settings=shown(settings), derived=derived(settings))
