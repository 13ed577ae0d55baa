"""The S3 store against a real S3 API (moto's server) over real HTTP on loopback.

Every store talks to moto through a :class:`FaultProxy`, which counts the requests (so a test
can say a cached file was never fetched, or a retry really happened) and breaks the ones a
test scripts. Faults are decided per request, never by timing, and backoff is capped at a few
milliseconds, so these tests are deterministic and fast. No Triton is needed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.adapters.stores.s3 import S3Store
from controlplane.domain.checksums import MANIFEST_NAME, FileDigest
from controlplane.domain.errors import (
    ModelNotFound,
    ReleaseChanged,
    ReleaseNotFound,
    StoreError,
    StoreUnavailable,
    UnsafeRelease,
)
from controlplane.domain.releases import ReleaseInfo
from controlplane.ports import FetchProgress
from tests.support.models import write_scale_release
from tests.support.s3 import (
    FaultKind,
    FaultProxy,
    SeenRequest,
    aws_env,
    s3_client,
    sha256sums,
    upload_release,
    upload_release_dir,
)
from tests.support.s3_fixtures import fault_proxy, moto_endpoint, s3_bucket  # noqa: F401

PREFIX = "store"
StoreFactory = Callable[..., S3Store]


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
    assert store.read_manifest("m", "v1") == {rel: sha(data) for rel, data in files.items()}
    assert store.read_manifest("m", "v2") is None


# --- fetching -----------------------------------------------------------------------------


def test_fetch_writes_every_file_hashed_and_reports_progress(
    direct: Any, bucket: str, make_store: StoreFactory, dest: Path
) -> None:
    files = release_files()
    upload_release(direct, bucket, PREFIX, "m", "v1", files)
    seen: list[FetchProgress] = []

    fetched = make_store().fetch("m", "v1", dest, progress=seen.append)

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

    fetched = make_store().fetch("m", "v1", dest, have=have, progress=seen.append)

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

    fetched = make_store().fetch("scale", "r1", dest)

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

    fetched = store.fetch("m", "v1", dest, progress=seen.append)

    assert (dest / "1/big.bin").read_bytes() == big
    assert fetched.files["1/big.bin"] == FileDigest(len(big), sha(big))
    assert proxy.gets("big.bin", ranged=True) == 17  # 16 full parts and a short one
    assert proxy.gets("big.bin", ranged=False) == 0
    assert proxy.gets("small", ranged=False) == 1
    assert seen[-1].bytes_done == seen[-1].bytes_total == fetched.bytes_total


# --- faults -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["drop", "drop_mid_body", "500", "503"])
def test_transient_failures_are_retried(
    kind: FaultKind,
    direct: Any,
    bucket: str,
    make_store: StoreFactory,
    proxy: FaultProxy,
    dest: Path,
) -> None:
    files = release_files()
    upload_release(direct, bucket, PREFIX, "m", "v1", files)
    proxy.fail_next(2, kind, "weights.bin")

    fetched = make_store(attempts=3).fetch("m", "v1", dest)

    assert proxy.gets("weights.bin") == 3
    assert (dest / "1/data/weights.bin").read_bytes() == files["1/data/weights.bin"]
    assert fetched.files["1/data/weights.bin"].sha256 == sha(files["1/data/weights.bin"])
    assert files_under(dest) == sorted([*files, MANIFEST_NAME])  # no temp file left


def test_a_part_cut_short_is_fetched_again(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    big = os.urandom(512 * 1024)
    upload_release(direct, bucket, PREFIX, "m", "v1", {"big.bin": big})
    proxy.fail_next(2, "drop_mid_body", "big.bin")

    store = make_store(multipart_threshold=256 * 1024, part_size=128 * 1024)
    store.fetch("m", "v1", dest)

    assert (dest / "big.bin").read_bytes() == big
    assert proxy.gets("big.bin", ranged=True) == 4 + 2


def test_persistent_throttling_gives_up_naming_the_key_and_attempts(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", release_files())
    proxy.fail_always("503", "weights.bin")

    with pytest.raises(StoreUnavailable) as caught:
        make_store(attempts=3).fetch("m", "v1", dest)

    message = str(caught.value)
    assert f"s3://{bucket}/{PREFIX}/m/v1/1/data/weights.bin" in message
    assert "3 attempt(s)" in message
    assert "SlowDown" in message
    assert proxy.gets("weights.bin") == 3
    assert not [p for p in dest.rglob("*") if "weights" in p.name]


def test_a_large_object_that_keeps_failing_leaves_no_temp_file(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"big.bin": os.urandom(512 * 1024)})
    proxy.fail_always("500", "big.bin")

    store = make_store(attempts=2, multipart_threshold=256 * 1024, part_size=64 * 1024)
    with pytest.raises(StoreUnavailable, match="InternalError"):
        store.fetch("m", "v1", dest)

    assert not [p for p in dest.rglob("*") if "big" in p.name]


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
        make_store().fetch("m", "v1", dest)

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
        make_store().fetch("m", "v1", dest)

    assert list(dest.iterdir()) == []
    assert proxy.gets("/m/v1/") == 0


def test_a_file_that_is_also_a_dir_is_refused(
    direct: Any, bucket: str, make_store: StoreFactory, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"1": b"file", "1/model.py": b"x"})
    with pytest.raises(UnsafeRelease, match="both a file and the dir"):
        make_store().fetch("m", "v1", dest)
    assert list(dest.iterdir()) == []


def test_folder_markers_are_not_files(
    direct: Any, bucket: str, make_store: StoreFactory, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", {"1/model.py": b"x"})
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/m/v1/1/", Body=b"")
    fetched = make_store().fetch("m", "v1", dest)
    assert set(fetched.files) == {"1/model.py", MANIFEST_NAME}


def test_access_denied_is_a_permanent_store_error(
    direct: Any, bucket: str, make_store: StoreFactory, proxy: FaultProxy, dest: Path
) -> None:
    upload_release(direct, bucket, PREFIX, "m", "v1", release_files())
    proxy.fail_always("403", "model.py")

    with pytest.raises(StoreError, match=r"access to s3://.*/m/v1/1/model.py was denied"):
        make_store().fetch("m", "v1", dest)
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
            lambda: store.read_manifest("m", "v1"),
            lambda: store.fetch("m", "v1", dest),
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
