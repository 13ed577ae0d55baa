"""What an SQS message from a bucket's notifications names: a model to list, or why nothing."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

import pytest

from controlplane.adapters.stores.s3_events import Drop, Heard, read_message
from controlplane.settings import Settings
from tests.support.queue_junk import JUNK, key_event


def _event(key: str, *, bucket: str = "models", name: str = "ObjectCreated:Put") -> str:
    record = {"eventSource": "aws:s3", "eventName": name, "s3": {"bucket": {"name": bucket}}}
    record["s3"]["object"] = {"key": key}  # type: ignore[index]
    return json.dumps({"Records": [record]})


def test_a_marker_of_the_store_names_its_model_with_the_key_decoded() -> None:
    heard = read_message(_event("prod/resnet/2026%2E1/SHA256SUMS"), bucket="models", base="prod/")
    assert heard.models == {"resnet"}
    assert heard.dropped == ()
    # S3 encodes keys form-style ('+' is a space): 'r 1+' is no release's name.
    heard = read_message(_event("prod/resnet/r+1%2B/SHA256SUMS"), bucket="models", base="prod/")
    assert heard.dropped == ((Drop.NOT_A_MARKER, "s3://models/prod/resnet/r 1+/SHA256SUMS"),)


def test_an_s3_event_inside_an_sns_envelope_is_read() -> None:
    body = json.dumps({"Type": "Notification", "Message": _event("resnet/r1/SHA256SUMS")})
    assert read_message(body, bucket="models", base="").models == {"resnet"}


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ("not json {", Drop.NOT_JSON),
        ('{"hello": 1}', Drop.NOT_S3),
        ('{"Service": "Amazon S3", "Event": "s3:TestEvent", "Bucket": "models"}', Drop.TEST_EVENT),
        (_event("prod/resnet/r1/SHA256SUMS", name="ObjectRemoved:Delete"), Drop.NOT_CREATED),
        (_event("prod/resnet/r1/SHA256SUMS", bucket="other"), Drop.OTHER_BUCKET),
        (_event("staging/resnet/r1/SHA256SUMS"), Drop.OUTSIDE_PREFIX),
        (_event("prod/resnet/r1/config.pbtxt"), Drop.NOT_A_MARKER),
        (_event("prod/resnet/r1/1/SHA256SUMS"), Drop.NOT_A_MARKER),
        (_event("prod/_controlplane/x/SHA256SUMS"), Drop.FLEET_RECORD),
        (_event("prod/-bad/r1/SHA256SUMS"), Drop.NOT_A_MARKER),
    ],
)
def test_what_names_no_release_is_dropped_with_its_kind(body: str, kind: Drop) -> None:
    heard = read_message(body, bucket="models", base="prod/")
    assert heard.models == frozenset()
    assert [drop for drop, _detail in heard.dropped] == [kind]


@pytest.mark.parametrize("event", ["ObjectCreated:Put", "ObjectRemoved:Delete"])
def test_a_desired_state_written_or_deleted_names_its_model_for_the_fleet(event: str) -> None:
    body = _event("prod/_controlplane/desired/resnet.json", name=event)
    heard = read_message(body, bucket="models", base="prod/")
    assert heard == Heard(desired=frozenset({"resnet"}))
    # Through SNS, and with the key encoded whole, as moto's and AWS's S3 send it.
    wrapped = json.dumps(
        {"Type": "Notification", "Message": _event("%5Fcontrolplane%2Fdesired%2Fbert%2Ev2.json")}
    )
    assert read_message(wrapped, bucket="models", base="").desired == {"bert.v2"}


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("prod/_controlplane/members/m1.json", Drop.HEARTBEAT),
        ("prod/_controlplane/members/deeper/m1.json", Drop.HEARTBEAT),
        ("prod/_controlplane/probe/0123abcd", Drop.FLEET_RECORD),
        ("prod/_controlplane/desired/resnet.json.tmp", Drop.FLEET_RECORD),
        ("prod/_controlplane/desired/sub/resnet.json", Drop.FLEET_RECORD),
        ("prod/_controlplane/desired/_x.json", Drop.FLEET_RECORD),
        ("prod/_controlplane/desired/.json", Drop.FLEET_RECORD),
    ],
)
def test_other_fleet_records_are_dropped_by_their_key_with_a_kind_of_their_own(
    key: str, kind: Drop
) -> None:
    for event in ("ObjectCreated:Put", "ObjectRemoved:Delete"):
        heard = read_message(_event(key, name=event), bucket="models", base="prod/")
        assert heard.models == heard.desired == frozenset()
        assert [drop for drop, _detail in heard.dropped] == [kind]


def test_a_heartbeat_s_drop_says_how_to_narrow_the_notification() -> None:
    heard = read_message(
        _event("prod/_controlplane/members/m1.json"), bucket="models", base="prod/"
    )
    ((_kind, detail),) = heard.dropped
    assert "s3://models/prod/_controlplane/members/m1.json" in detail
    assert "docs/notifications.md" in detail


def test_desired_state_of_another_bucket_or_prefix_or_restored_names_nothing() -> None:
    cases = [
        (_event("prod/_controlplane/desired/resnet.json", bucket="other"), Drop.OTHER_BUCKET),
        (_event("staging/_controlplane/desired/resnet.json"), Drop.OUTSIDE_PREFIX),
        (
            _event("prod/_controlplane/desired/resnet.json", name="ObjectRestore:Completed"),
            Drop.NOT_CREATED,
        ),
    ]
    for body, kind in cases:
        heard = read_message(body, bucket="models", base="prod/")
        assert heard.desired == frozenset(), body
        assert [drop for drop, _detail in heard.dropped] == [kind], body


def test_a_message_of_several_records_names_releases_and_desired_states_together() -> None:
    records = [
        json.loads(_event(key))["Records"][0]
        for key in (
            "prod/resnet/r2/SHA256SUMS",
            "prod/_controlplane/desired/bert.json",
            "prod/_controlplane/members/m2.json",
        )
    ]
    heard = read_message(json.dumps({"Records": records}), bucket="models", base="prod/")
    assert heard.models == {"resnet"}
    assert heard.desired == {"bert"}
    assert [drop for drop, _detail in heard.dropped] == [Drop.HEARTBEAT]


@pytest.mark.parametrize("shape", sorted(JUNK))
def test_a_body_of_any_shape_is_dropped_with_a_short_printable_detail(shape: str) -> None:
    body, kind = JUNK[shape]

    heard = read_message(body, bucket="models", base="prod/")

    assert heard.models == frozenset()
    assert [drop for drop, _detail in heard.dropped] == [kind] * len(heard.dropped)
    assert heard.dropped
    for _drop, detail in heard.dropped:
        assert len(detail) <= 300, detail[:400]
        assert detail.isprintable(), detail


def _deep_stack(frames: int, then: Callable[[], Heard]) -> Heard:
    return then() if frames == 0 else _deep_stack(frames - 1, then)


@pytest.mark.parametrize("shape", sorted(JUNK))
def test_a_body_is_read_safely_however_deep_the_caller_s_stack_is(shape: str) -> None:
    """The job reads a message some way down its own stack: what the parser can nest there
    depends on it, and a body too deep for it is dropped, never raised."""
    body, _kind = JUNK[shape]
    frames = sys.getrecursionlimit() - 150

    heard = _deep_stack(frames, lambda: read_message(body, bucket="models", base="prod/"))

    assert heard.models == frozenset()
    assert heard.dropped


def test_a_key_percent_encoded_whole_still_names_its_model() -> None:
    body = key_event("prod%2Fresnet%2Fr1%2FSHA256SUMS")
    assert read_message(body, bucket="models", base="prod/").models == {"resnet"}


def test_a_queue_beside_a_directory_store_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match=r"store\.notifications\.sqs_queue_url needs an S3 store"):
        Settings.model_validate(
            {
                "repository": {"path": "/srv/repository"},
                "store": {
                    "uri": "file:///srv/store",
                    "notifications": {"sqs_queue_url": "https://sqs.us-east-1.amazonaws.com/1/q"},
                },
            }
        )


def test_a_model_sig_is_a_marker_too() -> None:
    """A release signed with OpenSSF Model Signing and no SHA256SUMS: model.sig, uploaded
    last, is its marker; SHA256SUMS.sig is not one."""
    heard = read_message(_event("prod/resnet/r1/model.sig"), bucket="models", base="prod/")
    assert heard.models == {"resnet"}
    assert heard.dropped == ()
    heard = read_message(_event("prod/resnet/r1/SHA256SUMS.sig"), bucket="models", base="prod/")
    assert heard.dropped == ((Drop.NOT_A_MARKER, "s3://models/prod/resnet/r1/SHA256SUMS.sig"),)
