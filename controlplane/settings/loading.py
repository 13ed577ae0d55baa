"""Loading the settings, and the messages that say what is wrong with them.

Sources, highest priority first: ``CONTROLPLANE_*`` variables, the YAML file given to
``controlplane serve --config``, the defaults. Before pydantic sees them, the environment and
the file are checked for what the loader would otherwise misread: a model name with capitals in
a variable (variable names are read without case, so the policy would apply to another model),
a file that does not exist or holds no mapping, a variable the loader would ignore (a group
that does not exist, one ``_`` where ``__`` belongs). Every refusal is one
:class:`SettingsError` whose lines each name the setting, where its value came from (its
variable, or the file) and the problem, with the key meant when a typo is near a known one
(:mod:`controlplane.settings.names`); a password in a URL it quotes is masked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    YamlConfigSettingsSource,
)

from controlplane.settings.masking import mask_passwords
from controlplane.settings.names import (
    ENV_PREFIX,
    env_name,
    holds_settings,
    meant_by_separators,
    misspelt_env_settings,
    nearest,
    suggestion,
    unknown_env_groups,
)
from controlplane.settings.root import Settings, groups


class SettingsError(Exception):
    """Invalid settings: the message names each setting, its variable and the problem."""


def _env_model_names_in_capitals(environ: Mapping[str, str]) -> list[str]:
    """Mixed-case model names in ``CONTROLPLANE_MODELS__<NAME>__...`` variables: the settings
    loader reads variable names without case, so ``Dec`` would become ``dec`` and the policy
    would silently apply to another model. All capitals is the usual way to write a variable
    (``RESNET`` for ``resnet``), and is read as lowercase, as documented."""
    prefix = f"{ENV_PREFIX}MODELS__"
    return sorted(
        {
            name
            for key in environ
            if key.upper().startswith(prefix)
            and (name := key[len(prefix) :].split("__", 1)[0]) not in (name.lower(), name.upper())
        }
    )


def load_settings(config_file: Path | None = None) -> Settings:
    try:
        return _load(config_file)
    except SettingsError as exc:  # a refusal may quote a value: never a password in it
        raise SettingsError(mask_passwords(str(exc))) from None


def _load(config_file: Path | None) -> Settings:
    if capitals := _env_model_names_in_capitals(os.environ):
        raise SettingsError(
            f"model name(s) {', '.join(capitals)} in CONTROLPLANE_MODELS__<NAME>__... "
            "variables: environment variable names are read without case, so the policy "
            "would apply to the lowercase name. Set per-model policy for names with capitals "
            "in the config file (models: ...) instead; all-capital names mean the lowercase one"
        )
    if config_file is not None and not config_file.is_file():
        what = "is a directory, not a file" if config_file.is_dir() else "does not exist"
        raise SettingsError(f"config file {config_file} {what}")
    data = _require_mapping(config_file) if config_file is not None else {}

    class _WithFile(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if config_file is not None:
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
            return tuple(sources)

    ignored = _misspelt_env_settings(os.environ) + _unknown_env_groups(os.environ)
    try:
        settings = _WithFile()
    except ValidationError as exc:
        raise SettingsError(_describe(exc, _Origins(config_file, data), ignored)) from None
    except (ValueError, yaml.YAMLError) as exc:  # YAML syntax, not a mapping, and similar
        raise SettingsError(f"cannot read {config_file}: {exc}") from None
    if ignored:
        raise SettingsError("\n".join(["invalid settings:", *ignored]))
    return settings


def _misspelt_env_settings(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``CONTROLPLANE_*`` variable with one ``_`` where ``__`` belongs
    (``CONTROLPLANE_TRITON_GRPC_URL``): the loader would ignore it, and the daemon would run
    with the default in its place."""
    return [
        f"  {variable}: no setting is read from this variable ('__' goes between a group and "
        f"its field); did you mean {'.'.join(path)!r} ({env_name(*path)})?"
        for variable, path in misspelt_env_settings(Settings, environ, ENV_PREFIX)
    ]


