"""What one SQS message from a bucket's event notifications says about the store.

S3 sends a JSON body with ``Records``, one per object event; the key arrives URL-encoded
(form style: a space is ``+``). Two events matter here:

- ``ObjectCreated:*`` of a ``<prefix>/<model>/<release>/SHA256SUMS`` in the store's bucket,
  the publisher's commit marker: it names a model whose releases the watcher should list at once
  (:attr:`Heard.models`);
- ``ObjectCreated:*`` or ``ObjectRemoved:*`` of ``<prefix>/_controlplane/desired/<model>.json``,
  a member's change of the fleet's desired state (or a record deleted by hand): it names a model
  whose desired state the fleet sync should read at once (:attr:`Heard.desired`).

Everything else is *dropped*, with a :class:`Drop` kind that says why: the message is deleted
(it would otherwise come back after every visibility timeout) and logged (rate-limited by the
consumer, by kind). A heartbeat (``_controlplane/members/``) has a kind of its own: one reaching
a queue means the bucket's notification is wider than docs/notifications.md gives (in a fan-out
every member would hear every member's beat), and it is dropped here, by its key alone, before
anything reads the store.

A body wrapped by SNS (S3 -> SNS topic -> SQS, the fan-out) is unwrapped: its ``Message`` is
the S3 body. Pure: the standard library only, no boto3, so it is tested on its own.

Anyone who may send to the queue chooses its bodies, so :func:`read_message` never raises,
whatever the body: JSON nested deeper than the parser goes (a ``RecursionError``, which is no
``ValueError``) is ``not_json``, a field of the wrong type ``not_an_s3_event``, and a detail is
at most :data:`DETAIL_LIMIT` printable characters however large the body or key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import unquote_plus

from controlplane.adapters.stores.fleet_records import DESIRED_DIR, MEMBERS_DIR, SUFFIX
from controlplane.domain.checksums import MANIFEST_NAME
from controlplane.domain.errors import InvalidName
from controlplane.domain.fleet import RESERVED_PREFIX
from controlplane.domain.ignored import printable, release_name_problem
from controlplane.domain.model_signing import MODEL_SIGNATURE_NAME
from controlplane.domain.names import validate_model_name
from controlplane.domain.stored import kind


class Drop(StrEnum):
    """Why (part of) a message names no model."""

    NOT_JSON = "not_json"  # the body does not parse
    NOT_S3 = "not_an_s3_event"  # JSON, but not an S3 event notification (nor SNS around one)
    TEST_EVENT = "test_event"  # s3:TestEvent, sent once when a notification is configured
    NOT_CREATED = "not_object_created"  # ObjectRemoved, ObjectRestore, ...
    OTHER_BUCKET = "other_bucket"  # the queue also hears a bucket that is not the store's
    OUTSIDE_PREFIX = "outside_the_store"  # a key outside the store's prefix
    NOT_A_MARKER = "not_a_marker"  # not <model>/<release>/SHA256SUMS, or names no model's
    HEARTBEAT = "heartbeat"  # _controlplane/members/: the bucket's notification is too wide
    FLEET_RECORD = "other_fleet_record"  # under _controlplane/, no model's desired state
    UNREADABLE = "unreadable"  # reading it failed (a bug here): dropped all the same


@dataclass(frozen=True)
class Heard:
    """One message read: the models whose releases it names, those whose desired state it
    says changed, and what in it was dropped (kind, detail)."""

    models: frozenset[str] = frozenset()
    dropped: tuple[tuple[Drop, str], ...] = field(default_factory=tuple)
    desired: frozenset[str] = frozenset()

    def __or__(self, other: Heard) -> Heard:
        return Heard(
            self.models | other.models,
            self.dropped + other.dropped,
            self.desired | other.desired,
        )


DETAIL_LIMIT = 200  # characters of a body or key said in a drop's detail


def read_message(body: str, *, bucket: str, base: str) -> Heard:
    """What a message names, for the store ``s3://bucket/base`` (``base``: its key prefix
    ending in '/', or empty)."""
    data = _parsed(body)
    if data is _UNPARSED:
        return Heard(dropped=((Drop.NOT_JSON, _excerpt(body)),))
    data = _unwrap_sns(data)
    if isinstance(data, dict) and data.get("Event") == "s3:TestEvent":
        return Heard(dropped=((Drop.TEST_EVENT, f"bucket {_excerpt(data.get('Bucket'))}"),))
    records = data.get("Records") if isinstance(data, dict) else None
    if not isinstance(records, list):
        return Heard(dropped=((Drop.NOT_S3, _excerpt(body)),))
    if not records:
        return Heard(dropped=((Drop.NOT_S3, "no records"),))
    heard = Heard()
    for record in records:
        heard |= _read_record(record, bucket=bucket, base=base)
    return heard


_UNPARSED = object()  # what _parsed returns for a text that is not JSON it can read


def _parsed(text: str) -> Any:
    """``text`` as JSON, or :data:`_UNPARSED`: not JSON, a number of more digits than Python
    converts (a ``ValueError``), or nested deeper than the stack lets the parser go."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _UNPARSED


