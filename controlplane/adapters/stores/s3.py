"""The S3 model store: ``s3://bucket/prefix/<model>/<release>/<files>``.

The layout is the local store's: a release is every object below ``<model>/<release>/`` and
``SHA256SUMS``, uploaded last, is its commit marker. A release's ``revision`` is the ETag of
that marker, so republishing a release under the same name is seen as a change.

This module owns every call to boto3 and botocore (the download machinery in
:mod:`.s3_download` reaches S3 only through :class:`_Reader` here) and maps their errors to
the project's in one place, :func:`_translate` (applied by :func:`_mapped`), most specific
first::

    NoSuchBucket                                -> StoreError       (names the bucket)
    412 PreconditionFailed, 404 during a fetch  -> ReleaseChanged   (the listing went stale)
    404 NoSuchKey / HEAD 404 otherwise          -> ReleaseNotFound  (callers decide)
    throttling (SlowDown, 429, ...)             -> StoreUnavailable (throttled)
    any other 5xx                               -> StoreUnavailable (server_error)
    connect and read timeouts                   -> StoreUnavailable (timeout)
    a body that fails botocore's checksum       -> StoreUnavailable (corrupt)
    dropped or short connections                -> StoreUnavailable (connection)
    403 and every other refusal                 -> StoreError       (names the key)

Every :class:`StoreUnavailable` is retried and carries its cause (``details["cause"]``, one
of :class:`~controlplane.domain.transfer.RetryCause`, in brackets above), which the retry log
and the ``controlplane_store_retries_total`` metric report.

Retries are ours (:mod:`.retries`, bounded by ``retry_seconds``): the client is built with
botocore's own retries off, so one policy decides and the attempt count in a message is the
real one. What a deploy fetches (the manifest, the listing, every GET) gets the whole budget;
the scans of the watcher and of status (``list_models``, ``list_releases``) and ``describe``
get a few seconds: the scans run again on their own, and ``describe`` answers an API call
before any work starts (a store that does not answer is ``store_unavailable`` within seconds,
for the caller to retry, rather than a request held for the whole budget). A caller that
waits for the operation anyway (``describe(..., patient=True)``: a deploy asked with
``wait``) gets the whole budget there too, so it rides out an outage as the fetch does.
:meth:`S3Store.close` cuts every retry in flight short.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]
import urllib3.exceptions

from controlplane.adapters.stores.retries import Aborted, Retrier
from controlplane.adapters.stores.s3_download import (
    CHUNK,
    RemoteObject,
    TransferPolicy,
    download_objects,
)
from controlplane.domain.checksums import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SIGNATURE_NAME,
    FileDigest,
    decode_manifest,
    manifest_too_large,
    safe_relpath,
)
from controlplane.domain.errors import (
    ControlPlaneError,
    Interrupted,
    InvalidName,
    ModelNotFound,
    ReleaseChanged,
    ReleaseNotFound,
    StoreError,
    StoreUnavailable,
    UnsafeRelease,
)
from controlplane.domain.ignored import (
    IgnoredName,
    ignored_model,
    ignored_release,
    release_name_problem,
)
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.releases import ReleaseInfo, natural_key
from controlplane.domain.signatures import MAX_SIGNATURE_BYTES
from controlplane.domain.transfer import RetryCause
from controlplane.ports import (
    FetchedRelease,
    FetchProgress,
    MarkerFiles,
    ReleaseListing,
    StoredFile,
    Telemetry,
)

SCAN_RETRY_SECONDS = 5.0  # budget of the watcher's and status's listings (they run again)

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


def _translate(
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


class S3Store:
    """A :class:`~controlplane.ports.ModelStore` over ``s3://bucket[/prefix]``."""

    def __init__(
        self,
        uri: str,
        *,
        client: Any | None = None,
        max_concurrency: int = 8,
        multipart_threshold: int = 64 * 1024 * 1024,
        part_size: int = 16 * 1024 * 1024,
        retry_seconds: float = 120.0,
        backoff_max: float = 5.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc or parsed.query or parsed.fragment:
            raise ValueError(f"store URI {uri!r} is not of the form s3://bucket[/prefix]")
        self._bucket = parsed.netloc
        prefix = parsed.path.strip("/")
        self._base = f"{prefix}/" if prefix else ""
        self._uri = f"s3://{self._bucket}/{prefix}".rstrip("/")
        self._policy = TransferPolicy(
            max_concurrency=max_concurrency,
            multipart_threshold=multipart_threshold,
            part_size=part_size,
        )
        self._retrier = Retrier(budget=retry_seconds, backoff_max=backoff_max, telemetry=telemetry)
        self._scan_retrier = Retrier(
            budget=min(retry_seconds, SCAN_RETRY_SECONDS),
            backoff_max=backoff_max,
            telemetry=telemetry,
            budget_name="the budget of a scan or a fleet record's read",
        )
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._downloads: set[threading.Event] = set()  # abort events of downloads running
        self._owns_client = client is None
        if client is None:
            # The standard chain applies: credentials, region, AWS_ENDPOINT_URL(_S3), profiles.
            # ``total_max_attempts`` counts the first try (``max_attempts`` here would mean
            # one *retry*): botocore makes one attempt and our policy makes the others.
            config = botocore.config.Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                max_pool_connections=max_concurrency + 4,
            )
            client = boto3.session.Session().client("s3", config=config)
        self._client = client
        self._endpoint: str | None = getattr(getattr(client, "meta", None), "endpoint_url", None)

    @property
    def uri(self) -> str:
        return self._uri

    def close(self) -> None:
        """Stop every retry and download in flight; close the client if this store built it."""
        self._closing.set()
        with self._lock:
            for abort in self._downloads:
                abort.set()
        if self._owns_client:
            self._client.close()

    # --- listing --------------------------------------------------------------------------

    def list_models(self, *, ignored: Callable[[IgnoredName], None] | None = None) -> list[str]:
        names = []
        for page in self._pages(self._base, delimiter="/", retrier=self._scan_retrier):
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(self._base) :].rstrip("/")
                try:
                    names.append(validate_model_name(name))
                except InvalidName:
                    where = self._url(common["Prefix"])
                    if ignored is not None and (left_out := ignored_model(name, where)):
                        ignored(left_out)
        return sorted(names, key=natural_key)

    def list_releases(
        self, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
    ) -> list[ReleaseInfo]:
        base = f"{self._base}{validate_model_name(model)}/"
        markers: dict[str, str | None] = {}
        signed: set[str] = set()  # releases with a SHA256SUMS.sig: the listing names it anyway
        refused: set[str] = set()  # names that are no release's, each judged once
        seen = False
        for page in self._pages(base, retrier=self._scan_retrier):
            for entry in page.get("Contents", []):
                seen = True
                key = entry["Key"]
                name, slash, path = key[len(base) :].partition("/")
                if not slash or not path or name in refused:
                    continue
                if name not in markers:
                    if (problem := release_name_problem(name)) is not None:
                        refused.add(name)
                        where = self._url(key[: len(base) + len(name) + 1])  # the listed key's
                        if ignored is not None and (left := ignored_release(name, problem, where)):
                            ignored(left)
                        continue
                    markers[name] = None
                if path == MANIFEST_NAME:
                    markers[name] = _revision(entry["ETag"])
                elif path == SIGNATURE_NAME:
                    signed.add(name)
        if not seen:
            raise ModelNotFound(f"model {model!r} is not in the store {self.uri}")
        return [
            ReleaseInfo(model, name, revision is not None, revision, name in signed)
            for name, revision in sorted(markers.items(), key=lambda item: natural_key(item[0]))
        ]

    def describe(self, model: str, release: str, *, patient: bool = False) -> ReleaseInfo:
        base = self._release_base(model, release)
        retrier = self._retrier if patient else self._scan_retrier
        try:
            head = self._call(
                lambda: self._client.head_object(Bucket=self._bucket, Key=base + MANIFEST_NAME),
                base + MANIFEST_NAME,
                retrier,
            )
            revision = _revision(head["ETag"])
        except ReleaseNotFound:
            pass
        else:
            try:
                self._call(
                    lambda: self._client.head_object(
                        Bucket=self._bucket, Key=base + SIGNATURE_NAME
                    ),
                    base + SIGNATURE_NAME,
                    retrier,
                )
            except ReleaseNotFound:
                return ReleaseInfo(model, release, True, revision, signed=False)
            return ReleaseInfo(model, release, True, revision, signed=True)
        page = self._call(
            lambda: self._client.list_objects_v2(Bucket=self._bucket, Prefix=base, MaxKeys=1),
            base,
            retrier,
        )
        if not page.get("Contents"):
            raise ReleaseNotFound(
                f"release {release!r} of model {model!r} is not in the store {self.uri}"
            )
        return ReleaseInfo(model, release, False, None)

    def read_manifest(self, model: str, release: str) -> dict[str, str] | None:
        key = self._release_base(model, release) + MANIFEST_NAME
        data = self._get_small(key, MAX_MANIFEST_BYTES, too_large=manifest_too_large)
        return None if data is None else decode_manifest(data, self._url(key))

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        base = self._release_base(model, release)
        manifest = self._get_small(
            base + MANIFEST_NAME, MAX_MANIFEST_BYTES, too_large=manifest_too_large
        )
        signature = self._get_small(base + SIGNATURE_NAME, MAX_SIGNATURE_BYTES)
        return MarkerFiles(manifest=manifest, signature=signature)

    def _get_small(
        self,
        key: str,
        bound: int,
        *,
        too_large: Callable[[int, str], ControlPlaneError] | None = None,
    ) -> bytes | None:
        """An object of at most ``bound`` bytes; one larger is ``too_large`` (when given) or
        its first ``bound`` + 1 bytes. None when there is no such object."""

        def get() -> bytes:
            response = self._client.get_object(Bucket=self._bucket, Key=key)
            body = response["Body"]
            try:
                size = int(response.get("ContentLength", 0))
                if size > bound and too_large is not None:
                    raise too_large(size, self._url(key))
                return bytes(body.read(bound + 1))
            finally:
                body.close()

        try:
            return self._call(get, key)  # type: ignore[no-any-return]
        except ReleaseNotFound:
            return None

    def list_files(self, model: str, release: str) -> ReleaseListing:
        base = self._release_base(model, release)
        listed = [entry for page in self._pages(base) for entry in page.get("Contents", [])]
        if not listed:
            raise ReleaseNotFound(
                f"release {release!r} of model {model!r} is not in the store {self.uri}"
            )
        return ReleaseListing(model, release, _files(base, listed))

    # --- fetching -------------------------------------------------------------------------

    def confirm(
        self,
        listing: ReleaseListing,
        rel: str,
        sha256: str,
        cancel: threading.Event | None = None,
    ) -> bool:
        """False: reading an object is downloading it. The listed ETag is the evidence, and
        the content cache keeps the ETags it verified (an ETag is the MD5 of the content for
        a single-part upload, so the same bytes under another key still hit)."""
        return False

    def fetch(
        self,
        listing: ReleaseListing,
        dest: Path,
        *,
        manifest: Mapping[str, str] | None,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> FetchedRelease:
        base = self._release_base(listing.model, listing.release)
        root = dest.resolve()
        objects = []
        for rel, stored in sorted(listing.files.items()):
            if not (root / safe_relpath(rel)).resolve().is_relative_to(root):
                raise UnsafeRelease(f"path {rel!r} would leave the staging dir")
            objects.append(
                RemoteObject(key=base + rel, rel=rel, size=stored.size, etag=stored.version or "")
            )
        reader = _Reader(self._client, self._bucket, changed=f"{listing.model}/{listing.release}")
        abort = cancel or threading.Event()
        with self._lock:
            self._downloads.add(abort)
        if self._closing.is_set():
            abort.set()
        try:
            downloaded = download_objects(
                reader,
                objects,
                dest,
                policy=self._policy,
                retrier=self._retrier,
                expected=manifest,
                have=have,
                label=f"s3://{self._bucket}/",
                progress=progress,
                abort=abort,
            )
        finally:
            with self._lock:
                self._downloads.discard(abort)
        fetched_manifest = None
        if MANIFEST_NAME in listing.files:
            fetched_manifest = decode_manifest(
                (dest / MANIFEST_NAME).read_bytes(), self._url(base + MANIFEST_NAME)
            )
        return FetchedRelease(
            manifest=fetched_manifest,
            files=downloaded.files,
            bytes_total=sum(stored.size for stored in listing.files.values()),
            bytes_fetched=downloaded.bytes_fetched,
            refetched=downloaded.refetched,
            retries=downloaded.retries,
        )

    # --- for the fleet's records (:mod:`.s3_fleet`) -----------------------------------------

    @property
    def client(self) -> Any:
        return self._client

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def base(self) -> str:
        """The key prefix of the store, ending in '/' (or empty)."""
        return self._base

    def request(self, fn: Callable[[], Any], key: str, *, patient: bool = False) -> Any:
        """``fn()`` with this store's error mapping and retries: a scan's short budget, or
        (``patient``) the whole ``retry_seconds``."""
        return self._call(fn, key, None if patient else self._scan_retrier)

    def pages(self, prefix: str) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages under ``prefix`` (a scan's budget per page)."""
        return self._pages(prefix, retrier=self._scan_retrier)

    # --- plumbing -------------------------------------------------------------------------

    def _call(self, fn: Callable[[], Any], key: str, retrier: Retrier | None = None) -> Any:
        def once() -> Any:
            with _mapped(self._bucket, key, endpoint=self._endpoint):
                return fn()

        try:
            return (retrier or self._retrier).call(once, what=self._url(key), abort=self._closing)
        except Aborted:
            raise Interrupted(f"the store {self.uri} is closing") from None

    def _pages(
        self, prefix: str, *, delimiter: str | None = None, retrier: Retrier | None = None
    ) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages under ``prefix``; each page call is retried on its own."""
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": prefix}
        if delimiter is not None:
            kwargs["Delimiter"] = delimiter
        while True:
            page = self._call(lambda: self._client.list_objects_v2(**kwargs), prefix, retrier)
            yield page
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token

    def _release_base(self, model: str, release: str) -> str:
        return f"{self._base}{validate_model_name(model)}/{validate_release_name(release)}/"

    def _url(self, key: str) -> str:
        return f"s3://{self._bucket}/{key}"


@contextmanager
def _mapped(
    bucket: str, key: str, *, changed: str | None = None, endpoint: str | None = None
) -> Iterator[None]:
    """Translate the library errors raised inside the block into the project's."""
    try:
        yield
    except _LIBRARY as exc:
        raise _translate(
            exc, f"s3://{bucket}/{key}", bucket=bucket, changed=changed, endpoint=endpoint
        ) from exc


class _Reader:
    """One GET for :mod:`.s3_download`: ``If-Match`` the listed ETag, streamed in chunks."""

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
        with _mapped(self._bucket, obj.key, changed=self._changed):
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


def _files(base: str, listed: list[dict[str, Any]]) -> dict[str, StoredFile]:
    """The release's files from its listing, every key checked before anything is written."""
    files: dict[str, StoredFile] = {}
    for entry in listed:
        rel = entry["Key"][len(base) :]
        size = int(entry["Size"])
        if rel.endswith("/") and size == 0:  # a "folder" marker some S3 tools create
            if rel:
                safe_relpath(rel[:-1])
            continue
        safe_relpath(rel)
        files[rel] = StoredFile(size=size, version=entry["ETag"])
    names = set(files)
    for rel in files:
        parents = {p.as_posix() for p in safe_relpath(rel).parents}
        if clash := sorted(parents & names):
            raise UnsafeRelease(f"{clash[0]!r} is both a file and the dir of {rel!r}")
    return files


def _revision(etag: str) -> str:
    return etag.strip('"')
