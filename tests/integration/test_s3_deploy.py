"""The daemon on an S3 store (moto's server over loopback HTTP) and the real Triton."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.fault_proxy import FaultProxy
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import aws_env, upload_release, upload_release_dir
from tests.support.s3_fixtures import fault_proxy, moto_endpoint, s3_bucket  # noqa: F401
from tests.support.tree import snapshot

pytestmark = pytest.mark.triton
PREFIX = "models"


def _s3_daemon(
    daemons: DaemonFactory,
    tmp_path: Path,
    endpoint: str,
    bucket: str,
    *,
    config: str | None = None,
) -> Daemon:
    return daemons(
        tmp_path,  # unused local store path; the URI below replaces it
        store_uri=f"s3://{bucket}/{PREFIX}",
        extra_env=aws_env(endpoint),
        config=config,
    )


def _answers(triton: RunningTriton, model: str, expected: float) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return infer_once(triton.grpc_url, model) == expected
        except Exception:  # not loaded yet
            return False

    return check


def test_auto_deploy_follows_the_bucket(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    model_name: str,
    triton: RunningTriton,
) -> None:
    client, bucket = s3_bucket
    poll = 0.5
    daemon = _s3_daemon(
        daemons,
        tmp_path,
        fault_proxy.endpoint,
        bucket,
        config=f"store:\n  poll_interval_seconds: {poll}\n"
        f"models:\n  {model_name}:\n    auto_deploy: true\n",
    )
    releases = tmp_path / "releases"

    r1 = write_scale_release(releases, model_name, "r1", k=1.0)
    upload_release_dir(client, bucket, PREFIX, r1)  # files, then SHA256SUMS last
    waited = eventually(_answers(triton, model_name, 1.0), 60, "r1 serving")
    # Within a poll interval plus the load (about 1.5 s here), with slack for a 2-core CI box.
    assert waited < poll + 15

    r2 = write_scale_release(releases, model_name, "r2", k=2.0)
    for path in sorted(p for p in r2.rglob("*") if p.is_file() and p.name != "SHA256SUMS"):
        key = f"{PREFIX}/{model_name}/r2/{path.relative_to(r2).as_posix()}"
        client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    # Several scans later, the incomplete r2 is known but nothing was deployed.
    eventually(
        lambda: any(
            r["name"] == "r2" and not r["complete"]
            for r in daemon.get(f"/v1/models/{model_name}").json()["releases"]
        ),
        30,
        "r2 listed as incomplete",
    )
    scans_before = _scans(fault_proxy)
    eventually(
        lambda: _scans(fault_proxy) >= scans_before + 3,
        30,
        "three more scans",
    )
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "r1"

    client.put_object(
        Bucket=bucket,
        Key=f"{PREFIX}/{model_name}/r2/SHA256SUMS",
        Body=(r2 / "SHA256SUMS").read_bytes(),
    )
    eventually(_answers(triton, model_name, 2.0), 60, "r2 serving")
    operation = daemon.get(f"/v1/operations?model={model_name}&limit=1").json()["operations"][0]
    assert operation["trigger"] == "watcher"
    assert operation["release"] == "r2"


def _model_dirs(daemon: Daemon, model: str) -> dict[str, dict[str, str]]:
    """Everything the model has in the repository: its alias and slots, or its inplace dir."""
    return {path.name: snapshot(path) for path in sorted(daemon.repository.glob(f"{model}*"))}


def _scans(proxy: FaultProxy) -> int:
    """ListObjectsV2 calls over the whole store: the watcher's full scans (one request each
    for a store this small; a look at one model, GET /v1/models/{name}'s, lists its keys
    alone)."""
    return sum(
        1
        for seen in proxy.requests
        if seen.method == "GET"
        and parse_qs(seen.query).get("list-type") == ["2"]
        and parse_qs(seen.query).get("prefix") == [f"{PREFIX}/"]
    )


def _upload_scale(client: Any, bucket: str, root: Path, model: str, release: str, k: float) -> Path:
    release_dir = write_scale_release(root, model, release, k=k)
    upload_release_dir(client, bucket, PREFIX, release_dir)
    return release_dir


def test_a_mismatching_object_is_refused_and_the_serving_release_keeps_serving(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
    model_name: str,
    triton: RunningTriton,
) -> None:
    client, bucket = s3_bucket
    _upload_scale(client, bucket, tmp_path / "r", model_name, "r2", 2.0)
    bad = _upload_scale(client, bucket, tmp_path / "r", model_name, "r3", 3.0)
    client.put_object(
        Bucket=bucket,
        Key=f"{PREFIX}/{model_name}/r3/1/model.py",
        Body=(bad / "1" / "model.py").read_bytes() + b"\n# tampered\n",
    )
    daemon = _s3_daemon(daemons, tmp_path, moto_endpoint, bucket)
    assert daemon.deploy(model_name, "r2").status_code == 200
    before = _model_dirs(daemon, model_name)

    response = daemon.deploy(model_name, "r3")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "checksum_mismatch"
    assert "1/model.py" in response.json()["error"]["message"]
    assert _model_dirs(daemon, model_name) == before
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_download_faults_are_retried_and_persistent_ones_fail_cleanly(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    model_name: str,
    triton: RunningTriton,
) -> None:
    client, bucket = s3_bucket
    _upload_scale(client, bucket, tmp_path / "r", model_name, "r1", 1.0)
    _upload_scale(client, bucket, tmp_path / "r", model_name, "r2", 2.0)
    daemon = _s3_daemon(
        daemons, tmp_path, fault_proxy.endpoint, bucket, config="store:\n  retry_seconds: 2\n"
    )
    model_key = f"{model_name}/r1/1/model.py"
    fault_proxy.fail_next(1, "drop", key=model_key)
    fault_proxy.fail_next(1, "drop_mid_body", key=model_key)
    fault_proxy.fail_next(1, "500", key=model_key)
    fault_proxy.fail_next(1, "503", key=model_key)

    retried = daemon.deploy(model_name, "r1")

    assert retried.status_code == 200, retried.text
    assert fault_proxy.gets(model_key) == 5  # four faults, then the good answer
    assert infer_once(triton.grpc_url, model_name) == 1.0

    before = _model_dirs(daemon, model_name)
    fault_proxy.fail_always("503", key=f"{model_name}/r2/1/model.py")
    persistent = daemon.deploy(model_name, "r2")

    assert persistent.status_code == 503
    error = persistent.json()["error"]
    assert error["code"] == "store_unavailable"
    assert "r2/1/model.py" in error["message"]
    assert "attempt(s) over 2." in error["message"]
    assert "(throttled)" in error["message"]
    assert _model_dirs(daemon, model_name) == before
    assert daemon.staging_leftovers() == []
    assert infer_once(triton.grpc_url, model_name) == 1.0


def test_keys_that_spell_paths_are_refused(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    moto_endpoint: str,  # noqa: F811
    model_name: str,
) -> None:
    client, bucket = s3_bucket
    release = write_scale_release(tmp_path / "r", model_name, "r1", k=1.0)
    upload_release_dir(client, bucket, PREFIX, release)
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/{model_name}/r1/../../escape", Body=b"x")
    daemon = _s3_daemon(daemons, tmp_path, moto_endpoint, bucket)

    response = daemon.deploy(model_name, "r1")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_release"
    assert ".." in response.json()["error"]["message"]
    assert _model_dirs(daemon, model_name) == {}
    assert not (daemon.staging.parent / "escape").exists()


def test_files_two_releases_share_are_not_downloaded_again(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    model_name: str,
    triton: RunningTriton,
) -> None:
    client, bucket = s3_bucket
    weights = hashlib.sha256(b"seed").digest() * 32768  # 1 MiB shared by both releases
    for release, k in (("r1", 1.0), ("r2", 2.0)):
        release_dir = write_scale_release(tmp_path / "r", model_name, release, k=k)
        files = {
            p.relative_to(release_dir).as_posix(): p.read_bytes()
            for p in release_dir.rglob("*")
            if p.is_file() and p.name != "SHA256SUMS"
        }
        files["1/weights.bin"] = weights
        upload_release(client, bucket, PREFIX, model_name, release, files)
    daemon = _s3_daemon(daemons, tmp_path, fault_proxy.endpoint, bucket)

    assert daemon.deploy(model_name, "r1").status_code == 200
    assert fault_proxy.gets(f"{model_name}/r1/1/weights.bin") == 1
    second = daemon.deploy(model_name, "r2")

    assert second.status_code == 200
    assert fault_proxy.gets(f"{model_name}/r2/1/weights.bin") == 0
    assert fault_proxy.gets(f"{model_name}/r2/config.pbtxt") == 0  # same bytes as r1's
    assert fault_proxy.gets(f"{model_name}/r2/1/model.py") == 1  # k differs
    fetch = next(s for s in second.json()["operation"]["steps"] if s["name"] == "fetch")
    assert fetch["detail"]["files_cached"] == 2
    assert infer_once(triton.grpc_url, model_name) == 2.0


def test_a_file_edited_to_the_same_size_gets_one_verdict_from_a_warm_and_an_empty_cache(
    daemons: DaemonFactory,
    tmp_path: Path,
    s3_bucket: tuple[Any, str],  # noqa: F811
    fault_proxy: FaultProxy,  # noqa: F811
    model_name: str,
    triton: RunningTriton,
) -> None:
    # Found from outside: r2's SHA256SUMS lists r1's model.py, then model.py was replaced in
    # the bucket by an edit of the same size. The member whose cache held the listed hash
    # deployed r2 (the cached bytes); a fresh member refused it. Now the cache gives a file
    # only for an ETag it has seen hold those bytes: both refuse it.
    client, bucket = s3_bucket
    _upload_scale(client, bucket, tmp_path / "r", model_name, "r1", 1.0)
    r2 = _upload_scale(client, bucket, tmp_path / "r", model_name, "r2", 1.0)
    edited = (r2 / "1" / "model.py").read_bytes().replace(b"K = 1.0", b"K = 9.0")
    assert len(edited) == (r2 / "1" / "model.py").stat().st_size
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/{model_name}/r2/1/model.py", Body=edited)
    config = "fleet:\n  enabled: false\n"  # two hosts that do not converge on each other
    warm = _s3_daemon(daemons, tmp_path, fault_proxy.endpoint, bucket, config=config)
    assert warm.deploy(model_name, "r1").status_code == 200

    on_warm = warm.deploy(model_name, "r2")

    assert on_warm.status_code == 422, on_warm.text
    assert on_warm.json()["error"]["code"] == "checksum_mismatch"
    assert "1/model.py" in on_warm.json()["error"]["message"]
    assert fault_proxy.gets(f"{model_name}/r2/1/model.py") == 2  # the same wrong bytes twice
    # config.pbtxt is r1's, uploaded again: the same ETag (its MD5), so it is linked.
    assert fault_proxy.gets(f"{model_name}/r2/config.pbtxt") == 0
    assert infer_once(triton.grpc_url, model_name) == 1.0
    warm.stop()

    empty = _s3_daemon(daemons, tmp_path, fault_proxy.endpoint, bucket, config=config)
    on_empty = empty.deploy(model_name, "r2")

    assert on_empty.status_code == on_warm.status_code
    assert on_empty.json()["error"]["code"] == on_warm.json()["error"]["code"]
    assert "1/model.py" in on_empty.json()["error"]["message"]
    assert fault_proxy.gets(f"{model_name}/r2/config.pbtxt") == 1  # nothing cached there
