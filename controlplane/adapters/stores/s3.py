"""The S3 model store: ``s3://bucket/prefix/<model>/<release>/<files>``.

The layout is the local store's: a release is every object below ``<model>/<release>/`` and
``SHA256SUMS``, uploaded last, is its commit marker. A release's ``revision`` is the ETag of
that marker, so republishing a release under the same name is seen as a change.

:class:`S3Store` is the :class:`~controlplane.ports.ModelStore`; its parts are rooms of their
own: :mod:`.s3_client` (the boto3 client, the one path of every request and the one map of
the library's errors), :mod:`.s3_listing` (models, releases, markers and files, nothing
fetched) and :mod:`.s3_download` (the parallel download of a release's objects).

Retries are ours (:mod:`.retries`, bounded by ``retry_seconds``): the client is built with
botocore's own retries off, so one policy decides and the attempt count in a message is the
real one. What a deploy fetches (the manifest, the listing, every GET) gets the whole budget;
the scans of the watcher and of status (``list_models``, ``list_releases``, ``list_store``) and
``describe``
get a few seconds: the scans run again on their own, and ``describe`` answers an API call
before any work starts (a store that does not answer is ``store_unavailable`` within seconds,
for the caller to retry, rather than a request held for the whole budget). A caller that
waits for the operation anyway (``describe(..., patient=True)``: a deploy asked with
``wait``) gets the whole budget there too, so it rides out an outage as the fetch does.
:meth:`S3Store.close` cuts every retry in flight short.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from controlplane.adapters.stores import s3_listing
from controlplane.adapters.stores.retries import Retrier
from controlplane.adapters.stores.s3_client import S3Bucket, build_client
from controlplane.adapters.stores.s3_download import download_objects
from controlplane.adapters.stores.s3_transfer import RemoteObject, TransferPolicy
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest, decode_manifest, safe_relpath
from controlplane.domain.errors import UnsafeRelease
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.releases import ReleaseInfo
from controlplane.ports import (
    FetchedRelease,
    FetchProgress,
    MarkerFiles,
    ReleaseListing,
    Telemetry,
)

SCAN_RETRY_SECONDS = 5.0  # budget of the watcher's and status's listings (they run again)


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
        prefix = parsed.path.strip("/")
        self._policy = TransferPolicy(
            max_concurrency=max_concurrency,
            multipart_threshold=multipart_threshold,
            part_size=part_size,
        )
        retrier = Retrier(budget=retry_seconds, backoff_max=backoff_max, telemetry=telemetry)
        scan_retrier = Retrier(
            budget=min(retry_seconds, SCAN_RETRY_SECONDS),
            backoff_max=backoff_max,
            telemetry=telemetry,
            budget_name="the budget of a scan or a fleet record's read",
        )
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._downloads: set[threading.Event] = set()  # abort events of downloads running
        self._owns_client = client is None
        self._bucket = S3Bucket(
            build_client(max_concurrency) if client is None else client,
            bucket=parsed.netloc,
            base=f"{prefix}/" if prefix else "",
            retrier=retrier,
            scan_retrier=scan_retrier,
            closing=self._closing,
        )

    @property
    def uri(self) -> str:
        return self._bucket.uri

    def close(self) -> None:
        """Stop every retry and download in flight; close the client if this store built it."""
        self._closing.set()
        with self._lock:
            for abort in self._downloads:
                abort.set()
        if self._owns_client:
            self._bucket.client.close()

    # --- listing (:mod:`.s3_listing`) -----------------------------------------------------

    def list_models(self, *, ignored: Callable[[IgnoredName], None] | None = None) -> list[str]:
        return s3_listing.list_models(self._bucket, ignored=ignored)

    def list_releases(
        self, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
    ) -> list[ReleaseInfo]:
        return s3_listing.list_releases(self._bucket, model, ignored=ignored)

    def list_store(
        self, *, ignored: Callable[[str | None, IgnoredName], None] | None = None
    ) -> dict[str, list[ReleaseInfo]]:
        return s3_listing.list_store(self._bucket, ignored=ignored)

    def describe(self, model: str, release: str, *, patient: bool = False) -> ReleaseInfo:
        return s3_listing.describe(self._bucket, model, release, patient=patient)

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        return s3_listing.read_marker_files(self._bucket, model, release)

    def list_files(self, model: str, release: str) -> ReleaseListing:
        return s3_listing.list_files(self._bucket, model, release)

    # --- fetching (:mod:`.s3_download`) ---------------------------------------------------

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
        base = self._bucket.release_base(listing.model, listing.release)
        objects = _remote_objects(listing, base, dest.resolve())
        reader = self._bucket.reader(changed=f"{listing.model}/{listing.release}")
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
                retrier=self._bucket.retrier,
                expected=manifest,
                have=have,
                label=f"s3://{self._bucket.name}/",
                progress=progress,
                abort=abort,
            )
        finally:
            with self._lock:
                self._downloads.discard(abort)
        fetched_manifest = None
        if MANIFEST_NAME in listing.files:
            fetched_manifest = decode_manifest(
                (dest / MANIFEST_NAME).read_bytes(), self._bucket.url(base + MANIFEST_NAME)
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
        return self._bucket.client

    @property
    def bucket(self) -> str:
        return self._bucket.name

    @property
    def base(self) -> str:
        """The key prefix of the store, ending in '/' (or empty)."""
        return self._bucket.base

    def request(self, fn: Callable[[], Any], key: str, *, patient: bool = False) -> Any:
        """``fn()`` with this store's error mapping and retries: a scan's short budget, or
        (``patient``) the whole ``retry_seconds``."""
        return self._bucket.call(fn, key, None if patient else self._bucket.scan_retrier)

    def pages(self, prefix: str) -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages under ``prefix`` (a scan's budget per page)."""
        return self._bucket.pages(prefix, retrier=self._bucket.scan_retrier)


def _remote_objects(listing: ReleaseListing, base: str, root: Path) -> list[RemoteObject]:
    """The objects of ``listing`` (keys below ``base``), each path checked to stay in
    ``root``, the staging dir."""
    objects = []
    for rel, stored in sorted(listing.files.items()):
        if not (root / safe_relpath(rel)).resolve().is_relative_to(root):
            raise UnsafeRelease(f"path {rel!r} would leave the staging dir")
        objects.append(
            RemoteObject(key=base + rel, rel=rel, size=stored.size, etag=stored.version or "")
        )
    return objects
