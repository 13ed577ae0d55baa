"""A real S3 API on loopback for tests: the moto server, clients and publishers.

- :func:`moto_server` runs moto's S3 over real HTTP on a free port for as long as its block;
  ``one_at_a_time`` serves one request after the other, so that its conditional writes are
  atomic, as AWS S3 promises (moto checks ``If-Match`` and then writes, with no lock between,
  so two racing requests on its threaded server can both pass the check);
- :func:`s3_client` builds a boto3 client for an endpoint with dummy credentials; close it;
- :func:`upload_release` and :func:`upload_release_dir` publish a release the way a publisher
  must: every file first, ``SHA256SUMS`` (the commit marker) last.

The fault-injecting proxy that goes between a client and moto is in :mod:`.fault_proxy`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.server import ThreadedMotoServer
from werkzeug.serving import make_server

MANIFEST = "SHA256SUMS"
REGION = "us-east-1"


@contextmanager
def moto_server(*, one_at_a_time: bool = False) -> Iterator[str]:
    """Run moto's S3 on 127.0.0.1 (a port the OS picks); yield its endpoint URL."""
    if one_at_a_time:
        with _serial_moto_server() as endpoint:
            yield endpoint
        return
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        # stop() shuts the loop down but leaves the listening socket open.
        inner = getattr(server, "_server", None)
        if inner is not None:
            inner.server_close()


@contextmanager
def _serial_moto_server() -> Iterator[str]:
    """moto's app on werkzeug's single-threaded server (HTTP/1.0: one connection per request,
    so a client's idle keep-alive connection never holds the others up). moto's state is the
    process's, shared with every other moto server in it."""
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server("127.0.0.1", 0, app, threaded=False, request_handler=MotoRequestHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.01}, name="moto-serial"
    )
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


@functools.cache
def _session() -> Any:
    # One session for every test client: a new session loads the S3 model again (~0.25 s).
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
    )


def aws_env(endpoint: str) -> dict[str, str]:
    """The environment a process needs to reach ``endpoint`` through boto3's own chain."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_ENDPOINT_URL_SQS": endpoint,  # moto serves every API on one endpoint
        "AWS_ENDPOINT_URL_SNS": endpoint,
    }


def s3_client(
    endpoint: str,
    *,
    max_pool_connections: int = 16,
    read_timeout: float = 10.0,
    checksums: bool = True,
) -> Any:
    """A boto3 S3 client for ``endpoint`` with dummy credentials and botocore retries off.

    ``checksums=False`` uploads without the CRC32 botocore adds by default, as older SDKs and
    many S3-compatible stores do: a GET then carries no checksum botocore could verify.
    Build clients from the test's thread only: the shared session is not thread-safe.
    """
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        connect_timeout=5,
        read_timeout=read_timeout,
        request_checksum_calculation="when_supported" if checksums else "when_required",
    )
    return _session().client("s3", endpoint_url=endpoint, config=config)


def sqs_client(endpoint: str, *, max_pool_connections: int = 10) -> Any:
    """A boto3 SQS client for ``endpoint`` (moto serves SQS beside S3); close it. Each long
    poll in flight holds one of its ``max_pool_connections``."""
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        read_timeout=30,
        max_pool_connections=max_pool_connections,
    )
    return _session().client("sqs", endpoint_url=endpoint, config=config)


def sns_client(endpoint: str) -> Any:
    """A boto3 SNS client for ``endpoint`` (moto serves SNS beside S3 and SQS); close it."""
    config = botocore.config.Config(retries={"total_max_attempts": 1, "mode": "standard"})
    return _session().client("sns", endpoint_url=endpoint, config=config)


def notify_topic(s3: Any, sns: Any, bucket: str, prefix: str, topic: str) -> str:
    """Send the bucket's events that a fleet on ``s3://bucket/prefix`` needs to the SNS topic
    ``topic`` (made if missing), as docs/notifications.md sets it up: a topic policy that lets
    S3 publish, then two rules that do not overlap (their suffixes differ): each release's
    ``SHA256SUMS`` created, and each desired-state record created or removed; heartbeats
    (``_controlplane/members/``) match neither. Returns the topic's ARN."""
    arn: str = sns.create_topic(Name=topic)["TopicArn"]
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "s3.amazonaws.com"},
                "Action": "SNS:Publish",
                "Resource": arn,
                "Condition": {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{bucket}"}},
            }
        ],
    }
    sns.set_topic_attributes(
        TopicArn=arn, AttributeName="Policy", AttributeValue=json.dumps(policy)
    )
    base = f"{prefix.strip('/')}/" if prefix.strip("/") else ""

    def rule(events: list[str], key_prefix: str, suffix: str) -> dict[str, Any]:
        rules = [{"Name": "prefix", "Value": key_prefix}] if key_prefix else []
        rules.append({"Name": "suffix", "Value": suffix})
        return {"TopicArn": arn, "Events": events, "Filter": {"Key": {"FilterRules": rules}}}

    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "TopicConfigurations": [
                rule(["s3:ObjectCreated:*"], base, MANIFEST),
                rule(
                    ["s3:ObjectCreated:*", "s3:ObjectRemoved:*"],
                    f"{base}_controlplane/desired/",
                    ".json",
                ),
            ]
        },
    )
    return arn


