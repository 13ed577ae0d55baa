"""The names a setting can have, and the known name nearest to one that is not one.

A setting is ``group.field`` in the YAML file and ``CONTROLPLANE_GROUP__FIELD`` in the
environment (:data:`ENV_PREFIX`, then ``__`` between the parts: :func:`env_name`).

Settings refuse unknown keys, so a typo stops the daemon instead of being ignored; this module
makes the refusal say what was meant (``did you mean 'poll_interval_seconds'?``), for a key of
the YAML file and for a ``CONTROLPLANE_*`` variable alike. It walks the settings' own pydantic
models, so a field added to a group is known here with no list to keep: a group is a model, a
field whose type is a model is a nested group (``rollout`` of a model's policy), and a mapping
of models (``models``) is keyed by free names (model names) with a group below each.

Unknown top-level groups in the environment are found here too: the settings loader reads only
the variables of groups it knows, so ``CONTROLPLANE_STOR__URI`` would otherwise be ignored.
Only names with the ``__`` between group and field are settings: ``CONTROLPLANE_URL`` and
``CONTROLPLANE_TOKEN`` are the CLI's, and Kubernetes injects ``CONTROLPLANE_SERVICE_HOST``
and ``CONTROLPLANE_PORT_8080_TCP`` into pods beside a Service named ``controlplane``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args, get_origin

from pydantic import BaseModel

ENV_PREFIX = "CONTROLPLANE_"
CUTOFF = 0.6  # difflib's ratio above which a known name is offered as the one meant


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


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name``, if one is close enough to be the one meant."""
    found = difflib.get_close_matches(name.lower(), list(known), n=1, cutoff=CUTOFF)
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
