"""Records of the fleet that a member refuses, and why: the one shape every refusal takes.

A record under ``_controlplane/`` is JSON anyone with access to the store can write: a hand
edit, a copy made to seed another model, a backup put back, a release named by hand that the
store does not hold. None of them may stop a member: each record is parsed whole into its typed
model (:mod:`.stored`, :mod:`.fleet`, :mod:`.turns`), and one that is not a record this member
can act on is *refused*: it is left out (the member keeps serving what it has and goes on with
every other model), and it is said, as a :class:`Refusal`, in the log, in ``/metrics``
(``controlplane_fleet_records_refused{kind,reason}``), in status and in ``GET /v1/fleet``.

:class:`RefusalReason` is a closed set, so it can be a metric's label: the parse says which
one (:func:`reason_of` reads it off the error), and the fleet sync adds the refusals only it
can see (a generation that went back, a release the store does not hold or that is not
signed where signatures are required).

Pure: standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum


class RecordKind(StrEnum):
    """Which record: a model's desired state (its turns out of rotation and latches inside it),
    or a member's heartbeat."""

    DESIRED = "desired"
    MEMBER = "member"


class RefusalReason(StrEnum):
    NOT_JSON = "not_json"  # not JSON, NaN or Infinity, nested too deep, too large
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"  # a list where an object belongs, a string for a number...
    OUT_OF_RANGE = "out_of_range"  # a negative generation, NaN seconds, a time out of range
    NOT_A_TIME = "not_a_time"  # not an ISO 8601 time
    TIME_WITHOUT_ZONE = "time_without_zone"
    UNKNOWN_VALUE = "unknown_value"  # a rollout phase, a member state, a schema not known here
    INVALID_NAME = "invalid_name"  # a model, release or member name no daemon would write
    MISNAMED = "misnamed"  # it holds another model's (or member's) record
    GENERATION_WENT_BACK = "generation_went_back"  # below one read before: put back from a copy
    RELEASE_NOT_FOUND = "release_not_found"  # the desired release is not in the store
    SIGNATURE_MISSING = "signature_missing"  # unsigned where a signature is required
    SIGNATURE_INVALID = "signature_invalid"
    UNKNOWN_SIGNER = "unknown_signer"


# The error codes of a deploy that refuse the desired release itself (the store does not hold
# it, or it is not signed as this member requires): the record is refused for that model until
# it changes, rather than tried again and again.
RELEASE_REFUSALS = {
    "release_not_found": RefusalReason.RELEASE_NOT_FOUND,
    "signature_missing": RefusalReason.SIGNATURE_MISSING,
    "signature_invalid": RefusalReason.SIGNATURE_INVALID,
    "unknown_signer": RefusalReason.UNKNOWN_SIGNER,
}


@dataclass(frozen=True)
class Refusal:
    """One record refused: of which kind, named for which model or member (its file's name),
    why (a label), which field (None: the record as a whole), and what to do, in words."""

    kind: RecordKind
    name: str
    reason: RefusalReason
    message: str
    field: str | None = None


class BadValue(ValueError):
    """A value a record may not hold, with the field it is in and why (a label)."""

    def __init__(self, field: str | None, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason


class BadType(TypeError):
    """A value of the wrong JSON type, with the field it is in."""

    def __init__(self, field: str | None, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.reason = RefusalReason.WRONG_TYPE


def reason_of(exc: Exception) -> tuple[RefusalReason, str | None]:
    """Why a parse failed, and in which field (None: not known, or the record as a whole)."""
    if isinstance(exc, BadValue | BadType):
        return exc.reason, exc.field
    if isinstance(exc, KeyError):
        return RefusalReason.MISSING_FIELD, str(exc.args[0]) if exc.args else None
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return RefusalReason.NOT_JSON, None
    if isinstance(exc, TypeError):
        return RefusalReason.WRONG_TYPE, None
    return RefusalReason.OUT_OF_RANGE, None
