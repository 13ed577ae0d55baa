"""The S3 API as the S3 store speaks it: the boto3 client, the one path of every request, and
the one map of the library's errors.

This module owns every call to boto3 and botocore that reads a release (the store's listing,
:mod:`.s3_listing`, and its download, :mod:`.s3_download`, reach S3 only through
:class:`S3Bucket` here) and maps their errors to the project's in one place,
:func:`translate` (applied by :func:`mapped`), most specific first::

    NoSuchBucket                                -> StoreError       (names the bucket)
    412 PreconditionFailed, 404 during a fetch  -> ReleaseChanged   (the listing went stale)
    404 NoSuchKey / HEAD 404 otherwise          -> ReleaseNotFound  (callers decide)
    throttling (SlowDown, 429, ...)             -> StoreUnavailable (throttled)
    any other 5xx                               -> StoreUnavailable (server_error)
    connect and read timeouts                   -> StoreUnavailable (timeout)
    a body that fails botocore's checksum       -> StoreUnavailable (corrupt)
    dropped or short connections                -> StoreUnavailable (connection)
    an answer shorter than its Content-Length   -> StoreUnavailable (connection)
    403 and every other refusal                 -> StoreError       (names the key)

Every :class:`StoreUnavailable` is retried and carries its cause (``details["cause"]``, one
of :class:`~controlplane.domain.transfer.RetryCause`, in brackets above), which the retry log
and the ``controlplane_store_retries_total`` metric report. The retries are the store's one
policy (:mod:`.retries`): :func:`build_client` turns botocore's own off, so one policy decides
and the attempt count in a message is the real one.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]
import urllib3.exceptions

from controlplane.adapters.stores.retries import Aborted, Retrier
from controlplane.adapters.stores.s3_transfer import CHUNK, RemoteObject
from controlplane.domain.errors import (
    ControlPlaneError,
    Interrupted,
    ReleaseChanged,
    ReleaseNotFound,
    StoreError,
    StoreUnavailable,
)
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.transfer import RetryCause

_THROTTLING = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequests",
}
_TIMEOUTS = (
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectTimeoutError,
    urllib3.exceptions.TimeoutError,
)
_TRANSPORT = (
    botocore.exceptions.HTTPClientError,  # ConnectionClosed, ReadTimeout, ResponseStreaming
    botocore.exceptions.ConnectionError,  # EndpointConnection, ConnectTimeout
    botocore.exceptions.IncompleteReadError,  # a body shorter than its Content-Length
    botocore.exceptions.FlexibleChecksumError,  # corrupted in transit
    urllib3.exceptions.HTTPError,  # ProtocolError, when botocore does not wrap it
    http.client.IncompleteRead,
)
_LIBRARY = (
    botocore.exceptions.ClientError,
    botocore.exceptions.BotoCoreError,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
)


# One attempt waits this long for a connection, and for each next byte of an answer. An
# attempt under way cannot be cut from outside (it runs on a worker thread), so these bound
# how far past its budget a call can run: botocore's 60 s made a store behind a partition that
# drops packets answer a deploy without wait in 120 s, not in the few seconds promised.
CONNECT_TIMEOUT = 3.0
READ_TIMEOUT = 5.0  # between two bytes, not for a whole object: S3 streams a part steadily


def build_client(max_concurrency: int) -> Any:
    """An S3 client from the standard chain (credentials, region, AWS_ENDPOINT_URL(_S3),
    profiles), with a connection for each download worker, botocore's retries off, and
    timeouts that fit the retry policy's budgets."""
    # ``total_max_attempts`` counts the first try (``max_attempts`` here would mean one
    # *retry*): botocore makes one attempt and our policy makes the others.
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=max_concurrency + 4,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
    )
    return boto3.session.Session().client("s3", config=config)


_SHORT_ANSWER_CHECK = "controlplane-refuse-short-answer"


