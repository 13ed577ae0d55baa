"""Bodies an SQS queue may hold that are not what S3 sends, each with the kind of drop it is:
read by tests/unit/test_s3_events.py and test_sqs_job.py, and sent to a real queue by
tests/integration/test_sqs_events.py."""

from __future__ import annotations

import json

from controlplane.adapters.stores.s3_events import Drop


def record(**fields: object) -> dict[str, object]:
    """An S3 event record of a release's marker, with ``fields`` changed."""
    found: dict[str, object] = {
        "eventSource": "aws:s3",
        "eventName": "ObjectCreated:Put",
        "s3": {"bucket": {"name": "models"}, "object": {"key": "prod/resnet/r1/SHA256SUMS"}},
    }
    found.update(fields)
    return found


def key_event(key: object) -> str:
    """An S3 event body whose one record has ``key`` as its object key."""
    return json.dumps(
        {"Records": [record(s3={"bucket": {"name": "models"}, "object": {"key": key}})]}
    )


MARKER = Drop.NOT_A_MARKER
DEEP = 100_000  # far deeper than Python's JSON parser goes (its recursion limit)
# Bodies a queue may hold that are not what S3 sends, each with the kind it is dropped as.
# The nested ones crashed the store-events job (RecursionError is no ValueError) until it was
# restarted, and came back after every visibility timeout.
JUNK = {
    "a list": ("[1, 2]", Drop.NOT_S3),
    "a number": ("5", Drop.NOT_S3),
    "a string": ('"hello"', Drop.NOT_S3),
    "null": ("null", Drop.NOT_S3),
    "Records an object": ('{"Records": {"0": {}}}', Drop.NOT_S3),
    "Records a string": ('{"Records": "x"}', Drop.NOT_S3),
    "Records empty": ('{"Records": []}', Drop.NOT_S3),
    "a record without s3": (
        json.dumps({"Records": [{"eventName": "ObjectCreated:Put"}]}),
        Drop.NOT_S3,
    ),
    "a record that is a list": ('{"Records": [[1]]}', Drop.NOT_S3),
    "a record that is null": ('{"Records": [null]}', Drop.NOT_S3),
    "s3 a list": (json.dumps({"Records": [record(s3=[1])]}), Drop.NOT_S3),
    "a key that is a number": (key_event(5), Drop.NOT_S3),
    "a key that is a list": (key_event(["prod/resnet/r1/SHA256SUMS"]), Drop.NOT_S3),
    "a key that is null": (key_event(None), Drop.NOT_S3),
    "a key nested deep": (key_event("K").replace('"K"', "[" * 900 + "]" * 900), Drop.NOT_S3),
    "a bucket name that is an object": (
        json.dumps({"Records": [record(s3={"bucket": {"name": {}}, "object": {"key": "k"}})]}),
        Drop.NOT_S3,
    ),
    "an event name that is a number": (
        json.dumps({"Records": [record(eventName=1)]}),
        Drop.NOT_S3,
    ),
    "an event source that is a list": (
        json.dumps({"Records": [record(eventSource=["aws:s3"])]}),
        Drop.NOT_S3,
    ),
    "SNS with a Message object": (
        json.dumps({"Type": "Notification", "Message": {"Records": [record()]}}),
        Drop.NOT_S3,
    ),
    "SNS with a Message number": ('{"Type": "Notification", "Message": 5}', Drop.NOT_S3),
    "SNS with a Message not JSON": ('{"Type": "Notification", "Message": "{"}', Drop.NOT_S3),
    "SNS with a Message nested deep": (
        json.dumps({"Type": "Notification", "Message": "[" * DEEP}),
        Drop.NOT_S3,
    ),
    "a list nested deep": ("[" * DEEP + "]" * DEEP, Drop.NOT_JSON),
    "an object nested deep": ('{"a":' * DEEP + "1" + "}" * DEEP, Drop.NOT_JSON),
    "Records nested deep": ('{"Records": [' + "[" * DEEP + "]" * DEEP + "]}", Drop.NOT_JSON),
    "a record nested deep": ('{"Records": [' + "[" * 900 + "]" * 900 + "]}", Drop.NOT_S3),
    "a huge body": (
        json.dumps({"Records": [record(eventName="x" * 1_000_000)]}),
        Drop.NOT_CREATED,
    ),
    "a number of 5000 digits": ('{"Records": [' + "9" * 5000 + "]}", Drop.NOT_JSON),
    "NaN": ('{"Records": [NaN, Infinity]}', Drop.NOT_S3),
    "a key that is not percent-encoding": (key_event("prod/%ZZ/r1/SHA256SUMS"), Drop.NOT_A_MARKER),
    "a key that decodes to no UTF-8": (
        key_event("prod/%ED%A0%80%FF/r1/SHA256SUMS"),
        Drop.NOT_A_MARKER,
    ),
    "a key with a lone surrogate": (key_event("prod/\ud800/r1/SHA256SUMS"), Drop.NOT_A_MARKER),
    "a key with a NUL": (key_event("prod/res%00net/r1/SHA256SUMS"), Drop.NOT_A_MARKER),
    "a key of a megabyte": (
        key_event("prod/" + "a" * 1_000_000 + "/r1/SHA256SUMS"),
        Drop.NOT_A_MARKER,
    ),
}
