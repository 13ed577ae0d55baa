"""The S3 store against a real S3 API (moto's server) over real HTTP on loopback.

Every store talks to moto through a :class:`FaultProxy`, which counts the requests (so a test
can say a cached file was never fetched, or a retry really happened) and breaks the ones a
test scripts. Faults are decided per request, and backoff is capped at a few milliseconds, so
these tests are deterministic and fast; the few about time (the retry budget, an outage, a
cancel) measure it with bounds wide enough for a busy machine. No Triton is needed.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from controlplane.adapters.stores.s3 import S3Store
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest
from controlplane.domain.errors import (
    Interrupted,
    ModelNotFound,
    ReleaseChanged,
    ReleaseNotFound,
    StoreError,
    StoreUnavailable,
    UnsafeRelease,
)
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.transfer import RetryCause
from controlplane.ports import FetchedRelease, FetchProgress
from controlplane.services.telemetry import NoTelemetry
from tests.support.fault_proxy import FaultKind, FaultProxy, SeenRequest
from tests.support.manifests import manifest_of
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import (
    aws_env,
    s3_client,
    sha256sums,
    upload_release,
    upload_release_dir,
)
from tests.support.s3_fixtures import fault_proxy, moto_endpoint, s3_bucket  # noqa: F401

PREFIX = "store"
StoreFactory = Callable[..., S3Store]


def fetch(store: S3Store, model: str, release: str, dest: Path, **kwargs: Any) -> FetchedRelease:
    """Read the manifest, list the release, fetch the listing: what the prepare step does."""
    manifest = manifest_of(store, model, release)
    return store.fetch(store.list_files(model, release), dest, manifest=manifest, **kwargs)


class CountedRetries(NoTelemetry):
    """Telemetry that keeps the store's retry reports."""

    def __init__(self) -> None:
        self.retries: list[RetryCause] = []

    def store_retried(self, cause: RetryCause) -> None:
        self.retries.append(cause)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def release_files() -> dict[str, bytes]:
    return {
        "config.pbtxt": b'name: "m"\nbackend: "python"\n',
        "1/model.py": b"class TritonPythonModel:\n    pass\n",
        "1/data/weights.bin": os.urandom(300 * 1024 + 17),
        "1/empty": b"",
    }


