"""The headroom check against the real daemon and Triton, with GPU memory from a test exporter.

The release leaves its instance kind to Triton (KIND_AUTO: a GPU when there is one), so the GPU
figures apply to it; on this CPU-only Triton it then loads on CPU when forced.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.gpu_exporter import GpuExporter
from tests.support.inference import infer_once
from tests.support.models import write_scale_release, write_sha256sums

pytestmark = pytest.mark.triton

GIB = 1024**3
MIB = 1024**2


def _release_needing(store: Path, model: str, release: str, hint: int) -> None:
    release_dir = write_scale_release(store, model, release, k=3.0)
    config = release_dir / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace(
        "instance_group [ { kind: KIND_CPU count: 1 } ]", "instance_group [ { count: 1 } ]"
    )
    text += (
        'parameters { key: "controlplane.memory_hint_bytes" '
        f'value {{ string_value: "{hint}" }} }}\n'
    )
    config.write_text(text, encoding="utf-8")
    (release_dir / "SHA256SUMS").unlink()
    write_sha256sums(release_dir)


def test_a_load_without_room_is_refused_and_force_loads_it(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    _release_needing(store, model_name, "r1", hint=2 * GIB)
    with GpuExporter() as exporter:
        exporter.set_memory(**{"GPU-a": (16 * GIB, 15 * GIB), "GPU-b": (16 * GIB, 4 * GIB)})
        daemon = daemons(store, config=f"memory:\n  gpu_metrics_url: {exporter.url}\n")

        refused = daemon.deploy(model_name, "r1")

        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "insufficient_memory"
        assert (
            "needs about 2.0 GiB (memory_hint) but GPU GPU-a has 1.0 GiB free" in (error["message"])
        )
        assert "force" in error["message"]
        steps = refused.json()["operation"]["steps"]
        assert [s["name"] for s in steps][-1] == "headroom"
        assert not (daemon.repository / f"{model_name}__blue").exists()
        assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] is None

        forced = daemon.post(
            f"/v1/models/{model_name}/deploy", {"release": "r1", "wait": True, "force": True}
        )

    assert forced.status_code == 200, forced.text
    headroom = next(s for s in forced.json()["operation"]["steps"] if s["name"] == "headroom")
    assert headroom["detail"]["forced"] is True
    assert headroom["detail"]["need_bytes"] == 2 * GIB
    assert headroom["detail"]["gpu_free_bytes"] == GIB
    assert infer_once(triton.grpc_url, model_name) == 3.0


def test_a_cpu_model_is_checked_against_the_host_only(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0)  # KIND_CPU, a few KiB
    with GpuExporter() as exporter:
        exporter.set_memory(gpu0=(16 * GIB, 16 * GIB))  # no GPU memory free at all
        daemon = daemons(store, config=f"memory:\n  gpu_metrics_url: {exporter.url}\n")
        response = daemon.deploy(model_name, "r1")

    assert response.status_code == 200, response.text
    headroom = next(s for s in response.json()["operation"]["steps"] if s["name"] == "headroom")
    assert headroom["detail"]["forced"] is False
    assert headroom["detail"]["host_available_bytes"] > 0
    assert infer_once(triton.grpc_url, model_name) == 1.0


def test_a_python_model_that_would_leave_too_little_dev_shm_is_refused(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    release_dir = write_scale_release(store, model_name, "r1", k=2.0)
    config = release_dir / "config.pbtxt"
    text = config.read_text(encoding="utf-8").replace("count: 1", "count: 2")
    config.write_text(text, encoding="utf-8")
    (release_dir / "SHA256SUMS").unlink()
    write_sha256sums(release_dir)
    # A margin as large as /dev/shm itself: no load can leave that much free.
    shm = os.statvfs("/dev/shm")
    margin = shm.f_blocks * shm.f_frsize
    daemon = daemons(store, config=f"memory:\n  shm_margin_bytes: {margin}\n")

    refused = daemon.deploy(model_name, "r1")

    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "insufficient_memory"
    assert (
        "the load needs about 2.0 MiB of /dev/shm (2 instances of the python backend x 1.0 MiB) "
        "but /dev/shm has "
    ) in error["message"]
    assert "margin (memory.shm_margin_bytes)" in error["message"]
    headroom = refused.json()["operation"]["steps"][-1]
    assert headroom["name"] == "headroom"
    assert headroom["detail"]["shm_need_bytes"] == 2 * MIB
    assert headroom["detail"]["shm_margin_bytes"] == margin
    assert 0 < headroom["detail"]["shm_free_bytes"] < margin
    assert not (daemon.repository / f"{model_name}__blue").exists()

    daemon.stop()
    normal = daemons(store)  # the default margin (32 MiB) leaves room on this host
    deployed = normal.deploy(model_name, "r1")
    assert deployed.status_code == 200, deployed.text
    step = next(s for s in deployed.json()["operation"]["steps"] if s["name"] == "headroom")
    assert step["detail"]["shm_need_bytes"] == 2 * MIB
    assert infer_once(triton.grpc_url, model_name) == 2.0
