"""The content cache: shared files are linked, not fetched again; unused entries are evicted."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from controlplane.adapters.staging.cache import ContentCache
from controlplane.adapters.staging.fs import StagingArea
from controlplane.domain.checksums import FileDigest
from controlplane.domain.errors import Interrupted
from controlplane.domain.operations import Operation, OperationStatus
from controlplane.ports import CachedFiles, StoredFile
from tests.support.fakes import deploy_service, started
from tests.support.models import write_scale_release, write_sha256sums


def _fetch_detail(operation: Operation) -> dict[str, object]:
    fetch = next(step for step in operation.steps if step.name == "fetch")
    return dict(fetch.detail)


def test_files_two_releases_share_are_linked_from_the_cache(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path, cache_max_bytes=10 * 1024**2) as (service, parts):
            # Same model code and config in both releases; only SHA256SUMS lists them again.
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            write_scale_release(parts.store_path, "m", "r2", k=1.0)
            first = await service.wait((await started(service, "m", "r1")).id)
            second = await service.wait((await started(service, "m", "r2")).id)
            one, two = _fetch_detail(first), _fetch_detail(second)
            assert one["files_cached"] == 0
            assert one["bytes_fetched"] == one["bytes"]
            assert two["files_cached"] == 2  # config.pbtxt and 1/model.py
            assert (
                two["bytes_fetched"]
                == (parts.store_path / "m" / "r2" / "SHA256SUMS").stat().st_size
            )
            placed = parts.repository / "m" / "1" / "model.py"
            cas = parts.staging_path / "cas"
            entries = [entry for entry in cas.iterdir() if entry.is_file()]
            assert any(placed.samefile(entry) for entry in entries)
            # The cache holds the published config, not the one rewritten for Triton.
            published = (parts.store_path / "m" / "r2" / "config.pbtxt").read_bytes()
            assert any(entry.read_bytes() == published for entry in entries)

    asyncio.run(scenario())


def test_eviction_keeps_what_a_placed_release_uses(tmp_path: Path) -> None:
    root = tmp_path / "release"
    root.mkdir()
    cache = ContentCache(tmp_path / "cas", max_bytes=250)
    files = {}
    for index in range(3):
        path = root / f"f{index}"
        path.write_bytes(bytes([index]) * 100)
        files[f"f{index}"] = FileDigest(100, _sha(path))
    cache.add(root, files)  # 300 bytes > 250, but every entry is still linked from `root`
    assert cache.size() == 300
    (root / "f0").unlink()  # f0 is no longer used by anything but the cache
    (root / "f1").unlink()
    evicted = cache.evict()
    # One unused entry goes (only as many as the bound needs); the used one always stays.
    assert len(evicted) == 1
    assert evicted[0] in (files["f0"].sha256, files["f1"].sha256)
    assert (tmp_path / "cas" / files["f2"].sha256).exists()
    assert cache.size() == 200


def test_start_up_clean_keeps_the_cache(tmp_path: Path) -> None:
    staging = StagingArea(tmp_path / "repository", tmp_path / "staging", cache_max_bytes=1024)
    staging.check()
    (tmp_path / "staging" / "cas").mkdir()
    (tmp_path / "staging" / "0123456789abcdef").mkdir()
    assert staging.clean_all() == ["0123456789abcdef"]
    assert (tmp_path / "staging" / "cas").is_dir()


def test_releases_verified_at_the_same_time_are_all_cached(tmp_path: Path) -> None:
    # Operations add verified files from worker threads at once. Found by the fault campaign:
    # one add's eviction removed another's .tmp- link before its rename (FileNotFoundError,
    # and the deploy failed with internal_error).
    cache = ContentCache(tmp_path / "cas", max_bytes=64)  # small: entries come and go
    errors: list[BaseException] = []

    def verify_releases(worker: int) -> None:
        release = tmp_path / f"release-{worker}"
        release.mkdir()
        for index in range(300):
            path = release / "model.py"
            path.write_bytes(f"{worker}-{index}".encode())
            try:
                cache.add(release, {"model.py": FileDigest(path.stat().st_size, _sha(path))})
            except OSError as exc:
                errors.append(exc)
            path.unlink()  # the release is gone: only the cache holds the file now

    threads = [threading.Thread(target=verify_releases, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert not [p.name for p in (tmp_path / "cas").iterdir() if p.name.startswith(".tmp-")]
    assert cache.size() <= 64


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- what a cache hit trusts --------------------------------------------------------------

GOOD = b"K = 1.0\n" * 100
BAD = b"K = 9.0\n" * 100  # the same size: only a hash tells them apart
VERSION = '"etag-of-good"'  # the store's version the cached bytes were fetched at


def _cached(tmp_path: Path, data: bytes = GOOD) -> tuple[ContentCache, str, Path]:
    """A cache holding ``data`` as verified by this process (added, as a fetch adds it),
    fetched at the store's ``VERSION``."""
    release = tmp_path / "verified"
    release.mkdir()
    (release / "model.py").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    cache = ContentCache(tmp_path / "cas", max_bytes=1024**2)
    cache.add(
        release,
        {"model.py": FileDigest(len(data), digest)},
        {"model.py": StoredFile(len(data), VERSION)},
    )
    return cache, digest, tmp_path / "cas" / digest


