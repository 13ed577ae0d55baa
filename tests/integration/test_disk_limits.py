"""A release cannot fill the disk: the real daemon, a local store, the real Triton.

Each release that would fill the disk holds a sparse file whose apparent size is more than
the staging filesystem has free (at least 100 GiB): the store lists it at that size, while it
costs the test nothing. Staging's real usage (allocated blocks) is polled while the deploy
runs, and the release already serving must keep answering.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.daemon import Daemon
from tests.support.disk import PeakUsage, add_sparse_file, too_big_for
from tests.support.inference import infer_once
from tests.support.models import write_scale_release, write_sha256sums

pytestmark = pytest.mark.triton
log = logging.getLogger(__name__)
MIB = 1024**2
FEW_MB = 4 * MIB  # what staging may hold at most while it refuses: r1's cache entries, dirs


def _fetch_step(response: Any) -> dict[str, Any]:
    steps = response.json()["operation"]["steps"]
    return dict(next(step for step in steps if step["name"] == "fetch")["detail"])


def _deploy_watching_staging(daemon: Daemon, model: str, release: str) -> tuple[Any, int]:
    with PeakUsage(daemon.staging) as usage:
        response = daemon.deploy(model, release)
    assert usage.samples > 1
    log.info(
        "deploy of %s: staging peaked at %d bytes (%d samples)", release, usage.peak, usage.samples
    )
    return response, usage.peak


def test_a_release_larger_than_the_free_disk_is_refused_before_staging_holds_any_of_it(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    daemon = daemons(store)
    assert daemon.deploy(model_name, "r1").status_code == 200
    huge = too_big_for(daemon.staging)
    listed = write_scale_release(store, model_name, "r2", k=2.0)
    add_sparse_file(listed, "1/weights.bin", huge, listed=True)
    unlisted = write_scale_release(store, model_name, "r3", k=3.0)
    add_sparse_file(unlisted, "1/weights.bin", huge, listed=False)

    response, peak = _deploy_watching_staging(daemon, model_name, "r2")

    assert response.status_code == 507, response.text
    error = response.json()["error"]
    assert error["code"] == "insufficient_disk"
    assert "free" in error["message"]
    figures = _fetch_step(response)
    assert figures["bytes_needed"] > huge
    assert figures["bytes_free"] < huge
    # r1's config.pbtxt is r2's too: the content cache links it in, and it costs nothing.
    assert figures["bytes_cached"] == (listed / "config.pbtxt").stat().st_size
    assert figures["bytes_needed"] == figures["bytes_total"] - figures["bytes_cached"]
    assert peak < FEW_MB, f"staging held {peak} bytes"
    assert infer_once(triton.grpc_url, model_name) == 1.0

    response, peak = _deploy_watching_staging(daemon, model_name, "r3")

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_release"
    assert "not listed in SHA256SUMS: 1/weights.bin" in error["message"]
    assert peak < FEW_MB, f"staging held {peak} bytes"
    assert daemon.staging_leftovers() == []
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "r1"


def test_a_release_over_max_release_bytes_is_refused_and_the_serving_one_keeps_serving(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)
    big = write_scale_release(store, model_name, "r2", k=2.0, checksums=False)
    (big / "1" / "weights.bin").write_bytes(b"\x01" * MIB)
    write_sha256sums(big)
    daemon = daemons(store, config=f"store:\n  max_release_bytes: {MIB // 2}\n")
    assert daemon.deploy(model_name, "r1").status_code == 200

    response, peak = _deploy_watching_staging(daemon, model_name, "r2")

    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "release_too_large"
    assert "over store.max_release_bytes (512.0 KiB)" in error["message"]
    assert _fetch_step(response)["max_release_bytes"] == MIB // 2
    assert peak < MIB  # the 1 MiB weights never reached staging
    assert infer_once(triton.grpc_url, model_name) == 1.0