def files_under(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# The imported fixtures are named once each, here (ruff's F811 would flag every test).
@pytest.fixture
def bucket(s3_bucket: tuple[Any, str]) -> str:  # noqa: F811
    return s3_bucket[1]


@pytest.fixture
def direct(s3_bucket: tuple[Any, str]) -> Any:  # noqa: F811
    """A client straight to moto, for publishing (uploads never go through the proxy)."""
    return s3_bucket[0]


@pytest.fixture
def proxy(fault_proxy: FaultProxy) -> FaultProxy:  # noqa: F811
    return fault_proxy


@pytest.fixture
def endpoint(moto_endpoint: str) -> str:  # noqa: F811
    return moto_endpoint


@pytest.fixture
def make_store(proxy: FaultProxy, bucket: str) -> Iterator[StoreFactory]:
    """Build stores that reach moto through the proxy; their clients close at teardown."""
    clients: list[Any] = []

    def make(prefix: str = PREFIX, **kwargs: Any) -> S3Store:
        client = s3_client(proxy.endpoint)
        clients.append(client)
        kwargs.setdefault("backoff_max", 0.005)
        return S3Store(f"s3://{bucket}/{prefix}", client=client, **kwargs)

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    path = tmp_path / "staging" / "model"
    path.mkdir(parents=True)
    return path


# --- URIs and listing ---------------------------------------------------------------------


def test_uri_is_normalised_and_other_schemes_are_refused(make_store: StoreFactory) -> None:
    assert make_store("/a/b/").uri.endswith("/a/b")
    with pytest.raises(ValueError, match="s3://bucket"):
        S3Store("file:///tmp/store", client=object())


def test_list_models_in_natural_order_with_valid_names_only(
    direct: Any, bucket: str, make_store: StoreFactory
) -> None:
    for model in ("m10", "m2", "m1", "bad name"):
        upload_release(direct, bucket, PREFIX, model, "r1", {"config.pbtxt": b"x"})
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/README", Body=b"not a model")
    direct.put_object(Bucket=bucket, Key="elsewhere/m3/r1/config.pbtxt", Body=b"x")
    assert make_store().list_models() == ["m1", "m2", "m10"]
    assert make_store("empty-prefix").list_models() == []


def test_list_releases_reports_completeness_revisions_and_natural_order(
    direct: Any, bucket: str, make_store: StoreFactory
) -> None:
    etags = upload_release(direct, bucket, PREFIX, "m", "r10", {"a": b"1"})
    upload_release(direct, bucket, PREFIX, "m", "r2", {"a": b"2"}, checksums=False)
    upload_release(direct, bucket, PREFIX, "m", "r1", {"a": b"3"})
    for stray in ("loose-file", "bad..name/a", ".hidden/a"):
        direct.put_object(Bucket=bucket, Key=f"{PREFIX}/m/{stray}", Body=b"ignored")
    store = make_store()

    releases = store.list_releases("m")

    assert [(r.name, r.complete) for r in releases] == [("r1", True), ("r2", False), ("r10", True)]
    assert releases[1].revision is None
    assert releases[2].revision == etags[MANIFEST_NAME].strip('"')
    files = {"a": b"1", "b": b"new"}
    upload_release(direct, bucket, PREFIX, "m", "r10", files)  # republished, same name
    assert store.list_releases("m")[2].revision not in (None, releases[2].revision)


def test_the_listings_report_the_prefixes_they_ignore_for_their_names(
    direct: Any, bucket: str, make_store: StoreFactory
) -> None:
    for model in ("m", "bad name", "evil<b>x"):
        upload_release(direct, bucket, PREFIX, model, "r1", {"config.pbtxt": b"x"})
    for release in ("r 5", "<img src=x onerror=alert(7)>", '"quote'):
        upload_release(direct, bucket, PREFIX, "m", release, {"a": b"1", "1/b": b"2"})
    for stray in ("loose-file", ".hidden/a", "_controlplane/desired/m.json"):
        direct.put_object(Bucket=bucket, Key=f"{PREFIX}/m/{stray}", Body=b"ignored")
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/_controlplane/desired/m.json", Body=b"{}")
    store = make_store()
    models: list[IgnoredName] = []
    releases: list[IgnoredName] = []

    assert store.list_models(ignored=models.append) == ["m"]
    assert [r.name for r in store.list_releases("m", ignored=releases.append)] == ["r1"]

    base = f"s3://{bucket}/{PREFIX}"
    assert sorted((e.name, e.where) for e in models) == [
        ("bad name", f"{base}/bad name/"),
        ("evil<b>x", f"{base}/evil<b>x/"),
    ]
    # Once per prefix, however many objects it holds (here 3: two files and SHA256SUMS).
    assert sorted((e.name, e.where) for e in releases) == [
        ('"quote', f'{base}/m/"quote/'),
        ("<img src=x onerror=alert(7)>", f"{base}/m/<img src=x onerror=alert(7)>/"),
        ("_controlplane", f"{base}/m/_controlplane/"),
        ("r 5", f"{base}/m/r 5/"),
    ]
    assert all("is not allowed: use letters, digits" in e.reason for e in models + releases)


def test_the_whole_store_in_one_listing_says_what_listing_model_by_model_says(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy
) -> None:
    """Models on both sides of ``_controlplane/`` (capitals and digits sort before '_'), and
    1,200 heartbeats between them: more than a page (1,000 keys) of records, skipped by a
    listing that starts after them; names that are no model's or release's reported alike."""
    for model in ("2tower", "Bert", "resnet", "vit"):
        upload_release(direct, bucket, PREFIX, model, "r1", {"config.pbtxt": b"x"})
    upload_release(direct, bucket, PREFIX, "resnet", "r2", {"a": b"1"}, checksums=False)
    upload_release(direct, bucket, PREFIX, "resnet", "r 5", {"a": b"1"})
    upload_release(direct, bucket, PREFIX, "bad name", "r1", {"a": b"1"})
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/vit/r1/SHA256SUMS.sig", Body=b"sig")
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/_controlplane/desired/vit.json", Body=b"{}")
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: direct.put_object(
                    Bucket=bucket, Key=f"{PREFIX}/_controlplane/members/m{n:04}.json", Body=b"{}"
                ),
                range(1200),
            )
        )
    store = make_store()
    ignored: list[tuple[str | None, IgnoredName]] = []
    before = len(proxy.requests)

    listed = store.list_store(ignored=lambda model, entry: ignored.append((model, entry)))

    listings = proxy.requests[before:]
    by_model: list[tuple[str | None, IgnoredName]] = []
    expected = {}
    for model in store.list_models(ignored=lambda entry: by_model.append((None, entry))):
        expected[model] = store.list_releases(model, ignored=partial(_in, by_model, model))
    assert listed == expected
    assert sorted(ignored, key=str) == sorted(by_model, key=str)
    assert list(listed) == ["2tower", "Bert", "resnet", "vit"]
    assert [(r.name, r.complete, r.signed) for r in listed["resnet"] + listed["vit"]] == [
        ("r1", True, False),
        ("r2", False, False),
        ("r1", True, True),
    ]
    assert sorted((model, entry.name) for model, entry in ignored if model) == [("resnet", "r 5")]
    assert [entry.name for model, entry in ignored if model is None] == ["bad name"]
    # The keys before the records and the first page of records, then the keys after them.
    assert len(listings) == 2, listings
    assert f"start-after={PREFIX}/_controlplane0" in listings[1].query