def _link(
    cache: ContentCache,
    tmp_path: Path,
    digest: str,
    size: int,
    name: str = "dest",
    *,
    version: str | None = VERSION,
    rel: str = "1/model.py",
    confirm: Callable[[str, str, threading.Event], bool] | None = None,
) -> tuple[CachedFiles, Path]:
    """Link ``rel`` listed with ``digest``, ``size`` and ``version`` into a new dir ``name``."""
    dest = tmp_path / name
    dest.mkdir()
    listed = {rel: StoredFile(size, version)}
    return cache.link_into(dest, {rel: digest}, listed, confirm=confirm), dest


def _replace_with_new_inode(entry: Path, data: bytes) -> None:
    """What ``sed -i`` does: write a new file and rename it over the entry."""
    tmp = entry.with_name(".sed-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, entry)


def _write_in_place(entry: Path, data: bytes) -> None:
    os.chmod(entry, stat.S_IRUSR | stat.S_IWUSR)
    with entry.open("r+b") as stream:
        stream.write(data)


def test_an_entry_of_another_size_than_the_store_lists_is_not_linked(tmp_path: Path) -> None:
    # A publisher edited the file after writing SHA256SUMS: the store lists another size.
    cache, digest, entry = _cached(tmp_path)

    cached, dest = _link(cache, tmp_path, digest, len(GOOD) + 9)

    assert cached.linked == {}
    assert cached.refused == ("1/model.py",)
    assert not (dest / "1" / "model.py").exists()  # the fetch copies it, verify judges it
    assert entry.read_bytes() == GOOD  # the entry may well be right: it stays


def test_an_entry_replaced_by_other_bytes_is_not_linked_and_is_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache, digest, entry = _cached(tmp_path)
    _replace_with_new_inode(entry, BAD)

    with caplog.at_level(logging.WARNING):
        cached, dest = _link(cache, tmp_path, digest, len(GOOD))

    assert cached.linked == {}
    assert cached.refused == ("1/model.py",)
    assert not (dest / "1" / "model.py").exists()
    assert not entry.exists()
    assert digest in caplog.text


def test_an_entry_written_in_place_is_not_linked_and_is_deleted(tmp_path: Path) -> None:
    cache, digest, entry = _cached(tmp_path)
    before = entry.stat()
    _write_in_place(entry, BAD)
    # Written within the same clock tick the mtime may not move; a tamperer's write later does.
    os.utime(entry, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))

    cached, dest = _link(cache, tmp_path, digest, len(GOOD))

    assert cached.linked == {}
    assert not (dest / "1" / "model.py").exists()
    assert not entry.exists()


def test_an_entry_this_process_verified_is_linked_without_reading_it_again(
    tmp_path: Path,
) -> None:
    cache, digest, entry = _cached(tmp_path)
    # Change the bytes but keep what identifies them (inode, size, mtime): only a re-hash
    # could see it, so a link shows that the entry was not read again.
    before = entry.stat()
    _write_in_place(entry, BAD)
    os.utime(entry, ns=(before.st_atime_ns, before.st_mtime_ns))

    cached, dest = _link(cache, tmp_path, digest, len(GOOD))

    assert cached.linked == {"1/model.py": FileDigest(len(GOOD), digest)}
    assert (dest / "1" / "model.py").samefile(entry)
    # A restarted daemon has hashed nothing yet: its first use reads the entry, and refuses it.
    restarted = ContentCache(tmp_path / "cas", max_bytes=1024**2)
    again, _dest = _link(restarted, tmp_path, digest, len(GOOD), name="after-restart")
    assert again.linked == {}
    assert not entry.exists()


