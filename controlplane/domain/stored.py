"""Typed reads of a stored JSON record's values: each one checked where it is read.

A record in the store is JSON that a person may have edited (a copy, a hand fix). A value of
the wrong type or out of range must make the record unreadable where it is parsed, so that it
is listed and no member acts on it, rather than fail later where it is used: a time without a
zone cannot be compared with the clock's, a NaN interval makes no ``timedelta``, a NaN cannot be
answered as JSON, and each of those answered requests with ``500`` and restarted the fleet
sync. Every read raises ``TypeError`` (the wrong type) or ``ValueError`` (out of range), with
the field's name, as a record that is not ours does; both carry the field and why as a label
(:class:`~controlplane.domain.refusals.BadType`, :class:`~controlplane.domain.refusals.BadValue`),
which the refusal shows and ``/metrics`` counts.

Pure: standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

from controlplane.domain.errors import InvalidName
from controlplane.domain.refusals import BadType, BadValue, RefusalReason

E = TypeVar("E", bound=StrEnum)

MAX_GENERATION = 2**53  # JSON readers that keep integers as doubles stay exact up to here
MAX_SECONDS = 10 * 365 * 86400.0  # no beat interval or bake is ten years


def json_object(value: object, what: str) -> Mapping[str, Any]:
    """``value`` if it is a JSON object; a record with anything else there is not ours (and
    must fail as such, ``TypeError``, not with whatever ``.get`` on a list raises)."""
    if not isinstance(value, Mapping):
        raise BadType(what, f"{what} is {kind(value)}, not an object")
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
        raise BadType(what, f"{what} is {kind(value)}, not a string")
    return value


def maybe_text(value: object, what: str) -> str | None:
    return None if value is None else text(value, what)


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise BadType(what, f"{what} is {kind(value)}, not true or false")
    return value


def listed(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise BadType(what, f"{what} is {kind(value)}, not a list")
    return value


def whole(value: object, what: str) -> int:
    """A generation: a whole number from 0 to :data:`MAX_GENERATION`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadType(what, f"{what} is {kind(value)}, not a whole number")
    if not 0 <= value <= MAX_GENERATION:
        raise BadValue(
            what,
            RefusalReason.OUT_OF_RANGE,
            f"{what} is {number_text(value)}, not a whole number from 0 to {MAX_GENERATION}",
        )
    return value


def seconds(value: object, what: str) -> float:
    """A duration: a finite number of seconds from 0 to :data:`MAX_SECONDS`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadType(what, f"{what} is {kind(value)}, not a number of seconds")
    # Compared as it is: an int too large for a float compares exactly, and NaN compares false.
    if not 0 <= value <= MAX_SECONDS:
        raise BadValue(
            what,
            RefusalReason.OUT_OF_RANGE,
            f"{what} is {number_text(value)}, not a number of seconds from 0 to {MAX_SECONDS:g}",
        )
    return float(value)


def moment(value: object, what: str) -> datetime:
    """An ISO 8601 time with its zone (the daemon writes UTC, ``+00:00``)."""
    if value is None:
        raise BadValue(what, RefusalReason.NOT_A_TIME, f"{what}: a time is missing")
    written = text(value, what)
    try:
        parsed = datetime.fromisoformat(written)
    except ValueError:
        raise BadValue(
            what, RefusalReason.NOT_A_TIME, f"{what} is {written[:60]!r}, not an ISO 8601 time"
        ) from None
    if parsed.utcoffset() is None:
        raise BadValue(
            what,
            RefusalReason.TIME_WITHOUT_ZONE,
            f"{what} is {written[:60]!r}, a time without a zone; write it with one, as the "
            "daemon does (+00:00)",
        )
    try:
        parsed.astimezone(UTC)
    except OverflowError:
        raise BadValue(
            what, RefusalReason.OUT_OF_RANGE, f"{what} is {written[:60]!r}, a time out of range"
        ) from None
    return parsed


def choice(value: object, among: type[E], what: str) -> E:
    """One of ``among``'s values (a rollout phase, a member state): a value this version does
    not know is refused with the field's name, not acted on as something else."""
    written = text(value, what)
    try:
        return among(written)
    except ValueError:
        known = ", ".join(member.value for member in among)
        raise BadValue(
            what, RefusalReason.UNKNOWN_VALUE, f"{what} is {written[:60]!r}, not one of {known}"
        ) from None


def named(value: object, what: str, validate: Callable[[object], str]) -> str:
    """A model, release or member name, as the daemon's own rules allow it (a name that spells
    a path, or that no deploy would take, is no name a daemon wrote)."""
    written = text(value, what)
    try:
        return validate(written)
    except InvalidName as exc:
        raise BadValue(what, RefusalReason.INVALID_NAME, f"{what}: {exc.message}") from None


def maybe_named(value: object, what: str, validate: Callable[[object], str]) -> str | None:
    return None if value is None else named(value, what, validate)
