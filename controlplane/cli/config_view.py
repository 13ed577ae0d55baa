"""``controlplane config --effective``: the settings a daemon runs with, as YAML.

Locally, the settings are loaded as ``serve`` loads them (defaults < the YAML file <
``CONTROLPLANE_*`` variables), validated the same way, and printed group by group; a value that
is not the default says where it came from in a comment (the variable, or the file). With
``--url``, the settings are the running daemon's (``GET /v1/config``) and such a value says it
came from the running daemon. Either way the values are the settings as they may be shown
(:func:`~controlplane.settings.shown`): secrets (``api.token``, ``api.read_token``) are
``'********'`` when set, and so is the password of any URL (``http://admin:********@prom:9090``),
so the output can be pasted into an issue. Scalars are written as JSON, which YAML reads, so the
output loads back as the same values (the secrets aside).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeGuard

import yaml
from pydantic import BaseModel

from controlplane.settings import (
    MASK,
    ModelPolicy,
    Settings,
    derived,
    env_name,
    load_settings,
    mask_passwords,
    shown,
)

SECRETS_LINE = (
    f"# Secrets (tokens, passwords in URLs) are shown as {MASK}; a comment names where "
    "each value that is not the default came from."
)
DAEMON = "the running daemon"

SourceOf = Callable[[tuple[str, ...]], str | None]


def render_effective(config_file: Path | None) -> str:
    """The merged settings as YAML; :class:`~controlplane.settings.SettingsError` when they
    are not valid (as ``serve`` would refuse them)."""
    settings = load_settings(config_file)
    variables = {name.upper() for name in os.environ}
    file = str(config_file) if config_file is not None else None
    sources = _Sources(variables, _file_data(config_file), file)
    where = f" < {file}" if file is not None else ""
    header = [
        f"# controlplane: the effective settings (defaults{where} < environment).",
        SECRETS_LINE,
    ]
    return _render(header, shown(settings), derived(settings), sources.of, local=True)


def render_remote(answer: Mapping[str, Any], url: str) -> str:
    """The running daemon's settings (its ``GET /v1/config`` answer) in the local layout."""
    header = [
        f"# controlplane: the effective settings of the running daemon at {mask_passwords(url)}.",
        SECRETS_LINE,
    ]
    settings, filled = answer.get("settings"), answer.get("derived")
    return _render(
        header,
        settings if isinstance(settings, Mapping) else {},
        filled if isinstance(filled, Mapping) else {},
        lambda _path: DAEMON,
        local=False,
    )


def _render(
    header: list[str],
    view: Mapping[str, Any],
    filled: Mapping[str, Any],
    source_of: SourceOf,
    *,
    local: bool,
) -> str:
    out = list(header)
    for name, field in Settings.model_fields.items():
        if name == "models":
            out.append("")
            out += _models(view.get("models") or {}, filled, source_of)
            continue
        group = field.annotation
        value = view.get(name)
        if not _is_group(group) or not isinstance(value, Mapping):
            continue
        if not field.is_required():
            default: Mapping[str, Any] | None = shown(field.get_default(call_default_factory=True))
        else:  # a required group: locally its source is asked, field by field
            default = None if local else _field_defaults(group)
        out.append("")
        out.append(f"{name}:")
        out += _group(value, default, group, (name,), filled, source_of, indent=1)
    return "\n".join(out) + "\n"


class _Sources:
    """Where a local setting's value came from: a variable, the file, or neither (the default)."""

    def __init__(self, variables: set[str], data: Mapping[str, Any], file: str | None) -> None:
        self._variables = variables
        self._data = data
        self._file = file

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
    value: Mapping[str, Any],
    default: Mapping[str, Any] | None,
    kind: type[BaseModel],
    path: tuple[str, ...],
    filled: Mapping[str, Any],
    source_of: SourceOf,
    *,
    indent: int,
) -> list[str]:
    """One group's lines; ``default`` None when its defaults say nothing (a required group),
    so every value's source is asked."""
    pad = "  " * indent
    lines = []
    for name, current in value.items():
        field = kind.model_fields.get(name)
        inner = field.annotation if field is not None else None
        here = (*path, name)
        was = default.get(name, _MISSING) if default is not None else _MISSING
        if _is_group(inner) and isinstance(current, Mapping):
            lines.append(f"{pad}{name}:")
            nested = was if isinstance(was, Mapping) else None
            lines += _group(current, nested, inner, here, filled, source_of, indent=indent + 1)
            continue
        line = f"{pad}{name}: {json.dumps(current)}"
        source = source_of(here) if was is _MISSING or current != was else None
        that_is = filled.get(".".join(here))
        if source is not None:
            line += f"  # from {source}"
        elif current is None and that_is is not None:
            line += f"  # that is: {mask_passwords(str(that_is))}"
        lines.append(line)
    return lines


def _models(models: Mapping[str, Any], filled: Mapping[str, Any], source_of: SourceOf) -> list[str]:
    """Each model's own policy: it replaces model_defaults as a whole, so its defaults are the
    policy's own."""
    if not models:
        return ["models: {}"]
    lines = ["models:"]
    default = shown(ModelPolicy())
    for name, policy in models.items():
        lines.append(f"  {json.dumps(name)}:")
        lines += _group(policy, default, ModelPolicy, ("models", name), filled, source_of, indent=2)
    return lines


def _is_group(annotation: object) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _field_defaults(kind: type[BaseModel]) -> dict[str, Any]:
    return {
        name: shown(field.get_default(call_default_factory=True))
        for name, field in kind.model_fields.items()
        if not field.is_required()
    }


_MISSING: Any = object()


def _file_data(config_file: Path | None) -> Mapping[str, Any]:
    if config_file is None:
        return {}
    data = yaml.safe_load(config_file.read_text(encoding="utf-8"))  # read already: it loads
    return data if isinstance(data, dict) else {}