def _unknown_env_groups(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``CONTROLPLANE_<GROUP>__...`` variable of a group that does not exist
    (the loader would ignore it), with the group meant when one is near."""
    lines = []
    for variable, group in unknown_env_groups(Settings, environ, ENV_PREFIX):
        meant = nearest(group, Settings.model_fields)
        line = f"  {variable}: there is no settings group {group!r}"
        path = meant_by_separators(Settings, variable[len(ENV_PREFIX) :])
        if path is not None:  # MODEL_DEFAULTS_ROLLOUT__BAKE_SECONDS: a '_' for a '__'
            line += f"; did you mean {'.'.join(path)!r} ({env_name(*path)})?"
        elif meant is not None:
            rest = variable[len(ENV_PREFIX) :].split("__", 1)[1]
            line += f"; did you mean {meant!r} ({ENV_PREFIX}{meant.upper()}__{rest.upper()})?"
        else:
            line += f"; the groups are: {', '.join(name for name, _ in groups())}, models"
        lines.append(line)
    return lines


def _require_mapping(config_file: Path) -> Mapping[str, Any]:
    """What the config file holds: a YAML mapping (or nothing); a list or a scalar would
    otherwise surface as a 'Field required' error far from the cause."""
    try:
        data = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"cannot read {config_file}: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise SettingsError(
            f"{config_file} holds a YAML {type(data).__name__}, not a mapping of settings "
            "(for example 'triton:' and 'store:' at the top level); see config/ for examples"
        )
    return data or {}


class _Origins:
    """Where the value of a setting came from, as a refusal says it: the variable when it is
    set (it wins over the file), else the file when it holds the key, else both, as the places
    where it can be set."""

    def __init__(self, config_file: Path | None, data: Mapping[str, Any]) -> None:
        self.config_file = config_file
        self._data = data
        self.variables = {name.upper() for name in os.environ}

    def of(self, loc: Sequence[str | int]) -> str:
        names = [str(part) for part in loc]
        fields = names[: next((i for i, p in enumerate(loc) if isinstance(p, int)), len(loc))]
        variable = env_name(*fields)  # slot_suffixes.0 is set whole, as slot_suffixes
        in_file = f"in {self.config_file}"
        if holds_settings(Settings, fields):
            # A rule across a group's fields: they may come from the variables, the file or both.
            from_env = any(v.startswith(variable + "__") or v == variable for v in self.variables)
            from_file = self._has(names, group=True)
            variable += "__*"
            if from_env != from_file:
                return variable if from_env else in_file
            joint = " and " if from_env else " or "
        elif variable in self.variables:
            return variable
        elif self._has(names):
            return in_file
        else:
            joint = " or "  # neither holds it (a required setting): where it can be set
        return variable if self.config_file is None else f"{variable}{joint}{in_file}"

    def _has(self, path: Sequence[str], *, group: bool = False) -> bool:
        """Whether the file holds the key at ``path`` (for a group: one of its fields)."""
        if self.config_file is None:
            return False
        node: Any = self._data
        for part in path:
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return False
        return bool(node) if group else True


def _describe(exc: ValidationError, origins: _Origins, more: Sequence[str] = ()) -> str:
    lines = ["invalid settings:", *more]
    for error in exc.errors():
        loc = list(error["loc"])
        names = [str(part) for part in loc]
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and loc:
            lines.append(_unknown_key(names, origins))
            continue
        group = dict(groups()).get(names[0]) if len(loc) == 1 else None
        if error["type"] == "missing" and group is not None:
            # A whole group is missing: name the fields in it that have no default.
            for name, field in group.model_fields.items():
                if field.is_required():
                    where = origins.of([names[0], name])
                    lines.append(f"  {names[0]}.{name} ({where}): {message}")
            continue
        if loc:
            lines.append(f"  {'.'.join(names)} ({origins.of(loc)}): {message}")
        else:
            lines.append(f"  {message}")
    return "\n".join(lines)


def _unknown_key(loc: Sequence[str], origins: _Origins) -> str:
    """The line for a key no group has: where it was set, and the key meant when one is near
    (else every key of its group)."""
    meant, known = suggestion(Settings, loc)
    dotted = ".".join(loc)
    variable = env_name(*loc)
    if variable in origins.variables:
        line = f"  {variable}: there is no setting {dotted}"
        if meant is not None:
            return line + f"; did you mean {meant!r} ({env_name(*loc[:-1], meant)})?"
        path = meant_by_separators(Settings, variable[len(ENV_PREFIX) :])
        if path is not None:  # MODEL_DEFAULTS__ROLLOUT_BAKE_SECONDS: a '_' for a '__'
            return line + f"; did you mean {'.'.join(path)!r} ({env_name(*path)})?"
    else:
        config_file = origins.config_file
        where = f" (in {config_file})" if config_file is not None else ""
        line = f"  {dotted}{where}: there is no such setting"
        if meant is not None:
            return line + f"; did you mean {meant!r}?"
    if known:
        return line + f"; {'.'.join(loc[:-1]) or 'the top level'} has: {', '.join(known)}"
    return line
