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
    throttling, 429, 5xx                        -> StoreUnavailable (retried)
    dropped or short connections, timeouts      -> StoreUnavailable (retried)
    403 and every other refusal                 -> StoreError       (names the key)

Retries are ours (tenacity, in :mod:`.s3_download`): the client is built with botocore's own
retries off, so one policy decides and the attempt count in a message is the real one.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]
import urllib3.exceptions

from controlplane.adapters.stores.s3_download import (
    CHUNK,
    RemoteObject,
    TransferPolicy,
    call_with_retries,
    download_objects,
)
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest, parse_manifest, safe_relpath
from controlplane.domain.errors import (
    ControlPlaneError,
    InvalidName,
    ModelNotFound,
    ReleaseChanged,
    ReleaseNotFound,
    StoreError,
    StoreUnavailable,
    UnsafeRelease,
)
from controlplane.domain.names import validate_model_name, validate_release_name
from controlplane.domain.releases import ReleaseInfo, natural_key
from controlplane.ports import FetchedRelease, FetchProgress

MAX_MANIFEST_BYTES = 16 * 1024 * 1024

_THROTTLING = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestLimitExceeded",
    "TooManyRequests",
}
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


def _translate(exc: Exception, what: str, *, bucket: str, changed: str | None) -> ControlPlaneError:
    """The project's error for a library error about ``what``; ``changed`` names the release
    being fetched, when there is one."""
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        detail = f"{code or 'HTTP ' + str(status)}: {error.get('Message', '') or exc}"
        if code == "NoSuchBucket":
            return StoreError(
                f"bucket {bucket!r} does not exist; create it or fix the store URI",
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
        if code in _THROTTLING or status in (429, 503) or status >= 500:
            return StoreUnavailable(f"{what}: {detail} (HTTP {status})")
        if code == "AccessDenied" or status == 403:
            return StoreError(
                f"access to {what} was denied ({detail}); check the credentials and the "
                "bucket policy",
                details={"key": what},
            )
        return StoreError(f"the store refused {what}: {detail} (HTTP {status})")
    if isinstance(exc, _TRANSPORT):
        return StoreUnavailable(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return StoreError(f"no AWS credentials were found to read {what}: {exc}")
    return StoreError(f"{what}: {type(exc).__name__}: {exc}")


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
        attempts: int = 5,
        backoff_max: float = 5.0,
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
            attempts=attempts,
            backoff_max=backoff_max,
        )
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

    @property
    def uri(self) -> str:
        return self._uri

    def close(self) -> None:
        """Close the client's connections if this store built the client."""
        if self._owns_client:
            self._client.close()

    # --- listing --------------------------------------------------------------------------

    def list_models(self) -> list[str]:
        names = []
        for page in self._pages(self._base, delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                name = common["Prefix"][len(self._base) :].rstrip("/")
                try:
                    names.append(validate_model_name(name))
                except InvalidName:
                    continue
        return sorted(names, key=natural_key)

    def list_releases(self, model: str) -> list[ReleaseInfo]:
        base = f"{self._base}{validate_model_name(model)}/"
        markers: dict[str, str | None] = {}
        seen = False
        for page in self._pages(base):
            for entry in page.get("Contents", []):
                seen = True
                name, slash, path = entry["Key"][len(base) :].partition("/")
                if not slash or not path:
                    continue
                try:
                    validate_release_name(name)
                except InvalidName:
                    continue
                markers.setdefault(name, None)
                if path == MANIFEST_NAME:
                    markers[name] = _revision(entry["ETag"])
        if not seen:
            raise ModelNotFound(f"model {model!r} is not in the store {self.uri}")
        return [
            ReleaseInfo(model, name, revision is not None, revision)
            for name, revision in sorted(markers.items(), key=lambda item: natural_key(item[0]))
        ]

    def describe(self, model: str, release: str) -> ReleaseInfo:
        base = self._release_base(model, release)
        try:
            head = self._call(
                lambda: self._client.head_object(Bucket=self._bucket, Key=base + MANIFEST_NAME),
                base + MANIFEST_NAME,
            )
            return ReleaseInfo(model, release, True, _revision(head["ETag"]))
        except ReleaseNotFound:
            pass
        page = self._call(
            lambda: self._client.list_objects_v2(Bucket=self._bucket, Prefix=base, MaxKeys=1),
            base,
        )
        if not page.get("Contents"):
            raise ReleaseNotFound(
                f"release {release!r} of model {model!r} is not in the store {self.uri}"
            )
        return ReleaseInfo(model, release, False, None)

    def read_manifest(self, model: str, release: str) -> dict[str, str] | None:
        key = self._release_base(model, release) + MANIFEST_NAME

        def get() -> bytes:
            response = self._client.get_object(Bucket=self._bucket, Key=key)
            body = response["Body"]
            try:
                if int(response.get("ContentLength", 0)) > MAX_MANIFEST_BYTES:
                    raise UnsafeRelease(f"{MANIFEST_NAME} of {self._url(key)} is too large")
                return bytes(body.read())
            finally:
                body.close()

        try:
            data = self._call(get, key)
        except ReleaseNotFound:
            return None
        try:
            return parse_manifest(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise UnsafeRelease(f"{MANIFEST_NAME} of {self._url(key)} is not UTF-8") from exc

    # --- fetching -------------------------------------------------------------------------

    def fetch(
        self,
        model: str,
        release: str,
        dest: Path,
        *,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
    ) -> FetchedRelease:
        base = self._release_base(model, release)
        listed = [entry for page in self._pages(base) for entry in page.get("Contents", [])]
        if not listed:
            raise ReleaseNotFound(
                f"release {release!r} of model {model!r} is not in the store {self.uri}"
            )
        objects = _plan(base, listed, dest)
        reader = _Reader(self._client, self._bucket, changed=f"{model}/{release}")
        files, fetched = download_objects(
            reader,
            objects,
            dest,
            policy=self._policy,
            have=dict(have or {}),
            label=f"s3://{self._bucket}/",
            progress=progress,
        )
        manifest = None
        if any(obj.rel == MANIFEST_NAME for obj in objects):
            manifest = parse_manifest((dest / MANIFEST_NAME).read_text(encoding="utf-8"))
        return FetchedRelease(
            manifest=manifest,
            files=files,
            bytes_total=sum(obj.size for obj in objects),
            bytes_fetched=fetched,
        )

    # --- plumbing -------------------------------------------------------------------------

    def _call(self, fn: Callable[[], Any], key: str) -> Any:
        def once() -> Any:
            with _mapped(self._bucket, key):
                return fn()

        return call_with_retries(once, what=self._url(key), policy=self._policy)

    def _pages(self, prefix: str, *, delimiter: str | None = None) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages under ``prefix``; each page call is retried on its own."""
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": prefix}
        if delimiter is not None:
            kwargs["Delimiter"] = delimiter
        while True:
            page = self._call(lambda: self._client.list_objects_v2(**kwargs), prefix)
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
def _mapped(bucket: str, key: str, *, changed: str | None = None) -> Iterator[None]:
    """Translate the library errors raised inside the block into the project's."""
    try:
        yield
    except _LIBRARY as exc:
        raise _translate(exc, f"s3://{bucket}/{key}", bucket=bucket, changed=changed) from exc


class _Reader:
    """One GET for :mod:`.s3_download`: ``If-Match`` the listed ETag, streamed in chunks."""

    def __init__(self, client: Any, bucket: str, *, changed: str) -> None:
        self._client = client
        self._bucket = bucket
        self._changed = changed

    def read(
        self, obj: RemoteObject, span: tuple[int, int] | None, sink: Callable[[bytes], None]
    ) -> None:
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Key": obj.key, "IfMatch": obj.etag}
        if span is not None:
            kwargs["Range"] = f"bytes={span[0]}-{span[1]}"
        with _mapped(self._bucket, obj.key, changed=self._changed):
            response = self._client.get_object(**kwargs)
            body = response["Body"]
            try:
                if response.get("ETag") != obj.etag:
                    raise ReleaseChanged(
                        f"objects of release {self._changed} changed during the download "
                        f"({obj.key} is now {response.get('ETag')}, was {obj.etag}); "
                        "it will be retried later"
                    )
                while chunk := body.read(CHUNK):
                    sink(chunk)
            finally:
                body.close()


def _plan(base: str, listed: list[dict[str, Any]], dest: Path) -> list[RemoteObject]:
    """Validate every key before anything is written: each one must stay inside ``dest``."""
    root = dest.resolve()
    objects: list[RemoteObject] = []
    for entry in listed:
        rel = entry["Key"][len(base) :]
        size = int(entry["Size"])
        if rel.endswith("/") and size == 0:  # a "folder" marker some S3 tools create
            if rel:
                safe_relpath(rel[:-1])
            continue
        safe_relpath(rel)
        if not (root / rel).resolve().is_relative_to(root):
            raise UnsafeRelease(f"path {rel!r} would leave the staging dir")
        objects.append(RemoteObject(key=entry["Key"], rel=rel, size=size, etag=entry["ETag"]))
    rels = {obj.rel for obj in objects}
    for obj in objects:
        parents = {p.as_posix() for p in safe_relpath(obj.rel).parents}
        if clash := sorted(parents & rels):
            raise UnsafeRelease(f"{clash[0]!r} is both a file and the dir of {obj.rel!r}")
    return objects


def _revision(etag: str) -> str:
    return etag.strip('"')
