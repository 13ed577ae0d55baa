"""The content cache: shared files are linked, not fetched again; unused entries are evicted."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

from controlplane.adapters.staging.cache import ContentCache
from controlplane.adapters.staging.fs import StagingArea
from controlplane.domain.checksums import FileDigest
from controlplane.domain.operations import Operation
from tests.support.fakes import deploy_service, started
from tests.support.models import write_scale_release


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
            assert any(placed.samefile(entry) for entry in cas.iterdir())
            # The cache holds the published config, not the one rewritten for Triton.
            published = (parts.store_path / "m" / "r2" / "config.pbtxt").read_bytes()
            assert any(entry.read_bytes() == published for entry in cas.iterdir())

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
