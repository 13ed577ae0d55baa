"""What one SQS message from a bucket's event notifications says about the store.

S3 sends a JSON body with ``Records``, one per object event; the key arrives URL-encoded
(form style: a space is ``+``). Only one event matters here: ``ObjectCreated:*`` of a
``<prefix>/<model>/<release>/SHA256SUMS`` in the store's bucket, the publisher's commit marker.
It names the model whose releases the watcher should list at once. Everything else is *dropped*,
with a :class:`Drop` kind that says why: the message is deleted (it would otherwise come back
after every visibility timeout) and logged (rate-limited by the consumer, by kind).

A body wrapped by SNS (S3 -> SNS topic -> SQS, a common fan-out) is unwrapped: its ``Message``
is the S3 body. Pure: the standard library only, no boto3, so it is tested on its own.
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
from controlplane.domain.ignored import release_name_problem
from controlplane.domain.names import validate_model_name


class Drop(StrEnum):
    """Why (part of) a message names no model."""

    NOT_JSON = "not_json"  # the body does not parse
    NOT_S3 = "not_an_s3_event"  # JSON, but not an S3 event notification (nor SNS around one)
    TEST_EVENT = "test_event"  # s3:TestEvent, sent once when a notification is configured
    NOT_CREATED = "not_object_created"  # ObjectRemoved, ObjectRestore, ...
    OTHER_BUCKET = "other_bucket"  # the queue also hears a bucket that is not the store's
    OUTSIDE_PREFIX = "outside_the_store"  # a key outside the store's prefix
    NOT_A_MARKER = "not_a_marker"  # not <model>/<release>/SHA256SUMS, or names no model's


@dataclass(frozen=True)
class Heard:
    """One message read: the models it names, and what in it was dropped (kind, detail)."""

    models: frozenset[str] = frozenset()
    dropped: tuple[tuple[Drop, str], ...] = field(default_factory=tuple)


def read_message(body: str, *, bucket: str, base: str) -> Heard:
    """The models a message names, for the store ``s3://bucket/base`` (``base``: its key
    prefix ending in '/', or empty)."""
    try:
        data = json.loads(body)
    except ValueError:
        return Heard(dropped=((Drop.NOT_JSON, _excerpt(body)),))
    data = _unwrap_sns(data)
    if isinstance(data, dict) and data.get("Event") == "s3:TestEvent":
        return Heard(dropped=((Drop.TEST_EVENT, f"bucket {data.get('Bucket')!r}"),))
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


def _unwrap_sns(data: Any) -> Any:
    """The S3 body inside an SNS notification; anything else as it is."""
    if isinstance(data, dict) and data.get("Type") == "Notification":
        inner = data.get("Message")
        if isinstance(inner, str):
            try:
                return json.loads(inner)
            except ValueError:
                return None
    return data


def _read_record(record: Any, *, bucket: str, base: str) -> str | tuple[Drop, str]:
    """The model one record names, or why it names none."""
    try:
        event = str(record["eventName"])
        source = record.get("eventSource", "aws:s3")
        named_bucket = str(record["s3"]["bucket"]["name"])
        key = unquote_plus(str(record["s3"]["object"]["key"]))
    except (KeyError, TypeError, AttributeError):
        return Drop.NOT_S3, _excerpt(json.dumps(record, default=str))
    if source != "aws:s3":
        return Drop.NOT_S3, f"event source {source!r}"
    if not event.startswith("ObjectCreated:"):
        return Drop.NOT_CREATED, f"{event} s3://{named_bucket}/{key}"
    where = f"s3://{named_bucket}/{key}"
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


def _excerpt(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