def test_after_a_restart_an_entry_is_hashed_once_then_trusted(tmp_path: Path) -> None:
    _cache, digest, entry = _cached(tmp_path)
    restarted = ContentCache(tmp_path / "cas", max_bytes=1024**2)
    mtime = entry.stat().st_mtime_ns

    first, dest = _link(restarted, tmp_path, digest, len(GOOD), name="first")
    assert first.linked == {"1/model.py": FileDigest(len(GOOD), digest)}
    assert (dest / "1" / "model.py").read_bytes() == GOOD
    # Hashed once: from now on this process knows the inode (same trick as above).
    _write_in_place(entry, BAD)
    os.utime(entry, ns=(entry.stat().st_atime_ns, mtime))
    second, _dest = _link(restarted, tmp_path, digest, len(GOOD), name="second")
    assert second.linked == first.linked
    assert entry.stat().st_mtime_ns == mtime  # the cache never touches mtimes (Triton reads them)


def test_a_verified_file_replaces_an_entry_of_the_wrong_size(tmp_path: Path) -> None:
    cache, digest, entry = _cached(tmp_path)
    _replace_with_new_inode(entry, GOOD[:-1])  # truncated: another size than its hash's file
    refused, _dest = _link(cache, tmp_path, digest, len(GOOD), name="refused")
    assert refused.linked == {}

    fetched = tmp_path / "fetched"  # the store's file, fetched and verified instead
    fetched.mkdir()
    (fetched / "model.py").write_bytes(GOOD)
    cache.add(
        fetched,
        {"model.py": FileDigest(len(GOOD), digest)},
        {"model.py": StoredFile(len(GOOD), VERSION)},
    )

    assert entry.read_bytes() == GOOD
    linked, _dest = _link(cache, tmp_path, digest, len(GOOD), name="linked")
    assert linked.linked == {"1/model.py": FileDigest(len(GOOD), digest)}


def test_a_cancelled_link_stops_before_hashing(tmp_path: Path) -> None:
    _cache, digest, _entry = _cached(tmp_path)
    restarted = ContentCache(tmp_path / "cas", max_bytes=1024**2)
    cancel = threading.Event()
    cancel.set()
    dest = tmp_path / "dest"
    dest.mkdir()

    with pytest.raises(Interrupted):
        restarted.link_into(
            dest,
            {"1/model.py": digest},
            {"1/model.py": StoredFile(len(GOOD), VERSION)},
            cancel=cancel,
        )


# --- what the store vouches for --------------------------------------------------------


def test_an_entry_is_not_linked_for_a_store_version_it_was_never_seen_to_hold(
    tmp_path: Path,
) -> None:
    # The store's file was replaced after SHA256SUMS was written (same size: a new ETag):
    # the cache cannot tell its bytes from the entry's without a fetch, so it fetches.
    cache, digest, entry = _cached(tmp_path)

    cached, dest = _link(cache, tmp_path, digest, len(GOOD), version='"etag-after-an-edit"')

    assert cached.linked == {}
    assert cached.refused == ("1/model.py",)
    assert not (dest / "1" / "model.py").exists()
    assert entry.read_bytes() == GOOD  # the entry may well be right: it stays
    unversioned, _dest = _link(cache, tmp_path, digest, len(GOOD), "none", version=None)
    assert unversioned.linked == {}  # a store that gives no version vouches for nothing


def test_the_same_bytes_under_another_path_hit_by_the_version_they_were_seen_at(
    tmp_path: Path,
) -> None:
    # An S3 ETag is the MD5 of the content (single-part uploads): the same bytes uploaded
    # under another release's key, or another path, have the same one.
    cache, digest, entry = _cached(tmp_path)

    cached, dest = _link(cache, tmp_path, digest, len(GOOD), rel="2/shared.py")

    assert cached.linked == {"2/shared.py": FileDigest(len(GOOD), digest)}
    assert (dest / "2" / "shared.py").samefile(entry)


def test_a_version_the_store_confirms_is_linked_and_remembered(tmp_path: Path) -> None:
    cache, digest, _entry = _cached(tmp_path)
    asked: list[tuple[str, str]] = []

    def confirm(rel: str, sha256: str, _cancel: threading.Event) -> bool:
        asked.append((rel, sha256))
        return True  # a directory store read its file: it holds those bytes

    first, _dest = _link(
        cache, tmp_path, digest, len(GOOD), "first", version="file:1:2", confirm=confirm
    )
    again, _dest = _link(cache, tmp_path, digest, len(GOOD), "again", version="file:1:2")

    assert asked == [("1/model.py", digest)]
    assert first.linked == again.linked == {"1/model.py": FileDigest(len(GOOD), digest)}
    denied, _dest = _link(
        cache, tmp_path, digest, len(GOOD), "denied", version="file:1:3", confirm=lambda *_: False
    )
    assert denied.refused == ("1/model.py",)