def refuse_short_answer(
    operation_model: Any, response_dict: dict[str, Any], **_kwargs: Any
) -> None:
    """Raise for an answer cut short: a body shorter than its ``Content-Length``, or headers
    that end without saying how long the body is.

    botocore parses a body cut to nothing as an answer without fields, so a listing cut by a
    dropped connection read as an *empty* listing (no releases, no members, no desired
    state) rather than an error: 46 of 2,805 listings through a proxy going down at random
    moments. Streamed bodies (GetObject) are checked by botocore as they are read; a HEAD's
    ``Content-Length`` is the object's, not the answer's; S3 frames every other answer.
    """
    if operation_model.http["method"] == "HEAD" or response_dict["status_code"] in (204, 304):
        return
    headers = response_dict["headers"]
    declared = headers.get("content-length")
    if declared is None:
        if "chunked" not in headers.get("transfer-encoding", "").lower():
            raise botocore.exceptions.ResponseStreamingError(
                error="the answer's headers ended without its length (the connection was cut)"
            )
        return
    body = response_dict["body"]
    if isinstance(body, bytes) and len(body) != int(declared):
        raise botocore.exceptions.ResponseStreamingError(
            error=f"{len(body)} of the answer's {declared} bytes came (the connection was cut)"
        )


def translate(
    exc: Exception, what: str, *, bucket: str, changed: str | None, endpoint: str | None = None
) -> ControlPlaneError:
    """The project's error for a library error about ``what``; ``changed`` names the release
    being fetched, when there is one; ``endpoint`` is the S3 API's address."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        detail = f"{code or 'HTTP ' + str(status)}: {error.get('Message', '') or exc}"
        if code == "NoSuchBucket":
            return StoreError(
                f"bucket {bucket!r} does not exist at {endpoint or 'S3'} (store.uri): create "
                "it or fix the setting (and the endpoint, AWS_ENDPOINT_URL_S3, for an S3 "
                "API other than AWS's)",
                details={"bucket": bucket},
            )
        if changed is not None and (
            code in ("PreconditionFailed", "NoSuchKey") or status in (404, 412)
        ):
            return ReleaseChanged(
                f"objects of release {changed} changed during the download ({what}: {detail}); "
                "it will be retried later"
            )
        if code in ("NoSuchKey", "NotFound", "404") or status == 404:
            return ReleaseNotFound(f"{what} does not exist")
        if code in _THROTTLING or status == 429:
            return _unavailable(f"{what}: {detail} (HTTP {status})", RetryCause.THROTTLED)
        if status >= 500:
            return _unavailable(f"{what}: {detail} (HTTP {status})", RetryCause.SERVER_ERROR)
        if code == "AccessDenied" or status == 403:
            return StoreError(
                f"access to {what} was denied ({detail}); check the credentials and the "
                "bucket policy",
                details={"key": what},
            )
        return StoreError(f"the store refused {what}: {detail} (HTTP {status})")
    if isinstance(exc, _TIMEOUTS):
        return _unavailable(f"{what}: {type(exc).__name__}: {exc}", RetryCause.TIMEOUT)
    if isinstance(exc, botocore.exceptions.FlexibleChecksumError):
        return _unavailable(f"{what}: {type(exc).__name__}: {exc}", RetryCause.CORRUPT)
    if isinstance(exc, _TRANSPORT):
        return _unavailable(f"{what}: {type(exc).__name__}: {exc}", RetryCause.CONNECTION)
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return StoreError(f"no AWS credentials were found to read {what}: {exc}")
    return StoreError(f"{what}: {type(exc).__name__}: {exc}")


def _unavailable(message: str, cause: RetryCause) -> StoreUnavailable:
    return StoreUnavailable(message, details={"cause": cause.value})


@contextmanager
def mapped(
    bucket: str, key: str, *, changed: str | None = None, endpoint: str | None = None
) -> Iterator[None]:
    """Translate the library errors raised inside the block into the project's."""
    try:
        yield
    except _LIBRARY as exc:
        raise translate(
            exc, f"s3://{bucket}/{key}", bucket=bucket, changed=changed, endpoint=endpoint
        ) from exc


