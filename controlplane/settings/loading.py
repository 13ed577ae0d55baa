"""Loading the settings, and the messages that say what is wrong with them.

Sources, highest priority first: ``CONTROLPLANE_*`` variables, the YAML file given to
``controlplane serve --config``, the defaults. Before pydantic sees them, the environment and
the file are checked for what the loader would otherwise misread: a model name with capitals in
a variable (variable names are read without case, so the policy would apply to another model),
a file that does not exist or holds no mapping, a variable of a group that does not exist
(ignored by the loader). Every refusal is one :class:`SettingsError` whose lines each name the
setting, its variable and the problem, with the key meant when a typo is near a known one
(:mod:`controlplane.settings.names`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml
from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    YamlConfigSettingsSource,
)

from controlplane.settings.names import (
    ENV_PREFIX,
    env_name,
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
    if config_file is not None:
        _require_mapping(config_file)

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

    unknown_groups = _unknown_env_groups(os.environ)
    try:
        settings = _WithFile()
    except ValidationError as exc:
        raise SettingsError(_describe(exc, config_file, unknown_groups)) from None
    except (ValueError, yaml.YAMLError) as exc:  # YAML syntax, not a mapping, and similar
        raise SettingsError(f"cannot read {config_file}: {exc}") from None
    if unknown_groups:
        raise SettingsError("\n".join(["invalid settings:", *unknown_groups]))
    return settings


def _unknown_env_groups(environ: Mapping[str, str]) -> list[str]:
    """A line for each ``CONTROLPLANE_<GROUP>__...`` variable of a group that does not exist
    (the loader would ignore it), with the group meant when one is near."""
    lines = []
    for variable, group in unknown_env_groups(Settings, environ, ENV_PREFIX):
        meant = nearest(group, Settings.model_fields)
        line = f"  {variable}: there is no settings group {group!r}"
        if meant is not None:
            rest = variable[len(ENV_PREFIX) :].split("__", 1)[1]
            line += f"; did you mean {meant!r} ({ENV_PREFIX}{meant.upper()}__{rest.upper()})?"
        else:
            line += f"; the groups are: {', '.join(name for name, _ in groups())}, models"
        lines.append(line)
    return lines


def _require_mapping(config_file: Path) -> None:
    """A config file holds a YAML mapping (or nothing); a list or a scalar would otherwise
    surface as a 'Field required' error far from the cause."""
    try:
        data = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SettingsError(f"cannot read {config_file}: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise SettingsError(
            f"{config_file} holds a YAML {type(data).__name__}, not a mapping of settings "
            "(for example 'triton:' and 'store:' at the top level); see config/ for examples"
        )


def _describe(
    exc: ValidationError, config_file: Path | None = None, more: Sequence[str] = ()
) -> str:
    lines = ["invalid settings:", *more]
    variables = {name.upper() for name in os.environ}
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and loc:
            lines.append(_unknown_key(loc, config_file, variables))
            continue
        group = dict(groups()).get(loc[0]) if len(loc) == 1 else None
        if error["type"] == "missing" and group is not None:
            # A whole group is missing: name the fields in it that have no default.
            for name, field in group.model_fields.items():
                if field.is_required():
                    lines.append(f"  {loc[0]}.{name} ({env_name(loc[0], name)}): {message}")
            continue
        if loc:
            dotted = ".".join(loc)
            lines.append(f"  {dotted} ({env_name(*loc)}): {message}")
        else:
            lines.append(f"  {message}")
    return "\n".join(lines)


def _unknown_key(loc: Sequence[str], config_file: Path | None, variables: set[str]) -> str:
    """The line for a key no group has: where it was set, and the key meant when one is near
    (else every key of its group)."""
    meant, known = suggestion(Settings, loc)
    dotted = ".".join(loc)
    variable = env_name(*loc)
    if variable in variables:
        line = f"  {variable}: there is no setting {dotted}"
        if meant is not None:
            return line + f"; did you mean {meant!r} ({env_name(*loc[:-1], meant)})?"
    else:
        where = f" (in {config_file})" if config_file is not None else ""
        line = f"  {dotted}{where}: there is no such setting"
        if meant is not None:
            return line + f"; did you mean {meant!r}?"
    if known:
        return line + f"; {'.'.join(loc[:-1]) or 'the top level'} has: {', '.join(known)}"
    return line