def _in(found: list[tuple[str | None, IgnoredName]], model: str | None, entry: IgnoredName) -> None:
    found.append((model, entry))


def test_a_whole_store_of_twenty_models_is_one_request(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy
) -> None:
    for n in range(20):
        upload_release(direct, bucket, PREFIX, f"model-{n}", "r1", {"config.pbtxt": b"x"})
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/_controlplane/members/m1.json", Body=b"{}")
    store = make_store()
    before = len(proxy.requests)

    listed = store.list_store()

    assert len(proxy.requests) - before == 1
    assert list(listed) == [f"model-{n}" for n in range(20)]
    assert make_store("empty-prefix").list_store() == {}


def test_list_releases_of_an_unknown_model_is_model_not_found(make_store: StoreFactory) -> None:
    with pytest.raises(ModelNotFound, match="'ghost'"):
        make_store().list_releases("ghost")


def test_describe_and_read_manifest(direct: Any, bucket: str, make_store: StoreFactory) -> None:
    files = release_files()
    etags = upload_release(direct, bucket, PREFIX, "m", "v1", files)
    upload_release(direct, bucket, PREFIX, "m", "v2", files, checksums=False)
    store = make_store()

    assert store.describe("m", "v1") == ReleaseInfo(
        "m", "v1", True, etags[MANIFEST_NAME].strip('"')
    )
    assert store.describe("m", "v2") == ReleaseInfo("m", "v2", False, None)
    with pytest.raises(ReleaseNotFound, match="'v3'"):
        store.describe("m", "v3")
    assert manifest_of(store, "m", "v1") == {rel: sha(data) for rel, data in files.items()}
    assert manifest_of(store, "m", "v2") is None


def test_a_manifest_that_is_not_utf8_is_an_invalid_release(
    direct: Any, bucket: str, make_store: StoreFactory
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"a": b"1"})
    key = f"{PREFIX}/m/v1/{MANIFEST_NAME}"
    latin1 = f"{sha(b'1')}  caf\u00e9\n".encode("latin-1")
    direct.put_object(Bucket=bucket, Key=key, Body=latin1)

    with pytest.raises(UnsafeRelease) as caught:
        manifest_of(make_store(), "m", "v1")

    assert caught.value.code == "invalid_release"  # as a deploy reads it: the bytes, parsed
    assert f"{MANIFEST_NAME} of m/v1 is not UTF-8 text (byte 0xe9" in str(caught.value)


# --- fetching -----------------------------------------------------------------------------


def test_fetch_writes_every_file_hashed_and_reports_progress(
    direct: Any, bucket: str, make_store: StoreFactory, dest: Path
) -> None:
    files = release_files()
    upload_release(direct, bucket, PREFIX, "m", "v1", files)
    seen: list[FetchProgress] = []

    fetched = fetch(make_store(), "m", "v1", dest, progress=seen.append)

    everything = {**files, MANIFEST_NAME: sha256sums(files)}
    assert files_under(dest) == sorted(everything)
    for rel, data in everything.items():
        assert (dest / rel).read_bytes() == data
        assert fetched.files[rel] == FileDigest(len(data), sha(data))
    total = sum(len(d) for d in everything.values())
    assert fetched.manifest == {rel: sha(data) for rel, data in files.items()}
    assert (fetched.bytes_total, fetched.bytes_fetched) == (total, total)
    assert seen[0] == FetchProgress(0, len(everything), 0, total)
    assert seen[-1] == FetchProgress(len(everything), len(everything), total, total)
    assert [p.bytes_done for p in seen] == sorted(p.bytes_done for p in seen)