class S3Bucket:
    """The requests of one store to its bucket: each mapped, retried within the budget the
    caller picks (a fetch's, ``retrier``, by default; a scan's, ``scan_retrier``), and cut short
    with :class:`Interrupted` once ``closing`` is set."""

    def __init__(
        self,
        client: Any,
        *,
        bucket: str,
        base: str,
        retrier: Retrier,
        scan_retrier: Retrier,
        closing: threading.Event,
    ) -> None:
        self.client = client
        if hasattr(client, "meta"):  # every answer is checked whole, on any client given
            client.meta.events.register(
                "before-parse.s3.*", refuse_short_answer, unique_id=_SHORT_ANSWER_CHECK
            )
        self.name = bucket
        self.base = base  # the key prefix of the store, ending in '/' (or empty)
        self.uri = f"s3://{bucket}/{base}".rstrip("/")
        self.retrier = retrier
        self.scan_retrier = scan_retrier
        self._closing = closing
        self._endpoint: str | None = getattr(getattr(client, "meta", None), "endpoint_url", None)

    def url(self, key: str) -> str:
        return f"s3://{self.name}/{key}"

    def release_base(self, model: str, release: str) -> str:
        return f"{self.base}{validate_model_name(model)}/{validate_release_name(release)}/"

    def call(self, fn: Callable[[], Any], key: str, retrier: Retrier | None = None) -> Any:
        """``fn()`` (a request about ``key``), its errors mapped, retried by ``retrier``."""

        def once() -> Any:
            with mapped(self.name, key, endpoint=self._endpoint):
                return fn()

        try:
            return (retrier or self.retrier).call(once, what=self.url(key), abort=self._closing)
        except Aborted:
            raise Interrupted(f"the store {self.uri} is closing") from None

    def pages(
        self,
        prefix: str,
        *,
        delimiter: str | None = None,
        retrier: Retrier | None = None,
        start_after: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages under ``prefix`` (of the keys after ``start_after``, when
        given); each page call is retried on its own."""
        kwargs: dict[str, Any] = {"Bucket": self.name, "Prefix": prefix}
        if delimiter is not None:
            kwargs["Delimiter"] = delimiter
        if start_after is not None:
            kwargs["StartAfter"] = start_after
        while True:
            page = self.call(lambda: self.client.list_objects_v2(**kwargs), prefix, retrier)
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token

    def head(self, key: str, retrier: Retrier) -> dict[str, Any]:
        """HeadObject of ``key``: :class:`ReleaseNotFound` when there is none."""
        return self.call(  # type: ignore[no-any-return]
            lambda: self.client.head_object(Bucket=self.name, Key=key), key, retrier
        )

    def holds_any(self, prefix: str, retrier: Retrier) -> bool:
        """Whether any key starts with ``prefix`` (one listing of at most one key)."""
        page = self.call(
            lambda: self.client.list_objects_v2(Bucket=self.name, Prefix=prefix, MaxKeys=1),
            prefix,
            retrier,
        )
        return bool(page.get("Contents"))

    def get_small(
        self,
        key: str,
        bound: int,
        *,
        too_large: Callable[[int, str], ControlPlaneError] | None = None,
    ) -> bytes | None:
        """An object of at most ``bound`` bytes; one larger is ``too_large`` (when given) or
        its first ``bound`` + 1 bytes. None when there is no such object."""

        def get() -> bytes:
            response = self.client.get_object(Bucket=self.name, Key=key)
            body = response["Body"]
            try:
                size = int(response.get("ContentLength", 0))
                if size > bound and too_large is not None:
                    raise too_large(size, self.url(key))
                return bytes(body.read(bound + 1))
            finally:
                body.close()

        try:
            return self.call(get, key)  # type: ignore[no-any-return]
        except ReleaseNotFound:
            return None

    def reader(self, *, changed: str) -> ObjectGet:
        """The GETs of one download of the release ``changed`` (``model/release``)."""
        return ObjectGet(self.client, self.name, changed=changed)


class ObjectGet:
    """One GET for :mod:`.s3_download` (its :class:`~.s3_transfer.ObjectReader`): ``If-Match``
    the listed ETag, streamed in chunks."""

    def __init__(self, client: Any, bucket: str, *, changed: str) -> None:
        self._client = client
        self._bucket = bucket
        self._changed = changed

    def read(
        self, obj: RemoteObject, span: tuple[int, int] | None, sink: Callable[[bytes], None]
    ) -> None:
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Key": obj.key}
        if obj.etag:
            kwargs["IfMatch"] = obj.etag
        if span is not None:
            kwargs["Range"] = f"bytes={span[0]}-{span[1]}"
        with mapped(self._bucket, obj.key, changed=self._changed):
            response = self._client.get_object(**kwargs)
            body = response["Body"]
            try:
                if obj.etag and response.get("ETag") != obj.etag:
                    raise ReleaseChanged(
                        f"objects of release {self._changed} changed during the download "
                        f"({obj.key} is now {response.get('ETag')}, was {obj.etag}); "
                        "it will be retried later"
                    )
                while chunk := body.read(CHUNK):
                    sink(chunk)
            finally:
                body.close()
