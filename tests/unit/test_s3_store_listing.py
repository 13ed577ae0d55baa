"""A full scan of an S3 store is one paginated listing of its keys, grouped into the models and
releases that listing the models and then each model's releases would give: the same releases
(complete, revision, signed), the same names ignored, the fleet's records skipped without
paging through them.

The bucket is a fake of the one call the listings make (ListObjectsV2: ``Prefix``,
``Delimiter``, ``StartAfter``, ``ContinuationToken``, ``MaxKeys``), injected through the
store's constructor, that pages as S3 does and records every request;
tests/integration/test_s3_store.py compares the same listings against moto's server."""

from __future__ import annotations

import hashlib
from typing import Any

from controlplane.adapters.stores.s3 import S3Store
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.releases import ReleaseInfo

PREFIX = "prod"
RECORDS = f"{PREFIX}/_controlplane/"


class FakeBucket:
    """ListObjectsV2 over keys held in memory, in S3's order (UTF-8 bytes), ``page`` keys (and
    common prefixes) a page; each request is kept in ``calls``. ``honours_start_after=False``
    is a store that ignores ``StartAfter`` and lists from the top."""

    def __init__(self, page: int = 1000, *, honours_start_after: bool = True) -> None:
        self.objects: dict[str, str] = {}  # key -> ETag
        self.calls: list[dict[str, Any]] = []
        self.returned: list[str] = []  # every key a page held, in the order they were sent
        self._page = page
        self._honours_start_after = honours_start_after

    def put(self, key: str, body: bytes = b"x") -> None:
        self.objects[key] = f'"{hashlib.md5(body).hexdigest()}"'  # noqa: S324 (an ETag)

    def list_objects_v2(self, **call: Any) -> dict[str, Any]:
        self.calls.append(call)
        prefix, delimiter = call["Prefix"], call.get("Delimiter")
        after = call.get("StartAfter", "") if self._honours_start_after else ""
        items: list[tuple[str, str | None]] = []  # (key or common prefix, ETag: None for one)
        for key in sorted(self.objects, key=lambda k: k.encode()):
            if not key.startswith(prefix) or key.encode() <= after.encode():
                continue
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut >= 0:
                common = key[: cut + len(delimiter or "")]
                if not items or items[-1][0] != common:
                    items.append((common, None))
            else:
                items.append((key, self.objects[key]))
        start = int(call.get("ContinuationToken", 0))
        end = start + min(self._page, call.get("MaxKeys", 1000))
        page = items[start:end]
        self.returned += [k for k, e in page if e is not None]
        answer: dict[str, Any] = {
            "Contents": [{"Key": k, "ETag": e, "Size": 1} for k, e in page if e is not None],
            "CommonPrefixes": [{"Prefix": k} for k, e in page if e is None],
            "IsTruncated": end < len(items),
        }
        if end < len(items):
            answer["NextContinuationToken"] = str(end)
        return answer

    def close(self) -> None:
        pass


def release(bucket: FakeBucket, model: str, name: str, *, signed: bool = False) -> None:
    base = f"{PREFIX}/{model}/{name}"
    for rel in ("config.pbtxt", "1/model.py"):
        bucket.put(f"{base}/{rel}", f"{model} {name} {rel}".encode())
    bucket.put(f"{base}/SHA256SUMS", f"sums of {model} {name}".encode())
    if signed:
        bucket.put(f"{base}/SHA256SUMS.sig", b"sig")


def fleet_records(bucket: FakeBucket, members: int) -> None:
    bucket.put(f"{RECORDS}desired/resnet.json", b"{}")
    for n in range(members):
        bucket.put(f"{RECORDS}members/m{n:04}.json", b"{}")


Listed = tuple[dict[str, list[ReleaseInfo]], list[tuple[str | None, IgnoredName]]]


def model_by_model(store: S3Store) -> Listed:
    """What listing the models, then each model's releases, says (what is ignored sorted: the
    two ways meet the entries in different orders)."""
    ignored: list[tuple[str | None, IgnoredName]] = []
    models = store.list_models(ignored=lambda entry: ignored.append((None, entry)))
    listed = {}
    for model in models:

        def under(entry: IgnoredName, model: str = model) -> None:
            ignored.append((model, entry))

        listed[model] = store.list_releases(model, ignored=under)
    return listed, sorted(ignored, key=_by_place)


def whole(store: S3Store) -> Listed:
    """What the one listing of the whole store says (what is ignored sorted likewise)."""
    ignored: list[tuple[str | None, IgnoredName]] = []
    listed = store.list_store(ignored=lambda model, entry: ignored.append((model, entry)))
    return listed, sorted(ignored, key=_by_place)


def _by_place(item: tuple[str | None, IgnoredName]) -> tuple[str, IgnoredName]:
    return item[0] or "", item[1]


