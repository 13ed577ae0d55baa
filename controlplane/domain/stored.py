"""Typed reads of a stored JSON record's values: each one checked where it is read.

A record in the store is JSON that a person may have edited (a copy, a hand fix). A value of
the wrong type or out of range must make the record unreadable where it is parsed, so that it
is listed and no member acts on it, rather than fail later where it is used: a time without a
zone cannot be compared with the clock's, a NaN interval makes no ``timedelta``, a NaN cannot be
answered as JSON, and each of those answered requests with ``500`` and restarted the fleet
sync. Every read raises ``TypeError`` (the wrong type) or ``ValueError`` (out of range), with
the field's name, as a record that is not ours does.

Pure: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

MAX_GENERATION = 2**53  # JSON readers that keep integers as doubles stay exact up to here
MAX_SECONDS = 10 * 365 * 86400.0  # no beat interval or bake is ten years


def json_object(value: object, what: str) -> Mapping[str, Any]:
    """``value`` if it is a JSON object; a record with anything else there is not ours (and
    must fail as such, ``TypeError``, not with whatever ``.get`` on a list raises)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} is {kind(value)}, not an object")
    return value


def number_text(value: float) -> str:
    """``value`` as JSON spells it, or as Python's reader took it (NaN, Infinity), short."""
    if isinstance(value, int):
        return str(value) if abs(value) < 10**18 else "a number beyond 10^18"
    if math.isfinite(value):
        return f"{value:g}"
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def kind(value: object) -> str:
    """What a JSON value is, for an error: a string, a list, NaN..."""
    if value is None:
        return "null"
    if isinstance(value, float) and not math.isfinite(value):
        return number_text(value)
    spelled = {bool: "a boolean", str: "a string", list: "a list", int: "a number"}
    return spelled.get(type(value), "a number" if isinstance(value, float) else "an object")


def text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is {kind(value)}, not a string")
    return value


def maybe_text(value: object, what: str) -> str | None:
    return None if value is None else text(value, what)


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} is {kind(value)}, not true or false")
    return value


def listed(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"{what} is {kind(value)}, not a list")
    return value


def names(value: object, what: str) -> tuple[str, ...]:
    return tuple(text(name, f"{what}[{i}]") for i, name in enumerate(listed(value, what)))


def whole(value: object, what: str) -> int:
    """A generation: a whole number from 0 to :data:`MAX_GENERATION`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} is {kind(value)}, not a whole number")
    if not 0 <= value <= MAX_GENERATION:
        raise ValueError(
            f"{what} is {number_text(value)}, not a whole number from 0 to {MAX_GENERATION}"
        )
    return value


def seconds(value: object, what: str) -> float:
    """A duration: a finite number of seconds from 0 to :data:`MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} is {kind(value)}, not a number of seconds")
    # Compared as it is: an int too large for a float compares exactly, and NaN compares false.
    if not 0 <= value <= MAX_SECONDS:
        raise ValueError(
            f"{what} is {number_text(value)}, not a number of seconds from 0 to {MAX_SECONDS:g}"
        )
    return float(value)


def moment(value: object, what: str) -> datetime:
    """An ISO 8601 time with its zone (the daemon writes UTC, ``+00:00``)."""
    if value is None:
        raise ValueError(f"{what}: a time is missing")
    written = text(value, what)
    try:
        parsed = datetime.fromisoformat(written)
    except ValueError:
        raise ValueError(f"{what} is {written[:60]!r}, not an ISO 8601 time") from None
    if parsed.utcoffset() is None:
        raise ValueError(
            f"{what} is {written[:60]!r}, a time without a zone; write it with one, as the "
            "daemon does (+00:00)"
        )
    try:
        parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{what} is {written[:60]!r}, a time out of range") from None
    return parsed