def subscribe_queue(sqs: Any, sns: Any, topic_arn: str, queue: str) -> str:
    """A queue of the test's own on the topic: it hears what every member's queue hears.
    Returns its URL."""
    url: str = sqs.create_queue(QueueName=queue)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn)
    return url


def notify_queue(s3: Any, sqs: Any, bucket: str, queue: str) -> str:
    """Send the bucket's ``s3:ObjectCreated:*`` events of ``SHA256SUMS`` keys to the SQS
    queue ``queue`` (made if missing), as an AWS user sets it up: a queue policy that lets S3
    send, then the bucket notification. Returns the queue's URL. S3 (and moto) first sends an
    ``s3:TestEvent`` to the queue."""
    url: str = sqs.create_queue(QueueName=queue)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": "s3.amazonaws.com"},
                "Action": "sqs:SendMessage",
                "Resource": arn,
                "Condition": {"ArnLike": {"aws:SourceArn": f"arn:aws:s3:::{bucket}"}},
            }
        ],
    }
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(policy)})
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "QueueConfigurations": [
                {
                    "QueueArn": arn,
                    "Events": ["s3:ObjectCreated:*"],
                    "Filter": {"Key": {"FilterRules": [{"Name": "suffix", "Value": MANIFEST}]}},
                }
            ]
        },
    )
    return url


def queued(sqs: Any, url: str) -> int:
    """Messages in the queue, visible or received and not yet deleted."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return sum(int(attributes[name]) for name in names)


def sha256sums(files: Mapping[str, bytes]) -> bytes:
    """``sha256sum`` text for ``files`` (coreutils format, sorted paths)."""
    lines = [f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in sorted(files.items())]
    return "".join(lines).encode()


def _key(prefix: str, model: str, release: str, rel: str) -> str:
    return "/".join(part for part in (prefix.strip("/"), model, release, rel) if part)


def upload_release(
    client: Any,
    bucket: str,
    prefix: str,
    model: str,
    release: str,
    files: Mapping[str, bytes],
    *,
    checksums: bool = True,
) -> dict[str, str]:
    """Upload ``files`` under ``<prefix>/<model>/<release>/``, then ``SHA256SUMS`` last.

    Returns the ETag of every uploaded key (by relative path).
    """
    etags = {}
    for rel, data in sorted(files.items()):
        answer = client.put_object(Bucket=bucket, Key=_key(prefix, model, release, rel), Body=data)
        etags[rel] = answer["ETag"]
    if checksums:
        key = _key(prefix, model, release, MANIFEST)
        etags[MANIFEST] = client.put_object(Bucket=bucket, Key=key, Body=sha256sums(files))["ETag"]
    return etags


def upload_release_dir(client: Any, bucket: str, prefix: str, release_dir: Path) -> None:
    """Upload a release built on disk (``write_scale_release``), ``SHA256SUMS`` last.

    The model and release names are the last two components of ``release_dir``.
    """
    model, release = release_dir.parent.name, release_dir.name
    files = sorted(p for p in release_dir.rglob("*") if p.is_file() and not p.is_symlink())
    manifest = release_dir / MANIFEST
    for path in [p for p in files if p != manifest] + [p for p in files if p == manifest]:
        rel = path.relative_to(release_dir).as_posix()
        client.put_object(
            Bucket=bucket, Key=_key(prefix, model, release, rel), Body=path.read_bytes()
        )
