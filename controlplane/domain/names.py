"""Validation of every name that arrives from outside: model and release names.

A name becomes a directory under the repository and staging dirs, so it is checked before it
touches the disk: a conservative character set, a length bound, and no way to spell a path
(``/``, ``..``, a leading dot). The error names the rule that was broken.
"""

from __future__ import annotations

import re

from controlplane.domain.errors import InvalidName

MAX_NAME_LENGTH = 128
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _validate(kind: str, name: object) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidName(f"{kind} name must be a non-empty string")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidName(
            f"{kind} name is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidName(
            f"{kind} name {name!r} is not allowed: use letters, digits, '.', '_' and '-', "
            "start with a letter or digit, and do not use '..'"
        )
    return name


def validate_model_name(name: object) -> str:
    """Return ``name`` if it is a valid model name, else raise :class:`InvalidName`."""
    return _validate("model", name)


def validate_release_name(name: object) -> str:
    """Return ``name`` if it is a valid release name, else raise :class:`InvalidName`."""
    return _validate("release", name)
