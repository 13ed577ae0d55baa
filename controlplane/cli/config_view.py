"""``controlplane config --effective``: the settings a daemon would run with, as YAML.

The settings are loaded as ``serve`` loads them (defaults < the YAML file < ``CONTROLPLANE_*``
variables), validated the same way, and printed group by group. A value that is not the
default says where it came from in a comment (the variable, or the file); secrets (every
``SecretStr``: ``api.token``, ``api.read_token``) are printed as ``'********'`` when set, and so
is the password of any URL (``http://admin:********@prometheus:9090``), so the output can be
pasted into an issue. Scalars are written as JSON, which YAML reads, so the output loads back as
the same values (the secrets aside).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretStr

from controlplane.settings import MASK, Settings, env_name, load_settings, mask_passwords


def render_effective(config_file: Path | None) -> str:
    """The merged settings as YAML; :class:`~controlplane.settings.SettingsError` when they
    are not valid (as ``serve`` would refuse them)."""
    settings = load_settings(config_file)
    from_file = _file_data(config_file)
    variables = {name.upper() for name in os.environ}
    sources = _Sources(variables, from_file, str(config_file) if config_file else None)
    sources.derived = _derived(settings)
    where = f" < {config_file}" if config_file is not None else ""
    out = [
        "# controlplane: the effective settings (defaults" + where + " < environment).",
        f"# Secrets (tokens, passwords in URLs) are shown as {MASK}; a comment names where "
        "each value that is not the default came from.",
    ]
    for name, field in Settings.model_fields.items():
        value = getattr(settings, name)
        default = field.get_default(call_default_factory=True) if not field.is_required() else None
        if isinstance(value, BaseModel):
            out.append("")
            out.append(f"{name}:")
            out += _group(value, default, (name,), sources, indent=1)
        elif name == "models":
            out.append("")
            out += _models(value, sources)
    return "\n".join(out) + "\n"


class _Sources:
    """Where a setting's value came from: a variable, the file, or neither (the default)."""

    def __init__(self, variables: set[str], data: Mapping[str, Any], file: str | None) -> None:
        self._variables = variables
        self._data = data
        self._file = file
        self.derived: dict[tuple[str, ...], object] = {}  # null values the daemon fills in

    def of(self, path: tuple[str, ...]) -> str | None:
        variable = env_name(*path)
        if variable in self._variables:
            return variable
        node: Any = self._data
        for part in path:
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return self._file


def _group(
    value: BaseModel,
    default: Any,
    path: tuple[str, ...],
    sources: _Sources,
    *,
    indent: int,
) -> list[str]:
    pad = "  " * indent
    lines = []
    for name in type(value).model_fields:
        current = getattr(value, name)
        was = getattr(default, name, None) if isinstance(default, BaseModel) else None
        here = (*path, name)
        if isinstance(current, BaseModel):
            lines.append(f"{pad}{name}:")
            lines += _group(current, was, here, sources, indent=indent + 1)
            continue
        line = f"{pad}{name}: {_scalar(current)}"
        source = sources.of(here) if current != was or default is None else None
        if source is not None:
            line += f"  # from {source}"
        elif current is None and sources.derived.get(here) is not None:
            line += f"  # that is: {mask_passwords(str(sources.derived[here]))}"
        lines.append(line)
    return lines


def _models(models: Mapping[str, BaseModel], sources: _Sources) -> list[str]:
    """Each model's own policy: it replaces model_defaults as a whole, so its defaults are the
    policy's own."""
    if not models:
        return ["models: {}"]
    lines = ["models:"]
    for name, policy in models.items():
        lines.append(f"  {json.dumps(name)}:")
        lines += _group(policy, type(policy)(), ("models", name), sources, indent=2)
    return lines


def _derived(settings: Settings) -> dict[tuple[str, ...], object]:
    """What the daemon uses where a setting is left null."""
    metrics = settings.triton.metrics_url
    return {
        ("staging", "path"): settings.staging_path,
        ("database", "path"): settings.database_path,
        ("fleet", "member"): settings.member_name,
        ("fleet", "advertise_url"): settings.fleet_url,
        ("rollback", "metrics_url"): metrics if settings.rollback.source == "triton" else None,
        ("memory", "gpu_metrics_url"): metrics,
    }


def _scalar(value: Any) -> str:
    if isinstance(value, SecretStr):
        return json.dumps(MASK)
    if isinstance(value, Path):
        return json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(mask_passwords(value))
    if isinstance(value, tuple):
        return json.dumps(list(value))
    return json.dumps(value)


def _file_data(config_file: Path | None) -> Mapping[str, Any]:
    if config_file is None:
        return {}
    data = yaml.safe_load(config_file.read_text(encoding="utf-8"))  # read already: it loads
    return data if isinstance(data, dict) else {}
