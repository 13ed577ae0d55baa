"""What an S3 store holds, read without fetching a release: its models, their releases, each
release's markers (``SHA256SUMS``, ``SHA256SUMS.sig``) and its files.

A release is every object below ``<model>/<release>/``, complete once ``SHA256SUMS`` (uploaded
last) is there; its revision is that marker's ETag, so a release republished under the same
name is seen as a change. Names that are no model's or release's are left out and passed to
``ignored``; every key of a release is checked before anything is written
(:func:`~controlplane.domain.checksums.safe_relpath`). Every request goes through
:class:`~.s3_client.S3Bucket`: the scans (:func:`list_models`, :func:`list_releases`,
:func:`list_store`, and :func:`describe` unless ``patient``) with a scan's budget, the rest
with a fetch's.

:func:`list_store` is the watcher's full scan: one paginated listing of the whole store (1,000
keys a page) rather than the models and then each model's keys, so its cost follows the
store's size, not its number of models (20 small models: one request, not 21). Its keys are
grouped by the same :class:`_Releases` that :func:`list_releases` uses, so both say the same.
The fleet's records under ``_controlplane/`` (a heartbeat per member: a page of their own at
1,000 members) are skipped: a page that ends among them is followed by a new listing that
starts after them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from controlplane.domain.fleet import RESERVED_PREFIX
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
    releases = _Releases(bucket, base, ignored)
    for page in bucket.pages(base, retrier=bucket.scan_retrier):
        for entry in page.get("Contents", []):
            releases.add(entry)
    if not releases.seen:
        raise ModelNotFound(f"model {model!r} is not in the store {bucket.uri}")
    return releases.infos(model)


def list_store(
    bucket: S3Bucket, *, ignored: Callable[[str | None, IgnoredName], None] | None = None
) -> dict[str, list[ReleaseInfo]]:
    """Every model with its releases, as :func:`list_models` and then :func:`list_releases`
    of each give them, from one listing of the store's keys (in key order, so each model's
    keys come together). A model is in the store when a key is below ``<model>/``, as for
    :func:`list_models`; an entry left out for its name is passed to ``ignored`` with the
    model it is under (None: the store's top)."""
    models: dict[str, _Releases] = {}
    refused: set[str] = set()  # names at the top that are no model's, each judged once
    for entry in _store_keys(bucket):
        name, slash, _ = entry["Key"][len(bucket.base) :].partition("/")
        if not slash or name in refused:
            continue  # an object at the store's top is no model (list_models's delimiter)
        releases = models.get(name)
        if releases is None:
            try:
                validate_model_name(name)
            except InvalidName:
                refused.add(name)
                where = bucket.url(f"{bucket.base}{name}/")
                if ignored is not None and (left_out := ignored_model(name, where)):
                    ignored(None, left_out)
                continue
            under = None if ignored is None else _under(ignored, name)
            releases = models[name] = _Releases(bucket, f"{bucket.base}{name}/", under)
        releases.add(entry)
    return {name: models[name].infos(name) for name in sorted(models, key=natural_key)}


def _under(
    ignored: Callable[[str | None, IgnoredName], None], model: str
) -> Callable[[IgnoredName], None]:
    return lambda left_out: ignored(model, left_out)


def _store_keys(bucket: S3Bucket) -> Iterator[dict[str, Any]]:
    """Every key of the store, in key order, but those under ``_controlplane/``. A page that
    ends among those is followed by a listing that starts after them (``_controlplane0``:
    '0' sorts right after '/'), at most once; a page that passes them is simply continued."""
    reserved = f"{bucket.base}{RESERVED_PREFIX}/"
    past = f"{bucket.base}{RESERVED_PREFIX}0"
    start_after: str | None = None
    while True:
        for page in bucket.pages(bucket.base, retrier=bucket.scan_retrier, start_after=start_after):
            contents = page.get("Contents", [])
            for entry in contents:
                key = entry["Key"]
                # After the jump, a key at or before its start is not new: a store that
                # ignored StartAfter listed from the top again.
                if key.startswith(reserved) or (start_after is not None and key <= past):
                    continue
                yield entry
            last = contents[-1]["Key"] if contents else ""
            if page.get("IsTruncated") and start_after is None and last.startswith(reserved):
                start_after = past
                break  # the rest of the records is not listed
        else:
            return


class _Releases:
    """One model's releases, grouped from its keys (below ``base``) as they are met."""

    def __init__(
        self, bucket: S3Bucket, base: str, ignored: Callable[[IgnoredName], None] | None
    ) -> None:
        self._bucket = bucket
        self._base = base
        self._ignored = ignored
        self.seen = False  # a key below base: the model is in the store
        self._markers: dict[str, str | None] = {}
        self._signed: set[str] = set()  # releases with a SHA256SUMS.sig: the listing names it
        self._refused: set[str] = set()  # names that are no release's, each judged once

    def add(self, entry: dict[str, Any]) -> None:
        self.seen = True
        key = entry["Key"]
        name, slash, path = key[len(self._base) :].partition("/")
        if not slash or not path or name in self._refused:
            return
        if name not in self._markers:
            if (problem := release_name_problem(name)) is not None:
                self._refused.add(name)
                where = self._bucket.url(key[: len(self._base) + len(name) + 1])
                if self._ignored is not None and (left := ignored_release(name, problem, where)):
                    self._ignored(left)
                return
            self._markers[name] = None
        if path == MANIFEST_NAME:
            self._markers[name] = _revision(entry["ETag"])
        elif path == SIGNATURE_NAME:
            self._signed.add(name)

    def infos(self, model: str) -> list[ReleaseInfo]:
        return [
            ReleaseInfo(model, name, revision is not None, revision, name in self._signed)
            for name, revision in sorted(self._markers.items(), key=lambda i: natural_key(i[0]))
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
