"""The names a setting can have, and the known name nearest to one that is not one.

A setting is ``group.field`` in the YAML file and ``CONTROLPLANE_GROUP__FIELD`` in the
environment (:data:`ENV_PREFIX`, then ``__`` between the parts: :func:`env_name`).

Settings refuse unknown keys, so a typo stops the daemon instead of being ignored; this module
makes the refusal say what was meant (``did you mean 'poll_interval_seconds'?``), for a key of
the YAML file and for a ``CONTROLPLANE_*`` variable alike. It walks the settings' own pydantic
models, so a field added to a group is known here with no list to keep: a group is a model, a
field whose type is a model is a nested group (``rollout`` of a model's policy), and a mapping
of models (``models``) is keyed by free names (model names) with a group below each.

Variables the settings loader would ignore are found here too, since it reads only
``CONTROLPLANE_<GROUP>__...`` of the groups it knows: a group that does not exist
(``CONTROLPLANE_STOR__URI``), and one ``_`` where ``__`` belongs
(``CONTROLPLANE_TRITON_GRPC_URL``). The second is told from the many ``CONTROLPLANE_*``
variables that are not settings by what follows the group: only a known field, or one close to
it, is taken for a misspelt setting. ``CONTROLPLANE_URL`` and ``CONTROLPLANE_TOKEN`` are the
CLI's; Kubernetes injects service links (``CONTROLPLANE_API_SERVICE_HOST``,
``CONTROLPLANE_API_PORT_8080_TCP_ADDR``, ... for a Service named ``controlplane-api``) into
every pod of the namespace, and those keep their shapes (:func:`is_service_link`) whatever the
Service is called, so they are never taken for settings.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args, get_origin

from pydantic import BaseModel

ENV_PREFIX = "CONTROLPLANE_"
CUTOFF = 0.6  # difflib's ratio above which a known name is offered as the one meant
# For a variable only taken for a setting because its name is close to one: it may be anything
# (another tool's, a Service's), so it must be closer (``prot`` for ``port``: 0.75) than a key
# known to be a setting (``port`` is 0.6 from ``format``).
RUN_TOGETHER_CUTOFF = 0.75


def env_name(*path: str) -> str:
    """The environment variable of a setting: ``CONTROLPLANE_TRITON__GRPC_URL``."""
    return ENV_PREFIX + "__".join(part.upper() for part in path)


def group_at(root: type[BaseModel], path: Sequence[str]) -> type[BaseModel] | None:
    """The model that holds the fields at ``path`` below ``root`` (``("models", "resnet",
    "rollout")`` -> the rollout group); None when ``path`` leads nowhere known."""
    current: Any = root
    for part in path:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(part)
            if field is None:
                return None
            current = field.annotation
        elif get_origin(current) is dict:
            current = get_args(current)[1]  # ``part`` is a key: a model's name
        else:
            return None
    if get_origin(current) is dict:
        return None  # the keys of a mapping are free names
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def holds_settings(root: type[BaseModel], path: Sequence[str]) -> bool:
    """Whether ``path`` leads to more than one setting: a group, or a mapping of groups
    (``models``, whose every key leads to one)."""
    return bool(path) and (
        group_at(root, path) is not None or group_at(root, (*path, "any")) is not None
    )


def nearest(name: str, known: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The known name closest to ``name``, if one is close enough to be the one meant."""
    found = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=cutoff)
    return found[0] if found else None


def suggestion(root: type[BaseModel], path: Sequence[str]) -> tuple[str | None, list[str]]:
    """For the unknown key at ``path``: the known key nearest to its last part (or None), and
    every key its group has."""
    group = group_at(root, path[:-1])
    if group is None:
        return None, []
    known = list(group.model_fields)
    return nearest(path[-1], known), known


def unknown_env_groups(
    root: type[BaseModel], environ: Mapping[str, str], prefix: str
) -> list[tuple[str, str]]:
    """``(variable, group)`` for each ``<prefix><GROUP>__...`` variable whose group is not one
    of ``root``'s fields; sorted by variable."""
    found = []
    for key in environ:
        upper = key.upper()
        if not upper.startswith(prefix) or "__" not in upper[len(prefix) :]:
            continue
        group = upper[len(prefix) :].split("__", 1)[0].lower()
        if group not in root.model_fields:
            found.append((key, group))
    return sorted(found)


