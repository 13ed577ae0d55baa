"""The settings as they may be shown outside the process: a JSON tree with every secret masked.

One walk over the settings decides what is shown: a ``SecretStr`` (``api.token``,
``api.read_token``) becomes :data:`~controlplane.settings.masking.MASK` when set, and every
string passes through :func:`~controlplane.settings.masking.mask_passwords`, so a password in a
URL never leaves. ``controlplane config --effective`` prints this tree for the local settings
and ``GET /v1/config`` answers it for the running daemon's, so the two cannot mask differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from controlplane.settings.masking import MASK, mask_passwords
from controlplane.settings.root import Settings


def shown(value: object) -> Any:
    """``value`` (settings, a group, or one setting) as JSON-ready data, secrets masked."""
    if isinstance(value, BaseModel):
        return {name: shown(getattr(value, name)) for name in type(value).model_fields}
    if isinstance(value, Mapping):
        return {str(key): shown(item) for key, item in value.items()}
    if isinstance(value, tuple | list | set | frozenset):
        return [shown(item) for item in value]
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, Path):
        return mask_passwords(str(value))
    if isinstance(value, str):
        return mask_passwords(value)
    return value


def derived(settings: Settings) -> dict[str, Any]:
    """What the daemon uses where a setting is left null, by the setting's dotted name."""
    metrics = settings.triton.metrics_url
    found = {
        "staging.path": settings.staging_path,
        "database.path": settings.database_path,
        "fleet.member": settings.member_name,
        "fleet.advertise_url": settings.fleet_url,
        "rollback.metrics_url": metrics if settings.rollback.source == "triton" else None,
        "memory.gpu_metrics_url": metrics,
    }
    return {name: shown(value) for name, value in found.items() if value is not None}
