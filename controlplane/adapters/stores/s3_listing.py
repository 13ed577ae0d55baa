"""What an S3 store holds, read without fetching a release: its models, their releases, each
release's markers (``SHA256SUMS``, ``SHA256SUMS.sig``) and its files.

A release is every object below ``<model>/<release>/``, complete once ``SHA256SUMS`` (uploaded
last) is there; its revision is that marker's ETag, so a release republished under the same
name is seen as a change. Names that are no model's or release's are left out and passed to
``ignored``; every key of a release is checked before anything is written
(:func:`~controlplane.domain.checksums.safe_relpath`). Every request goes through
:class:`~.s3_client.S3Bucket`: the scans (:func:`list_models`, :func:`list_releases`, and
:func:`describe` unless ``patient``) with a scan's budget, the rest with a fetch's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane.adapters.stores.s3_client import S3Bucket
from controlplane.domain.checksums import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    SIGNATURE_NAME,
    manifest_too_large,
    safe_relpath,
)
from controlplane.domain.errors import (
    InvalidName,
    ModelNotFound,
    ReleaseNotFound,
    UnsafeRelease,
)
from controlplane.domain.ignored import (
    IgnoredName,
    ignored_model,
    ignored_release,
    release_name_problem,
)
from controlplane.domain.names import validate_model_name
from controlplane.domain.releases import ReleaseInfo, natural_key
from controlplane.domain.signatures import MAX_SIGNATURE_BYTES
from controlplane.ports import MarkerFiles, ReleaseListing, StoredFile


def list_models(
    bucket: S3Bucket, *, ignored: Callable[[IgnoredName], None] | None = None
) -> list[str]:
    names = []
    for page in bucket.pages(bucket.base, delimiter="/", retrier=bucket.scan_retrier):
        for common in page.get("CommonPrefixes", []):
            name = common["Prefix"][len(bucket.base) :].rstrip("/")
            try:
                names.append(validate_model_name(name))
            except InvalidName:
                where = bucket.url(common["Prefix"])
                if ignored is not None and (left_out := ignored_model(name, where)):
                    ignored(left_out)
    return sorted(names, key=natural_key)


def list_releases(
    bucket: S3Bucket, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
) -> list[ReleaseInfo]:
    base = f"{bucket.base}{validate_model_name(model)}/"
    markers: dict[str, str | None] = {}
    signed: set[str] = set()  # releases with a SHA256SUMS.sig: the listing names it anyway
    refused: set[str] = set()  # names that are no release's, each judged once
    seen = False
    for page in bucket.pages(base, retrier=bucket.scan_retrier):
        for entry in page.get("Contents", []):
            seen = True
            key = entry["Key"]
            name, slash, path = key[len(base) :].partition("/")
            if not slash or not path or name in refused:
                continue
            if name not in markers:
                if (problem := release_name_problem(name)) is not None:
                    refused.add(name)
                    where = bucket.url(key[: len(base) + len(name) + 1])  # the listed key's
                    if ignored is not None and (left := ignored_release(name, problem, where)):
                        ignored(left)
                    continue
                markers[name] = None
            if path == MANIFEST_NAME:
                markers[name] = _revision(entry["ETag"])
            elif path == SIGNATURE_NAME:
                signed.add(name)
    if not seen:
        raise ModelNotFound(f"model {model!r} is not in the store {bucket.uri}")
    return [
        ReleaseInfo(model, name, revision is not None, revision, name in signed)
        for name, revision in sorted(markers.items(), key=lambda item: natural_key(item[0]))
    ]


def describe(bucket: S3Bucket, model: str, release: str, *, patient: bool) -> ReleaseInfo:
    base = bucket.release_base(model, release)
    retrier = bucket.retrier if patient else bucket.scan_retrier
    try:
        revision = _revision(bucket.head(base + MANIFEST_NAME, retrier)["ETag"])
    except ReleaseNotFound:
        pass
    else:
        try:
            bucket.head(base + SIGNATURE_NAME, retrier)
        except ReleaseNotFound:
            return ReleaseInfo(model, release, True, revision, signed=False)
        return ReleaseInfo(model, release, True, revision, signed=True)
    if not bucket.holds_any(base, retrier):
        raise ReleaseNotFound(
            f"release {release!r} of model {model!r} is not in the store {bucket.uri}"
        )
    return ReleaseInfo(model, release, False, None)


def read_marker_files(bucket: S3Bucket, model: str, release: str) -> MarkerFiles:
    base = bucket.release_base(model, release)
    manifest = bucket.get_small(
        base + MANIFEST_NAME, MAX_MANIFEST_BYTES, too_large=manifest_too_large
    )
    signature = bucket.get_small(base + SIGNATURE_NAME, MAX_SIGNATURE_BYTES)
    return MarkerFiles(manifest=manifest, signature=signature)


def list_files(bucket: S3Bucket, model: str, release: str) -> ReleaseListing:
    base = bucket.release_base(model, release)
    listed = [entry for page in bucket.pages(base) for entry in page.get("Contents", [])]
    if not listed:
        raise ReleaseNotFound(
            f"release {release!r} of model {model!r} is not in the store {bucket.uri}"
        )
    return ReleaseListing(model, release, _files(base, listed))


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
