"""The bytes of the fleet's records, shared by the local and the S3 store.

``_controlplane/desired/<model>.json`` holds a model's desired state and
``_controlplane/members/<member>.json`` a member's heartbeat: small JSON documents, written
whole (an atomic rename, or one PutObject), so a reader sees the old one or the new one.

A record that cannot be read whole as ours is a :class:`~controlplane.domain.refusals.Refusal`
(what, why, which field): a listing leaves it out and keeps it for :meth:`~controlplane.ports.
DesiredStates.unreadable`, and the fleet sync logs it (once a minute) and counts it. Nothing is
logged here: every member reads every record every poll.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from controlplane.domain.errors import DesiredStateConflict, StoreError
from controlplane.domain.fleet import (
    RESERVED_PREFIX,
    DesiredModel,
    MemberBeat,
    beat_for_storage,
    beat_from_storage,
    desired_for_storage,
    desired_from_storage,
)
from controlplane.domain.refusals import (
    BadType,
    BadValue,
    RecordKind,
    Refusal,
    RefusalReason,
    reason_of,
)

DESIRED_DIR = f"{RESERVED_PREFIX}/desired"
MEMBERS_DIR = f"{RESERVED_PREFIX}/members"
SUFFIX = ".json"
MAX_RECORD_BYTES = 1024 * 1024  # a record is a few KiB; anything larger is not ours


def utc_now() -> datetime:
    """The reader's clock, when no other is given."""
    return datetime.now(UTC)


def encode_desired(desired: DesiredModel) -> bytes:
    return _encode(desired_for_storage(desired))


def encode_beat(beat: MemberBeat) -> bytes:
    return _encode(beat_for_storage(beat))


def _encode(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()


def decode_desired(data: bytes, where: str) -> DesiredModel:
    """The record, or :class:`StoreError` naming the file and what to do (its details carry
    the refusal's ``reason`` and ``field``)."""
    found = read_desired(data, where, None)
    if isinstance(found, Refusal):
        raise StoreError(
            found.message,
            details={"record": where, "reason": found.reason.value, "field": found.field},
        )
    return found


def read_desired(data: bytes, where: str, name: str | None) -> DesiredModel | Refusal:
    """The desired state in the file ``name`` (``<model>.json``; None: read for its model by
    name) at ``where``, or why it is refused: a bad record stops its own model only."""
    try:
        desired = desired_from_storage(_decode(data))
    except (ValueError, KeyError, TypeError) as exc:
        reason, field = reason_of(exc)
        return Refusal(
            RecordKind.DESIRED,
            _stem(where if name is None else name),
            reason,
            f"the desired-state record {where} cannot be read ({_why(exc)}); "
            "no member acts on this model until it is fixed: deploy a release of it through "
            "any member's API after deleting the record, or restore it",
            field,
        )
    if name is not None and name != f"{desired.model}{SUFFIX}":
        return Refusal(
            RecordKind.DESIRED, _stem(name), RefusalReason.MISNAMED, misnamed(where, desired.model)
        )
    return desired


def decode_beat(data: bytes, where: str, name: str) -> MemberBeat | Refusal:
    """The heartbeat in the file ``name`` at ``where``, or why it is refused (a bad beat hides
    one member)."""
    try:
        beat = beat_from_storage(_decode(data))
    except (ValueError, KeyError, TypeError) as exc:
        reason, field = reason_of(exc)
        return Refusal(
            RecordKind.MEMBER,
            _stem(name),
            reason,
            f"the member record {where} cannot be read ({_why(exc)}); that "
            "member is not seen until it writes its next heartbeat, or delete the record",
            field,
        )
    if name != f"{beat.member}{SUFFIX}":
        return Refusal(
            RecordKind.MEMBER, _stem(name), RefusalReason.MISNAMED, misnamed(where, beat.member)
        )
    return beat


def _why(exc: Exception) -> str:
    """A parse's error in an operator's words: the field and what is wrong with it."""
    if isinstance(exc, BadValue | BadType):
        return str(exc)
    if isinstance(exc, KeyError):
        return f"no {exc.args[0]!r} field" if exc.args else "a field is missing"
    return f"{type(exc).__name__}: {exc}"  # not JSON: the parser's own words say where


def _stem(name: str) -> str:
    """The model or member a record's file is named for."""
    return name.rpartition("/")[2].removesuffix(SUFFIX)


def _decode(data: bytes) -> dict[str, Any]:
    """The record's JSON object. NaN and Infinity, which Python reads but JSON has not, are
    refused here, and so is nesting deeper than the parser goes (a ``RecursionError``, which
    is no ``ValueError``): every value a record holds is then checked where it is read
    (:mod:`controlplane.domain.stored`)."""
    if len(data) > MAX_RECORD_BYTES:
        raise BadValue(
            None, RefusalReason.NOT_JSON, f"{len(data)} bytes, more than a record ever holds"
        )
    try:
        found = json.loads(data, parse_constant=_not_json)
    except RecursionError:
        raise BadValue(
            None, RefusalReason.NOT_JSON, "JSON nested deeper than a record ever is"
        ) from None
    if not isinstance(found, dict):
        raise BadType(None, f"a JSON {type(found).__name__}, not an object")
    return found


def _not_json(constant: str) -> object:
    raise BadValue(
        None,
        RefusalReason.NOT_JSON,
        f"{constant} is no JSON number (JSON has no NaN or Infinity)",
    )


def misnamed(where: str, holds: str) -> str:
    """Why a record read under another model's name is left out."""
    return (
        f"the record {where} holds the record of {holds!r}, which lives at {holds}{SUFFIX} "
        "only; delete it, or deploy a release of that model to write its own"
    )


def conflict(wanted: DesiredModel, found: DesiredModel | None, where: str) -> DesiredStateConflict:
    """The error for a compare-and-swap that lost: what is there now, and who set it."""
    expected = wanted.generation - 1
    if found is None:
        now = "no record"
        details: dict[str, object] = {"generation": 0}
    else:
        now = (
            f"generation {found.generation} ({found.release or 'unloaded'}, set by "
            f"{found.set_by} at {found.set_at.isoformat()}: {found.reason})"
        )
        details = {
            "generation": found.generation,
            "release": found.release,
            "set_by": found.set_by,
            "set_at": found.set_at.isoformat(),
        }
    return DesiredStateConflict(
        f"the desired state of {wanted.model} changed while this request ran: it expected "
        f"generation {expected} but {where} holds {now}; this request did not change the "
        "desired state. Read the fleet (GET /v1/fleet) and try again if it is still wanted",
        details={"model": wanted.model, "expected_generation": expected, **details},
    )


def same_write(a: DesiredModel, b: DesiredModel) -> bool:
    """Whether two records are one write (a retried request that had landed after all)."""
    return desired_for_storage(a) == desired_for_storage(b)


def require_named(desired: DesiredModel, model: str, where: str) -> None:
    """A record read for ``model`` must be ``model``'s: one that names another model is not
    acted on (a hand edit or a copy), and a write over it is refused rather than misread."""
    if desired.model != model:
        raise StoreError(
            f"the desired-state record {where} holds the record of {desired.model!r}, not of "
            f"{model!r}; no member acts on {model} until it is fixed (delete it, then deploy a "
            "release through any member)",
            details={"record": where, "reason": RefusalReason.MISNAMED.value, "field": "model"},
        )
