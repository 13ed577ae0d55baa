"""Validation of every name that arrives from outside, and of the names the daemon makes.

A name becomes a directory under the repository and staging dirs, so it is checked before it
touches the disk: a conservative character set, a length bound, and no way to spell a path
(``/``, ``..``, a leading dot). The error names the rule that was broken.

``__`` is reserved in model names: the daemon names a blue-green model's slots
``<model>__blue`` and ``<model>__green`` (and, when Triton holds one of them stuck, spares such
as ``<model>__green-2``). A model that could be called ``c__green`` would share its Triton name
and its repository dir with model ``c``'s slot, so no model name may contain ``__``. The length
bound applies to the name as the user writes it; the suffix the daemon adds is its own business
(:data:`MAX_SLOT_NAME_LENGTH` leaves room for it below the filesystem's 255 bytes).
"""

from __future__ import annotations

import re

from controlplane.domain.errors import InvalidName

MAX_NAME_LENGTH = 128
RESERVED = "__"
MAX_SUFFIX_LENGTH = 24  # a slot suffix (``__green``) plus a spare's ``-N``
MAX_SLOT_NAME_LENGTH = MAX_NAME_LENGTH + MAX_SUFFIX_LENGTH + 8
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _validate(kind: str, name: object, limit: int) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidName(f"{kind} name must be a non-empty string")
    if len(name) > limit:
        raise InvalidName(f"{kind} name is {len(name)} characters long; the limit is {limit}")
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidName(
            f"{kind} name {name[:limit]!r} is not allowed: use letters, digits, '.', '_' and "
            "'-', start with a letter or digit, and do not use '..'"
        )
    return name


def validate_model_name(name: object) -> str:
    """Return ``name`` if it is a valid model name, else raise :class:`InvalidName`."""
    valid = _validate("model", name, MAX_NAME_LENGTH)
    if RESERVED in valid:
        raise InvalidName(
            f"model name {valid!r} contains {RESERVED!r}, which is reserved for the daemon's "
            f"blue-green slots (<model>{RESERVED}blue, <model>{RESERVED}green); "
            "rename the model"
        )
    return valid


def validate_release_name(name: object) -> str:
    """Return ``name`` if it is a valid release name, else raise :class:`InvalidName`."""
    return _validate("release", name, MAX_NAME_LENGTH)


def validate_slot_name(name: object) -> str:
    """A name the daemon gives a Triton model dir: a model name, or one of its slots."""
    return _validate("slot", name, MAX_SLOT_NAME_LENGTH)


def validate_slot_suffix(suffix: object) -> str:
    """A blue-green slot suffix: ``__`` then letters, digits, '.', '_' or '-'."""
    if not isinstance(suffix, str) or not suffix.startswith(RESERVED) or len(suffix) <= 2:
        raise InvalidName(
            f"slot suffix {suffix!r} must start with {RESERVED!r} (reserved in model names, so "
            "no model can take a slot's name), as the defaults '__blue' and '__green' do"
        )
    limit = MAX_SUFFIX_LENGTH - 4
    if len(suffix) > limit or not re.fullmatch(r"__[A-Za-z0-9._-]+", suffix) or ".." in suffix:
        raise InvalidName(
            f"slot suffix {suffix!r} is not allowed: after '__' use letters, digits, '.', '_' "
            f"and '-', at most {limit} characters in all"
        )
    return suffix


def validate_member_name(name: object) -> str:
    """A fleet member's name (a pod or host name): it names its heartbeat record."""
    return _validate("member", name, MAX_NAME_LENGTH)