def field_paths(group: type[BaseModel]) -> list[tuple[str, ...]]:
    """Every setting below ``group``, nested groups (and their own fields) included:
    ``("auto_deploy",)``, ..., ``("rollout",)``, ``("rollout", "canary_members")``."""
    paths: list[tuple[str, ...]] = []
    for name in group.model_fields:
        paths.append((name,))
        nested = group_at(group, (name,))
        if nested is not None:
            paths += [(name, *below) for below in field_paths(nested)]
    return paths


def meant_by_separators(root: type[BaseModel], name: str) -> tuple[str, ...] | None:
    """The setting meant by a variable ``name`` (the part after the prefix) whose group and
    fields are run together with ``_`` (``TRITON_GRPC_URL``, ``MODEL_DEFAULTS_ROLLOUT__BAKE``):
    its path when ``name`` starts with a known group and goes on with one of that group's
    settings, or a name close to one; None otherwise. Below ``models``, whose keys are free
    model names, only a name that ends with a policy's setting exactly is taken."""
    flat = name.lower().replace("__", "_")
    for group in sorted(root.model_fields, key=len, reverse=True):  # model_defaults, models
        if not flat.startswith(group + "_"):
            continue
        rest = flat[len(group) + 1 :]
        model = group_at(root, (group,))
        if model is not None:
            paths = {"_".join(path): path for path in field_paths(model)}
            meant = nearest(rest, paths, RUN_TOGETHER_CUTOFF)
            if meant is not None:
                return (group, *paths[meant])
            continue
        policy = group_at(root, (group, "name"))  # a mapping of models: a policy by name
        if policy is None:
            continue
        ends = sorted(field_paths(policy), key=lambda path: -len("_".join(path)))
        for path in ends:
            model_name = rest.removesuffix("_" + "_".join(path))
            if model_name not in ("", rest):
                return (group, model_name, *path)
    return None


# What Kubernetes injects for each Service in the namespace (enableServiceLinks), the Service's
# name upper-cased with '-' as '_': NAME_SERVICE_HOST, NAME_SERVICE_PORT[_PORTNAME],
# NAME_PORT, NAME_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR].
_SERVICE_LINK = re.compile(
    r"^[A-Z0-9_]+?_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|(?P<link>PORT)|PORT_[0-9]+_(?:TCP|UDP|SCTP)(?:_PROTO|_PORT|_ADDR)?)$"
)
_LINK_VALUE = re.compile(r"^(?:tcp|udp|sctp)://", re.IGNORECASE)


def is_service_link(variable: str, value: str) -> bool:
    """Whether ``variable`` has the shape of a Kubernetes service link. ``NAME_PORT`` is one
    only with the value Kubernetes gives it (``tcp://10.96.0.12:8080``): ``CONTROLPLANE_API_PORT``
    is also what ``CONTROLPLANE_API__PORT`` becomes with one ``_`` lost, and ``9000`` tells
    which."""
    shape = _SERVICE_LINK.match(variable.upper())
    if shape is None:
        return False
    return shape["link"] is None or _LINK_VALUE.match(value) is not None


def misspelt_env_settings(
    root: type[BaseModel], environ: Mapping[str, str], prefix: str
) -> list[tuple[str, tuple[str, ...]]]:
    """``(variable, path meant)`` for each ``<prefix>...`` variable with no ``__`` in it that
    names a setting with ``_`` where ``__`` belongs (the loader would ignore it); sorted."""
    found = []
    for key, value in environ.items():
        upper = key.upper()
        if not upper.startswith(prefix) or "__" in upper[len(prefix) :]:
            continue
        if is_service_link(upper, value):
            continue
        meant = meant_by_separators(root, upper[len(prefix) :])
        if meant is not None:
            found.append((key, meant))
    return sorted(found)