def test_fetch_skips_the_files_it_already_has(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    files = release_files()
    upload_release(direct, bucket, PREFIX, "m", "v1", files)
    have = {}
    for rel in ("1/data/weights.bin", "config.pbtxt"):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(files[rel])
        have[rel] = FileDigest(len(files[rel]), sha(files[rel]))
    seen: list[FetchProgress] = []

    fetched = fetch(make_store(), "m", "v1", dest, have=have, progress=seen.append)

    assert proxy.gets("weights.bin") == 0
    assert proxy.gets("config.pbtxt") == 0
    assert proxy.gets("model.py") == 1
    total = sum(len(d) for d in files.values()) + len(sha256sums(files))
    cached = sum(d.size for d in have.values())
    assert (fetched.bytes_total, fetched.bytes_fetched) == (total, total - cached)
    assert fetched.files["1/data/weights.bin"] == have["1/data/weights.bin"]
    assert seen[0] == FetchProgress(2, 5, cached, total)
    assert seen[-1] == FetchProgress(5, 5, total, total)


def test_fetch_of_a_scale_release_built_on_disk(
    direct: Any, bucket: str, make_store: StoreFactory, tmp_path: Path, dest: Path
) -> None:
    release_dir = write_scale_release(tmp_path / "src" / PREFIX, "scale", "r1", k=2.0)
    upload_release_dir(direct, bucket, PREFIX, release_dir)

    fetched = fetch(make_store(), "scale", "r1", dest)

    assert files_under(dest) == files_under(release_dir)
    for rel in files_under(release_dir):
        assert (dest / rel).read_bytes() == (release_dir / rel).read_bytes()
    assert fetched.manifest is not None
    assert set(fetched.manifest) == set(files_under(release_dir)) - {MANIFEST_NAME}


def test_large_objects_come_in_ranged_parts(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    big = os.urandom(1024 * 1024 + 123)
    upload_release(direct, bucket, PREFIX, "m", "v1", {"1/big.bin": big, "small": b"s"})
    store = make_store(multipart_threshold=256 * 1024, part_size=64 * 1024, max_concurrency=4)
    seen: list[FetchProgress] = []

    fetched = fetch(store, "m", "v1", dest, progress=seen.append)

    assert (dest / "1/big.bin").read_bytes() == big
    assert fetched.files["1/big.bin"] == FileDigest(len(big), sha(big))
    assert proxy.gets("big.bin", ranged=True) == 17  # 16 full parts and a short one
    assert proxy.gets("big.bin", ranged=False) == 0
    assert proxy.gets("small", ranged=False) == 1
    assert seen[-1].bytes_done == seen[-1].bytes_total == fetched.bytes_total


# --- faults -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "cause"),
    [
        ("drop", RetryCause.CONNECTION),
        ("drop_mid_body", RetryCause.CONNECTION),
        ("500", RetryCause.SERVER_ERROR),
        ("503", RetryCause.THROTTLED),
    ],
)
def test_transient_failures_are_retried_and_counted_by_cause(
    kind: FaultKind,
    cause: RetryCause,
    direct: Any,
    bucket: str,
    make_store: StoreFactory,
    proxy: FaultProxy,
    dest: Path,
) -> None:
    files = release_files()
    upload_release(direct, bucket, PREFIX, "m", "v1", files)
    proxy.fail_next(2, kind, "weights.bin")
    telemetry = CountedRetries()

    fetched = fetch(make_store(telemetry=telemetry), "m", "v1", dest)

    assert proxy.gets("weights.bin") == 3
    assert (dest / "1/data/weights.bin").read_bytes() == files["1/data/weights.bin"]
    assert fetched.files["1/data/weights.bin"].sha256 == sha(files["1/data/weights.bin"])
    assert files_under(dest) == sorted([*files, MANIFEST_NAME])  # no temp file left
    assert telemetry.retries == [cause, cause]
    assert fetched.retries == 2


def test_a_part_cut_short_is_fetched_again(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    big = os.urandom(512 * 1024)
    upload_release(direct, bucket, PREFIX, "m", "v1", {"big.bin": big})
    proxy.fail_next(2, "drop_mid_body", "big.bin")

    store = make_store(multipart_threshold=256 * 1024, part_size=128 * 1024)
    fetch(store, "m", "v1", dest)

    assert (dest / "big.bin").read_bytes() == big
    assert proxy.gets("big.bin", ranged=True) == 4 + 2


def test_persistent_throttling_gives_up_after_retry_seconds_saying_how_long_and_why(
    direct: Any,
    bucket: str,
    make_store: StoreFactory,
    proxy: FaultProxy,
    dest: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", release_files())
    proxy.fail_always("503", "weights.bin")
    telemetry = CountedRetries()
    store = make_store(retry_seconds=1.0, backoff_max=0.2, telemetry=telemetry)
    caplog.set_level(logging.WARNING, logger="controlplane.adapters.stores.retries")

    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        fetch(store, "m", "v1", dest)
    took = time.monotonic() - started

    assert 1.0 <= took < 3.0
    message = str(caught.value)
    key = f"s3://{bucket}/{PREFIX}/m/v1/1/data/weights.bin"
    assert key in message
    tries = proxy.gets("weights.bin")
    assert f"after {tries} attempt(s) over 1." in message
    assert "store.retry_seconds is 1 s" in message
    assert "(throttled): " in message
    assert "SlowDown" in message
    assert caught.value.details["cause"] == "throttled"
    assert tries >= 4  # backoff capped at 0.2 s: several tries fit in one second
    assert telemetry.retries == [RetryCause.THROTTLED] * (tries - 1)
    retries = [r for r in caplog.records if "trying again" in r.getMessage()]
    assert len(retries) == tries - 1
    first = retries[0]
    assert first.levelname == "WARNING"
    assert (first.key, first.attempt, first.cause) == (key, 1, "throttled")  # type: ignore[attr-defined]
    assert 0 <= first.retry_in_seconds <= 0.2  # type: ignore[attr-defined]
    assert 0.5 < first.gives_up_in_seconds <= 1.0  # type: ignore[attr-defined]
    assert any("giving up after" in r.getMessage() for r in caplog.records)
    assert not [p for p in dest.rglob("*") if "weights" in p.name]


def test_an_outage_shorter_than_retry_seconds_delays_the_fetch_but_does_not_fail_it(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    files = release_files()
    upload_release(direct, bucket, PREFIX, "m", "v1", files)
    telemetry = CountedRetries()
    store = make_store(retry_seconds=10.0, backoff_max=0.3, telemetry=telemetry)
    proxy.on_get("weights.bin", lambda _: proxy.down_for(1.5))

    started = time.monotonic()
    fetched = fetch(store, "m", "v1", dest)

    assert time.monotonic() - started >= 1.5
    assert fetched.files["1/data/weights.bin"].sha256 == sha(files["1/data/weights.bin"])
    assert RetryCause.CONNECTION in telemetry.retries
    assert files_under(dest) == sorted([*files, MANIFEST_NAME])


def test_a_large_object_that_keeps_failing_leaves_no_temp_file(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"big.bin": os.urandom(512 * 1024)})
    proxy.fail_always("500", "big.bin")

    store = make_store(retry_seconds=0.2, multipart_threshold=256 * 1024, part_size=64 * 1024)
    with pytest.raises(StoreUnavailable, match="InternalError"):
        fetch(store, "m", "v1", dest)

    assert not [p for p in dest.rglob("*") if "big" in p.name]


# --- bytes that do not match SHA256SUMS ---------------------------------------------------


@pytest.mark.parametrize(
    ("ranged", "object_checksum"),
    [(True, True), (False, False), (False, True)],
    ids=["ranged-part", "whole-object", "whole-object-with-crc32"],
)
def test_a_byte_flipped_on_the_wire_is_fetched_again_and_the_file_is_right(
    ranged: bool,
    object_checksum: bool,
    endpoint: str,
    bucket: str,
    make_store: StoreFactory,
    proxy: FaultProxy,
    dest: Path,
) -> None:
    big = os.urandom(512 * 1024)
    publisher = s3_client(endpoint, checksums=object_checksum)
    try:
        upload_release(publisher, bucket, PREFIX, "m", "v1", {"big.bin": big})
    finally:
        publisher.close()
    proxy.fail_next(1, "flip", "big.bin", ranged=ranged)
    telemetry = CountedRetries()
    threshold = 256 * 1024 if ranged else 1024 * 1024
    store = make_store(multipart_threshold=threshold, part_size=128 * 1024, telemetry=telemetry)

    fetched = fetch(store, "m", "v1", dest)

    assert fetched.files["big.bin"] == FileDigest(len(big), sha(big))
    assert (dest / "big.bin").read_bytes() == big
    assert telemetry.retries == [RetryCause.CORRUPT]
    # A range has no object checksum to check, and an object stored without one neither:
    # the digest against SHA256SUMS catches the flip. With a CRC32, botocore catches it first.
    assert fetched.refetched == (0 if object_checksum and not ranged else 1)
    assert proxy.gets("big.bin", ranged=ranged) == (4 * 2 if ranged else 2)  # all of it again
    assert files_under(dest) == ["SHA256SUMS", "big.bin"]


PART = 64 * 1024


def _parted_store(make_store: StoreFactory, **kwargs: Any) -> S3Store:
    """A store that fetches objects of 256 KiB and more in 64 KiB parts."""
    return make_store(multipart_threshold=256 * 1024, part_size=PART, **kwargs)


def _part_range(index: int) -> str:
    return f"bytes={index * PART}-{(index + 1) * PART - 1}"


def test_parts_hit_in_every_round_are_fetched_again_one_by_one_and_the_file_is_right(
    endpoint: str, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    # A different part is hit in each round: part 0 on its first fetch, part 1 on its second,
    # part 2 on its third. Fetching the whole object again until its digest matched gave
    # three digests, each wrong another way: store_unavailable, every time.
    big = os.urandom(8 * PART)
    publisher = s3_client(endpoint, checksums=False)
    try:
        upload_release(publisher, bucket, PREFIX, "m", "v1", {"big.bin": big})
    finally:
        publisher.close()
    for index in range(3):
        proxy.fail_next(1, "flip", "big.bin", byte_range=_part_range(index), skip=index)
    telemetry = CountedRetries()

    fetched = fetch(_parted_store(make_store, telemetry=telemetry), "m", "v1", dest)

    assert (dest / "big.bin").read_bytes() == big
    assert fetched.files["big.bin"] == FileDigest(len(big), sha(big))
    # Every part twice (one mismatch says no more than "some part"), then only parts 0 and 1,
    # whose two fetches disagreed: their third fetch agrees with one of the first two.
    assert proxy.gets("big.bin", ranged=True) == 8 + 8 + 2
    ranges = [r.range for r in proxy.requests if r.ranged and "big.bin" in r.path]
    assert ranges[16:] == [_part_range(0), _part_range(1)] or ranges[16:] == [
        _part_range(1),
        _part_range(0),
    ]
    assert fetched.refetched == 2
    assert telemetry.retries == [RetryCause.CORRUPT] * 2
    manifest_bytes = fetched.bytes_total - len(big)
    assert fetched.bytes_fetched == 18 * PART + manifest_bytes
    assert files_under(dest) == ["SHA256SUMS", "big.bin"]


def test_a_large_object_with_30_percent_of_its_parts_corrupted_on_the_wire_arrives_intact(
    endpoint: str, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    big = os.urandom(16 * PART)  # 16 parts: 3 % of the rounds come out whole
    publisher = s3_client(endpoint, checksums=False)
    try:
        upload_release(publisher, bucket, PREFIX, "m", "v1", {"big.bin": big})
    finally:
        publisher.close()
    proxy.fail_randomly(0.3, "flip", "big.bin", ranged=True, seed=7)

    fetched = fetch(_parted_store(make_store), "m", "v1", dest)

    assert (dest / "big.bin").read_bytes() == big
    assert fetched.files["big.bin"] == FileDigest(len(big), sha(big))
    per_part = Counter(r.range for r in proxy.requests if r.ranged and "big.bin" in r.path)
    # Two rounds of every part, then only the parts whose two fetches disagreed, each until
    # two agree: the parts that agreed at once were fetched twice, no more.
    assert sorted(per_part) == sorted(_part_range(i) for i in range(16))
    assert min(per_part.values()) == 2
    assert 0 < sum(1 for n in per_part.values() if n > 2) < 16
    gets = sum(per_part.values())
    assert fetched.bytes_fetched == gets * PART + fetched.bytes_total - len(big)


@pytest.mark.parametrize("flips", [0.0, 0.3], ids=["clean-wire", "30-percent-flipped"])
def test_a_large_object_the_store_holds_wrong_is_returned_as_it_is_after_two_fetches(
    flips: float,
    endpoint: str,
    bucket: str,
    make_store: StoreFactory,
    proxy: FaultProxy,
    dest: Path,
) -> None:
    # The store's bytes differ from SHA256SUMS (same size): verification must refuse them as
    # checksum_mismatch, not fetch them for ever, nor call the store unavailable.
    big = os.urandom(8 * PART)
    publisher = s3_client(endpoint, checksums=False)
    try:
        upload_release(publisher, bucket, PREFIX, "m", "v1", {"big.bin": big})
        tampered = bytes([big[0] ^ 1]) + big[1:]
        publisher.put_object(Bucket=bucket, Key=f"{PREFIX}/m/v1/big.bin", Body=tampered)
    finally:
        publisher.close()
    if flips:
        proxy.fail_randomly(flips, "flip", "big.bin", ranged=True, seed=3)

    fetched = fetch(_parted_store(make_store), "m", "v1", dest)

    assert fetched.files["big.bin"] == FileDigest(len(big), sha(tampered))
    assert (dest / "big.bin").read_bytes() == tampered
    per_part = Counter(r.range for r in proxy.requests if r.ranged and "big.bin" in r.path)
    assert min(per_part.values()) == 2  # the store's bytes, seen twice
    assert sum(per_part.values()) == 16 if not flips else sum(per_part.values()) > 16


def test_a_part_corrupted_on_every_fetch_is_store_unavailable_after_retry_seconds(
    endpoint: str, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    big = os.urandom(8 * PART)
    publisher = s3_client(endpoint, checksums=False)
    try:
        upload_release(publisher, bucket, PREFIX, "m", "v1", {"big.bin": big})
    finally:
        publisher.close()
    proxy.fail_always("flip", "big.bin", byte_range=_part_range(5))
    store = _parted_store(make_store, retry_seconds=0.5, backoff_max=0.05)

    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        fetch(store, "m", "v1", dest)

    assert time.monotonic() - started < 5.0
    assert caught.value.details["cause"] == "corrupt"
    message = caught.value.message
    assert "store.retry_seconds is 0.5 s" in message
    assert f"bytes {5 * PART}-{6 * PART - 1} hashed to" in message
    assert "corrupted on the way" in message
    others = [r for r in proxy.requests if r.ranged and r.range != _part_range(5)]
    assert len(others) == 7 * 2  # the parts that agreed were not fetched a third time
    assert not [p for p in dest.rglob("*") if "big" in p.name]


def test_bytes_that_differ_on_every_fetch_are_store_unavailable_not_a_bad_release(
    endpoint: str, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    publisher = s3_client(endpoint, checksums=False)  # no CRC32: the digest must tell
    try:
        upload_release(publisher, bucket, PREFIX, "m", "v1", release_files())
    finally:
        publisher.close()
    proxy.fail_always("flip", "weights.bin")

    with pytest.raises(StoreUnavailable) as caught:
        fetch(make_store(), "m", "v1", dest)

    assert "3 fetches gave 3 different SHA256s" in caught.value.message
    assert "weights.bin" in caught.value.message
    assert caught.value.details["cause"] == "corrupt"
    assert proxy.gets("weights.bin") == 3
    assert not [p for p in dest.rglob("*") if "weights" in p.name]


def test_an_object_whose_crc32_never_checks_out_is_retried_for_retry_seconds(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", release_files())  # with CRC32
    proxy.fail_always("flip", "weights.bin")

    with pytest.raises(StoreUnavailable) as caught:
        fetch(make_store(retry_seconds=0.5, backoff_max=0.1), "m", "v1", dest)

    assert caught.value.details["cause"] == "corrupt"
    assert "FlexibleChecksumError" in caught.value.message
    assert not [p for p in dest.rglob("*") if "weights" in p.name]


def test_a_file_the_store_holds_wrong_is_fetched_twice_and_returned_as_it_is(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    files = release_files()
    upload_release(direct, bucket, PREFIX, "m", "v1", files)
    tampered = b"class TritonPythonModel:\n    PASS\n"
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/m/v1/1/model.py", Body=tampered)

    fetched = fetch(make_store(), "m", "v1", dest)

    assert fetched.files["1/model.py"].sha256 == sha(tampered)  # verification will refuse it
    assert proxy.gets("model.py") == 2
    assert fetched.refetched == 1


# --- cancellation and closing -------------------------------------------------------------


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("s3-fetch")]


def test_a_cancelled_fetch_ends_its_threads_promptly_and_leaves_no_temp_files(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"big.bin": os.urandom(2 * 1024 * 1024)})
    proxy.latency = 0.5  # 32 parts over 4 threads: about 4 s if left alone
    store = make_store(multipart_threshold=256 * 1024, part_size=64 * 1024, max_concurrency=4)
    manifest = manifest_of(store, "m", "v1")
    listing = store.list_files("m", "v1")
    cancel = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            store.fetch(listing, dest, manifest=manifest, cancel=cancel)
        except BaseException as exc:  # what the fetch ended with is the point
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    eventually(lambda: proxy.gets("big.bin") >= 4, 10, "the first parts requested")
    eventually(lambda: (dest / MANIFEST_NAME).exists(), 10, "the small file fetched whole")
    assert list(dest.glob(".big.bin.*.part"))  # mid-download: the temp file exists

    cancel.set()
    started = time.monotonic()
    worker.join(timeout=10)

    assert time.monotonic() - started < 2.0  # each thread stops after its current GET
    assert not worker.is_alive()
    assert [type(exc) for exc in outcome] == [Interrupted], outcome
    assert _fetch_threads() == []
    assert [p.name for p in dest.iterdir()] == [MANIFEST_NAME]  # kept whole; no temp file
    assert proxy.gets("big.bin") < 32


def test_closing_the_store_cuts_a_retrying_call_short(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", release_files())
    proxy.fail_always("503")
    store = make_store(retry_seconds=60.0, backoff_max=0.5)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            store.list_files("m", "v1")
        except BaseException as exc:  # what the call ended with is the point
            outcome.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    eventually(lambda: len(proxy.requests) >= 2, 10, "a retry")
    store.close()
    worker.join(timeout=5)

    assert not worker.is_alive()
    assert [type(exc) for exc in outcome] == [Interrupted], outcome


@pytest.mark.parametrize("change", ["republished", "deleted"])
def test_an_object_changed_during_the_download_is_release_changed(
    change: str, direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", release_files())
    key = f"{PREFIX}/m/v1/1/model.py"

    def change_it(_: SeenRequest) -> None:  # after the listing, before the GET is forwarded
        if change == "deleted":
            direct.delete_object(Bucket=bucket, Key=key)
        else:
            direct.put_object(Bucket=bucket, Key=key, Body=b"# changed\n")

    proxy.on_get("model.py", change_it)

    with pytest.raises(ReleaseChanged, match="m/v1 changed during the download"):
        fetch(make_store(), "m", "v1", dest)

    assert proxy.gets("model.py") == 1  # not retried: the listing is stale
    assert not [p for p in dest.rglob("*") if "model.py" in p.name]


@pytest.mark.parametrize(
    "rel", ["../escape", "1/../../escape", "a//b", "/etc/passwd", "a\\b", "./a"]
)
def test_unsafe_keys_are_refused_before_anything_is_written(
    rel: str,
    direct: Any,
    bucket: str,
    make_store: StoreFactory,
    proxy: FaultProxy,
    dest: Path,
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"config.pbtxt": b"x"})
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/m/v1/{rel}", Body=b"evil")

    with pytest.raises(UnsafeRelease):
        fetch(make_store(), "m", "v1", dest)

    assert list(dest.iterdir()) == []
    assert proxy.gets("/m/v1/") == proxy.gets(f"/m/v1/{MANIFEST_NAME}")  # nothing else read


def test_a_file_that_is_also_a_dir_is_refused(
    direct: Any, bucket: str, make_store: StoreFactory, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"1": b"file", "1/model.py": b"x"})
    with pytest.raises(UnsafeRelease, match="both a file and the dir"):
        fetch(make_store(), "m", "v1", dest)
    assert list(dest.iterdir()) == []


def test_folder_markers_are_not_files(
    direct: Any, bucket: str, make_store: StoreFactory, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"1/model.py": b"x"})
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/m/v1/1/", Body=b"")
    fetched = fetch(make_store(), "m", "v1", dest)
    assert set(fetched.files) == {"1/model.py", MANIFEST_NAME}


def test_access_denied_is_a_permanent_store_error(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", release_files())
    proxy.fail_always("403", "model.py")

    with pytest.raises(StoreError, match=r"access to s3://.*/m/v1/1/model.py was denied"):
        fetch(make_store(), "m", "v1", dest)
    assert proxy.gets("model.py") == 1  # never retried


def test_a_missing_bucket_is_a_store_error_naming_it(proxy: FaultProxy, dest: Path) -> None:
    client = s3_client(proxy.endpoint)
    try:
        store = S3Store("s3://no-such-bucket-here/models", client=client)
        with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist"):
            store.list_models()
        for call in (
            lambda: store.list_releases("m"),
            lambda: store.describe("m", "v1"),
            lambda: manifest_of(store, "m", "v1"),
            lambda: store.list_files("m", "v1"),
        ):
            with pytest.raises(StoreError, match="no-such-bucket-here"):
                call()
        # Never retried: one request each, and describe's HEAD (a 404 without a body, so
        # no bucket name) is followed by a listing, which names the bucket.
        assert len(proxy.requests) == 6
    finally:
        client.close()


def test_a_throttled_listing_is_retried(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"a": b"1"})
    proxy.fail_next(2, "503")
    assert [r.name for r in make_store().list_releases("m")] == ["v1"]
    assert len(proxy.requests) == 3


def test_the_store_builds_its_client_from_the_environment(
    direct: Any, bucket: str, endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"a": b"1"})
    for name, value in aws_env(endpoint).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)

    store = S3Store(f"s3://{bucket}/{PREFIX}")
    try:
        assert store.list_models() == ["m"]
        assert store.describe("m", "v1").complete
    finally:
        store.close()
