"""What one SQS message from a bucket's event notifications says about the store.

S3 sends a JSON body with ``Records``, one per object event; the key arrives URL-encoded
(form style: a space is ``+``). Only one event matters here: ``ObjectCreated:*`` of a
``<prefix>/<model>/<release>/SHA256SUMS`` in the store's bucket, the publisher's commit marker.
It names the model whose releases the watcher should list at once. Everything else is *dropped*,
with a :class:`Drop` kind that says why: the message is deleted (it would otherwise come back
after every visibility timeout) and logged (rate-limited by the consumer, by kind).

A body wrapped by SNS (S3 -> SNS topic -> SQS, a common fan-out) is unwrapped: its ``Message``
is the S3 body. Pure: the standard library only, no boto3, so it is tested on its own.

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

from controlplane.domain.checksums import MANIFEST_NAME
from controlplane.domain.errors import InvalidName
from controlplane.domain.fleet import RESERVED_PREFIX
from controlplane.domain.ignored import printable, release_name_problem
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
    UNREADABLE = "unreadable"  # reading it failed (a bug here): dropped all the same


@dataclass(frozen=True)
class Heard:
    """One message read: the models it names, and what in it was dropped (kind, detail)."""

    models: frozenset[str] = frozenset()
    dropped: tuple[tuple[Drop, str], ...] = field(default_factory=tuple)


DETAIL_LIMIT = 200  # characters of a body or key said in a drop's detail


def read_message(body: str, *, bucket: str, base: str) -> Heard:
    """The models a message names, for the store ``s3://bucket/base`` (``base``: its key
    prefix ending in '/', or empty)."""
    data = _parsed(body)
    if data is _UNPARSED:
        return Heard(dropped=((Drop.NOT_JSON, _excerpt(body)),))
    data = _unwrap_sns(data)
    if isinstance(data, dict) and data.get("Event") == "s3:TestEvent":
        return Heard(dropped=((Drop.TEST_EVENT, f"bucket {_excerpt(data.get('Bucket'))}"),))
    records = data.get("Records") if isinstance(data, dict) else None
    if not isinstance(records, list):
        return Heard(dropped=((Drop.NOT_S3, _excerpt(body)),))
    models: set[str] = set()
    dropped: list[tuple[Drop, str]] = []
    for record in records:
        found = _read_record(record, bucket=bucket, base=base)
        if isinstance(found, str):
            models.add(found)
        else:
            dropped.append(found)
    if not records:
        dropped.append((Drop.NOT_S3, "no records"))
    return Heard(frozenset(models), tuple(dropped))


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


def _read_record(record: Any, *, bucket: str, base: str) -> str | tuple[Drop, str]:
    """The model one record names, or why it names none."""
    fields = _fields(record)
    if isinstance(fields, str):
        return Drop.NOT_S3, fields
    source, event, named_bucket, raw_key = fields
    if source != "aws:s3":
        return Drop.NOT_S3, f"event source {_excerpt(source)}"
    key = unquote_plus(raw_key)
    where = _shown(f"s3://{named_bucket}/{key}")
    if not event.startswith("ObjectCreated:"):
        return Drop.NOT_CREATED, f"{_shown(event)} {where}"
    if named_bucket != bucket:
        return Drop.OTHER_BUCKET, where
    if not key.startswith(base):
        return Drop.OUTSIDE_PREFIX, where
    parts = key[len(base) :].split("/")
    if len(parts) != 3 or parts[2] != MANIFEST_NAME or parts[0] == RESERVED_PREFIX:
        return Drop.NOT_A_MARKER, where
    try:
        model = validate_model_name(parts[0])
    except InvalidName:
        return Drop.NOT_A_MARKER, where
    if release_name_problem(parts[1]) is not None:
        return Drop.NOT_A_MARKER, where
    return model


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