def _unwrap_sns(data: Any) -> Any:
    """The S3 body inside an SNS notification; anything else as it is."""
    if isinstance(data, dict) and data.get("Type") == "Notification":
        inner = data.get("Message")
        if isinstance(inner, str):
            found = _parsed(inner)
            return None if found is _UNPARSED else found
    return data


def _read_record(record: Any, *, bucket: str, base: str) -> Heard:
    """What one record names, or why it names nothing."""
    fields = _fields(record)
    if isinstance(fields, str):
        return _drop(Drop.NOT_S3, fields)
    source, event, named_bucket, raw_key = fields
    if source != "aws:s3":
        return _drop(Drop.NOT_S3, f"event source {_excerpt(source)}")
    key = unquote_plus(raw_key)
    where = _shown(f"s3://{named_bucket}/{key}")
    if named_bucket == bucket and key.startswith(f"{base}{RESERVED_PREFIX}/"):
        return _fleet_record(key[len(base) :], event, where)
    if not event.startswith("ObjectCreated:"):
        return _drop(Drop.NOT_CREATED, f"{_shown(event)} {where}")
    if named_bucket != bucket:
        return _drop(Drop.OTHER_BUCKET, where)
    if not key.startswith(base):
        return _drop(Drop.OUTSIDE_PREFIX, where)
    parts = key[len(base) :].split("/")
    if len(parts) != 3 or parts[2] not in (MANIFEST_NAME, MODEL_SIGNATURE_NAME):
        return _drop(Drop.NOT_A_MARKER, where)
    try:
        model = validate_model_name(parts[0])
    except InvalidName:
        return _drop(Drop.NOT_A_MARKER, where)
    if release_name_problem(parts[1]) is not None:
        return _drop(Drop.NOT_A_MARKER, where)
    return Heard(models=frozenset({model}))


def _fleet_record(key: str, event: str, where: str) -> Heard:
    """A key under the store's ``_controlplane/`` (``key``: relative to the store): a model's
    desired state written or deleted, or a drop decided by the key alone."""
    if key.startswith(f"{MEMBERS_DIR}/"):
        return _drop(Drop.HEARTBEAT, f"{where}: {_HEARTBEAT_HINT}")
    name = key.removeprefix(f"{DESIRED_DIR}/")
    if name == key or "/" in name or not name.endswith(SUFFIX):
        return _drop(Drop.FLEET_RECORD, where)
    if not event.startswith(("ObjectCreated:", "ObjectRemoved:")):
        return _drop(Drop.NOT_CREATED, f"{_shown(event)} {where}")
    try:
        model = validate_model_name(name.removesuffix(SUFFIX))
    except InvalidName:
        return _drop(Drop.FLEET_RECORD, where)
    return Heard(desired=frozenset({model}))


_HEARTBEAT_HINT = (
    "the bucket's notification sends heartbeats; narrow it to the two rules of "
    "docs/notifications.md (prefix <store>/_controlplane/desired/, suffix .json)"
)


def _drop(kind: Drop, detail: str) -> Heard:
    return Heard(dropped=((kind, detail),))


def _fields(record: Any) -> tuple[str, str, str, str] | str:
    """A record's event source, name, bucket and (still encoded) key, each a string; else
    what is wrong with it."""
    if not isinstance(record, dict):
        return f"a record that is {_json_type(record)}, not an object"
    s3 = record.get("s3")
    bucket = s3.get("bucket") if isinstance(s3, dict) else None
    found = s3.get("object") if isinstance(s3, dict) else None
    fields = {
        "eventSource": record.get("eventSource", "aws:s3"),
        "eventName": record.get("eventName"),
        "s3.bucket.name": bucket.get("name") if isinstance(bucket, dict) else None,
        "s3.object.key": found.get("key") if isinstance(found, dict) else None,
    }
    for name, value in fields.items():
        if not isinstance(value, str):
            return f"a record whose {name} is {_json_type(value)}, not a string"
    return (
        fields["eventSource"],
        fields["eventName"],
        fields["s3.bucket.name"],
        fields["s3.object.key"],
    )


def _json_type(value: object) -> str:
    return "missing or null" if value is None else kind(value)


def _excerpt(value: object) -> str:
    """A short, printable excerpt of a body (or a value's type), quoted."""
    text = value if isinstance(value, str) else f"a JSON {type(value).__name__}"
    return f"'{_shown(text)}'"


def _shown(text: str) -> str:
    """``text`` with what is not printable escaped, cut to :data:`DETAIL_LIMIT` characters."""
    shown = printable(text[: DETAIL_LIMIT + 1])
    return shown if len(shown) <= DETAIL_LIMIT else shown[:DETAIL_LIMIT] + "..."
