"""Publishing a release into an S3 store: ``s3://bucket/prefix/<model>/<release>/<files>``.

The client is the daemon's (:func:`~.s3_client.build_client`: the standard AWS chain, so
``AWS_ENDPOINT_URL_S3``, profiles and a pod's role work as they do for the daemon), and every
request goes through :class:`~.s3_client.S3Bucket`: errors mapped as the daemon maps them,
transient ones tried again for the retry budget. Files go up through boto3's transfer
manager, in parts from ``multipart_threshold`` on; an object appears under its key only once
whole, so a cut leaves whole objects or none (and, for a big file, an unfinished multipart
upload that the bucket's lifecycle rule for them cleans up; it is never listed).

Each object carries the SHA-256 it was checked with (``x-amz-meta-sha256``): a rerun after a
cut keeps the objects whose size and recorded digest match, and uploads the rest.
``SHA256SUMS`` is written last with ``If-None-Match: *``, so a marker already there, or one
written by another publisher meanwhile, is never replaced (``release_exists``).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import boto3.exceptions  # type: ignore[import-untyped]
import boto3.s3.transfer  # type: ignore[import-untyped]
import botocore.exceptions  # type: ignore[import-untyped]

from controlplane.adapters.stores.retries import Retrier
from controlplane.adapters.stores.s3_client import S3Bucket, build_client, translate
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest, safe_relpath
from controlplane.domain.errors import ReleaseExists, ReleaseNotFound, StoreUnavailable
from controlplane.domain.transfer import RetryCause

DIGEST_METADATA = "sha256"  # x-amz-meta-sha256: the digest the object was uploaded with


class S3ReleaseTarget:
    """A :class:`~controlplane.ports.ReleaseTarget` in the S3 store ``uri``."""

    def __init__(
        self,
        uri: str,
        model: str,
        release: str,
        *,
        client: Any | None = None,
        max_concurrency: int = 8,
        multipart_threshold: int = 64 * 1024 * 1024,
        part_size: int = 16 * 1024 * 1024,
        retry_seconds: float = 120.0,
    ) -> None:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc or parsed.query or parsed.fragment:
            raise ValueError(f"store URI {uri!r} is not of the form s3://bucket[/prefix]")
        prefix = parsed.path.strip("/")
        retrier = Retrier(budget=retry_seconds)
        self._bucket = S3Bucket(
            client if client is not None else build_client(max_concurrency),
            bucket=parsed.netloc,
            base=f"{prefix}/" if prefix else "",
            retrier=retrier,
            scan_retrier=retrier,
            closing=threading.Event(),
        )
        self._base = self._bucket.release_base(model, release)
        self._model, self._release = model, release
        self._transfer = boto3.s3.transfer.TransferConfig(
            multipart_threshold=max(multipart_threshold, 5 * 1024 * 1024),
            multipart_chunksize=max(part_size, 5 * 1024 * 1024),  # S3's smallest part
            max_concurrency=max_concurrency,
        )

    @property
    def uri(self) -> str:
        return self._bucket.url(self._base).rstrip("/")

    def committed(self) -> bool:
        try:
            self._bucket.head(self._key(MANIFEST_NAME), self._bucket.retrier)
        except ReleaseNotFound:
            return False
        return True

    def clear_except(self, keep: Collection[str]) -> list[str]:
        removed = []
        for page in self._bucket.pages(self._base):
            for entry in page.get("Contents", []):
                key = str(entry["Key"])
                rel = key[len(self._base) :]
                if rel in keep:
                    continue
                self._delete(key)
                removed.append(rel)
        return removed

    def _delete(self, key: str) -> None:
        self._bucket.call(
            lambda: self._bucket.client.delete_object(Bucket=self._bucket.name, Key=key), key
        )

    def holds(self, rel: str, digest: FileDigest) -> bool:
        try:
            head = self._bucket.head(self._key(rel), self._bucket.retrier)
        except ReleaseNotFound:
            return False
        recorded = head.get("Metadata", {}).get(DIGEST_METADATA)
        return int(head.get("ContentLength", -1)) == digest.size and recorded == digest.sha256

    def put_file(self, rel: str, source: Path, digest: FileDigest) -> None:
        key = self._key(rel)

        def upload() -> None:
            try:
                self._bucket.client.upload_file(
                    str(source),
                    self._bucket.name,
                    key,
                    ExtraArgs={"Metadata": {DIGEST_METADATA: digest.sha256}},
                    Config=self._transfer,
                )
            except boto3.exceptions.S3UploadFailedError as exc:
                # The transfer manager wraps a refusal; its cause is botocore's own error.
                cause = exc.__context__
                if isinstance(cause, botocore.exceptions.ClientError):
                    raise cause from None
                raise StoreUnavailable(
                    f"{self._bucket.url(key)}: {exc}",
                    details={"cause": RetryCause.CONNECTION.value},
                ) from exc

        self._bucket.call(upload, key)

    def put_side_file(self, name: str, data: bytes) -> None:
        key = self._key(name)
        self._bucket.call(
            lambda: self._bucket.client.put_object(
                Bucket=self._bucket.name,
                Key=key,
                Body=data,
                Metadata={DIGEST_METADATA: _digest_of(data).sha256},
            ),
            key,
        )

    def commit(self, manifest: bytes) -> None:
        key = self._key(MANIFEST_NAME)

        def put() -> None:
            try:
                self._bucket.client.put_object(
                    Bucket=self._bucket.name,
                    Key=key,
                    Body=manifest,
                    IfNoneMatch="*",
                    Metadata={DIGEST_METADATA: _digest_of(manifest).sha256},
                )
            except botocore.exceptions.ClientError as exc:
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if exc.response.get("Error", {}).get("Code") == "PreconditionFailed" or (
                    status == 412
                ):
                    if self.holds(MANIFEST_NAME, _digest_of(manifest)):
                        return  # ours: an earlier attempt landed, its answer was lost
                    raise ReleaseExists(
                        f"release {self._release!r} of model {self._model!r} was published at "
                        f"{self.uri} while this publish ran (its {MANIFEST_NAME} appeared): a "
                        "release is immutable, so publish this one under a new release name"
                    ) from None
                raise translate(
                    exc, self._bucket.url(key), bucket=self._bucket.name, changed=None
                ) from exc

        self._bucket.call(put, key)

    def _key(self, rel: str) -> str:
        return f"{self._base}{safe_relpath(rel)}"


def _digest_of(data: bytes) -> FileDigest:
    return FileDigest(size=len(data), sha256=hashlib.sha256(data).hexdigest())