def test_twenty_models_and_the_fleets_records_are_one_request() -> None:
    bucket = FakeBucket()
    for n in range(20):
        release(bucket, f"model-{n}", "r1")
        release(bucket, f"model-{n}", "r2", signed=n % 2 == 0)
    fleet_records(bucket, members=3)
    store = S3Store(f"s3://models/{PREFIX}", client=bucket)

    listed, ignored = whole(store)

    assert bucket.calls == [{"Bucket": "models", "Prefix": f"{PREFIX}/"}]
    bucket.calls.clear()
    assert (listed, ignored) == model_by_model(store)
    assert len(bucket.calls) == 21  # what a full scan cost before: the models, then each
    assert list(listed) == [f"model-{n}" for n in range(20)]  # natural order
    first, second = listed["model-2"]
    assert (first.name, first.complete, first.signed) == ("r1", True, False)
    assert (second.name, second.complete, second.signed) == ("r2", True, True)
    revisions = {r.revision for releases in listed.values() for r in releases}
    etags = {etag.strip('"') for key, etag in bucket.objects.items() if key.endswith("SHA256SUMS")}
    assert revisions == etags  # each release's revision is its marker's ETag


def test_a_page_that_ends_among_the_fleets_records_jumps_past_them() -> None:
    """Models on both sides of ``_controlplane/`` (capitals and digits sort before '_'), 200
    heartbeats between them, 5 keys a page: the records cost one page, not 40."""
    bucket = FakeBucket(page=5)
    for model in ("Bert", "2tower", "resnet", "vit"):
        release(bucket, model, "r1")
    release(bucket, "resnet", "r2", signed=True)
    fleet_records(bucket, members=200)
    bucket.put(f"{PREFIX}/_controlplane0/r1/SHA256SUMS")  # sorts right after: no model's name
    store = S3Store(f"s3://models/{PREFIX}", client=bucket)

    listed, ignored = whole(store)

    # 2tower and Bert (6 keys) and the first records: 2 pages; then 12 keys after the records.
    assert [call.get("StartAfter") for call in bucket.calls] == [
        None,
        None,
        f"{PREFIX}/_controlplane0",
        f"{PREFIX}/_controlplane0",
        f"{PREFIX}/_controlplane0",
    ]
    assert len([key for key in bucket.returned if key.startswith(RECORDS)]) == 4
    assert (listed, ignored) == model_by_model(store)
    assert list(listed) == ["2tower", "Bert", "resnet", "vit"]
    assert [(r.name, r.complete, r.signed) for r in listed["resnet"]] == [
        ("r1", True, False),
        ("r2", True, True),
    ]
    assert [(model, entry.name) for model, entry in ignored] == [(None, "_controlplane0")]


def test_a_store_that_ignores_start_after_is_still_listed_once_whole() -> None:
    """An S3 API that lists from the top again despite ``StartAfter``: the keys seen before
    the jump are not counted twice, and the listing pages through the records to its end."""
    bucket = FakeBucket(page=5, honours_start_after=False)
    for model in ("Bert", "resnet"):
        release(bucket, model, "r1")
    fleet_records(bucket, members=20)
    store = S3Store(f"s3://models/{PREFIX}", client=bucket)

    listed, ignored = whole(store)

    assert (listed, ignored) == model_by_model(store)
    assert list(listed) == ["Bert", "resnet"]


def test_names_that_are_no_models_or_releases_are_reported_where_they_are() -> None:
    bucket = FakeBucket(page=3)
    release(bucket, "m", "r1")
    for stray in ("m/r 5/SHA256SUMS", "m/.hidden/a", "m/loose-file", "m/_controlplane/x"):
        bucket.put(f"{PREFIX}/{stray}")
    for stray in ("bad name/r1/SHA256SUMS", "bad name/r2/a", ".staging/r1/a", "README"):
        bucket.put(f"{PREFIX}/{stray}")
    bucket.put(f"{PREFIX}/folder-only/")  # a "folder" some S3 tools make: a model, no release
    bucket.put("elsewhere/m2/r1/SHA256SUMS")  # outside the store's prefix
    store = S3Store(f"s3://models/{PREFIX}", client=bucket)

    listed, ignored = whole(store)

    assert (listed, ignored) == model_by_model(store)
    assert {model: [r.name for r in releases] for model, releases in listed.items()} == {
        "folder-only": [],
        "m": ["r1"],
    }
    base = f"s3://models/{PREFIX}"
    assert [(model, entry.name, entry.where) for model, entry in ignored] == [
        (None, "bad name", f"{base}/bad name/"),
        ("m", "_controlplane", f"{base}/m/_controlplane/"),
        ("m", "r 5", f"{base}/m/r 5/"),
    ]


def test_an_empty_store_and_a_store_of_records_only_hold_no_model() -> None:
    bucket = FakeBucket(page=2)
    store = S3Store(f"s3://models/{PREFIX}", client=bucket)
    assert whole(store) == ({}, []) == model_by_model(store)

    fleet_records(bucket, members=10)
    assert whole(store) == ({}, []) == model_by_model(store)


def test_a_store_at_the_buckets_root_skips_its_records_too() -> None:
    bucket = FakeBucket(page=2)
    for n in range(10):
        bucket.put(f"_controlplane/members/m{n}.json")
    bucket.put("m/r1/SHA256SUMS")
    store = S3Store("s3://models", client=bucket)

    listed, _ = whole(store)

    assert [r.name for r in listed["m"]] == ["r1"]
    assert [call.get("StartAfter") for call in bucket.calls] == [None, "_controlplane0"]