def test_what_the_store_was_seen_to_hold_outlives_a_restart_and_goes_with_its_entry(
    tmp_path: Path,
) -> None:
    _cache, digest, entry = _cached(tmp_path)
    restarted = ContentCache(tmp_path / "cas", max_bytes=1024**2)

    linked, dest = _link(restarted, tmp_path, digest, len(GOOD))

    assert linked.linked == {"1/model.py": FileDigest(len(GOOD), digest)}
    shutil.rmtree(dest)
    shutil.rmtree(tmp_path / "verified")  # nothing but the cache uses the entry now
    ContentCache(tmp_path / "cas", max_bytes=1).evict()
    assert not entry.exists()
    assert list((tmp_path / "cas" / ".evidence").iterdir()) == []


def test_a_file_edited_after_its_checksum_is_refused_though_the_cache_holds_the_hash(
    tmp_path: Path,
) -> None:
    # Found by a tester: r2's SHA256SUMS lists r1's model.py, but model.py was edited after.
    # The cache held the listed hash, so the edit was never read and r2 "succeeded" serving
    # r1's bytes, where a host without that entry refused it. The verdict is now the same.
    async def scenario() -> None:
        async with deploy_service(tmp_path, cache_max_bytes=10 * 1024**2) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            write_scale_release(parts.store_path, "m", "r2", k=1.0)
            model_py = parts.store_path / "m" / "r2" / "1" / "model.py"
            model_py.write_text(model_py.read_text().replace("K = 1.0", "K = 20.0"))
            assert (await service.wait((await started(service, "m", "r1")).id)).error is None

            refused = await service.wait((await started(service, "m", "r2")).id)

            assert refused.error is not None
            assert refused.error.code == "checksum_mismatch"
            assert "1/model.py" in refused.error.message
            detail = _fetch_detail(refused)
            assert detail["files_cached"] == 1  # config.pbtxt, whose size is as listed
            assert detail["files_cache_refused"] == 1
            served = parts.repository / "m" / "1" / "model.py"  # r1's, as before
            assert (
                served.read_bytes()
                == (parts.store_path / "m" / "r1" / "1" / "model.py").read_bytes()
            )

    asyncio.run(scenario())


def test_a_damaged_cache_entry_is_fetched_again_from_the_store(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with deploy_service(tmp_path, cache_max_bytes=10 * 1024**2) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            assert (await service.wait((await started(service, "m", "r1")).id)).error is None
            model_py = parts.store_path / "m" / "r1" / "1" / "model.py"
            entry = parts.staging_path / "cas" / _sha(model_py)
            _replace_with_new_inode(entry, model_py.read_bytes().replace(b"1.0", b"9.0"))
            write_scale_release(parts.store_path, "m", "r2", k=1.0)
            (parts.store_path / "m" / "r2" / "README").write_text("r2\n")  # r2 is not r1
            write_sha256sums(parts.store_path / "m" / "r2")

            second = await service.wait((await started(service, "m", "r2")).id)

            assert second.status is OperationStatus.SUCCEEDED, second.error
            placed = parts.repository / "m" / "1" / "model.py"
            assert placed.read_bytes() == model_py.read_bytes()
            assert entry.read_bytes() == model_py.read_bytes()  # the verified file replaced it
            detail = _fetch_detail(second)
            assert detail["files_cached"] == 1  # config.pbtxt
            assert detail["files_cache_refused"] == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("warm", [True, False], ids=["warm-cache", "empty-cache"])
def test_a_file_edited_after_its_checksum_to_the_same_size_gets_one_verdict_whatever_the_cache(
    tmp_path: Path, warm: bool
) -> None:
    # Found from outside: r2's SHA256SUMS lists r1's model.py, then model.py was edited to
    # the same size. A member whose cache held the hash deployed r2 (serving r1's bytes); a
    # fresh member refused it. Both refuse it now, and the unchanged config still hits.
    async def scenario() -> None:
        async with deploy_service(tmp_path, cache_max_bytes=10 * 1024**2) as (service, parts):
            write_scale_release(parts.store_path, "m", "r1", k=1.0)
            write_scale_release(parts.store_path, "m", "r2", k=1.0)
            model_py = parts.store_path / "m" / "r2" / "1" / "model.py"
            edited = model_py.read_bytes().replace(b"K = 1.0", b"K = 9.0")
            assert len(edited) == model_py.stat().st_size
            model_py.write_bytes(edited)
            if warm:
                assert (await service.wait((await started(service, "m", "r1")).id)).error is None

            refused = await service.wait((await started(service, "m", "r2")).id)

            assert refused.error is not None
            assert refused.error.code == "checksum_mismatch"
            assert "1/model.py" in refused.error.message
            detail = _fetch_detail(refused)
            assert detail["files_cached"] == (1 if warm else 0)  # config.pbtxt, unchanged
            assert detail["files_cache_refused"] == (1 if warm else 0)

    asyncio.run(scenario())
