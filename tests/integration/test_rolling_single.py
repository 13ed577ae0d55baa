"""``auto`` and ``rolling`` on one daemon (no fleet), against the real Triton, with the GPU's
memory from a stand-in exporter (the one fake these machines need).

The releases leave their instance kind to Triton (KIND_AUTO), so the GPU figures apply to them,
and say how much they need (``controlplane.memory_hint_bytes``): 4 GiB fits twice in a 16 GiB
GPU, 9 GiB fits once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.integration.conftest import DaemonFactory
from tests.support.gpu_exporter import GpuExporter
from tests.support.inference import infer_once
from tests.support.polling import eventually
from tests.support.rolling_fleet import write_big_release

pytestmark = pytest.mark.triton

GIB = 1024**3
GPU = "GPU-0"


def _config(exporter: GpuExporter, model: str, **policy: str) -> str:
    lines = "".join(f"    {key}: {value}\n" for key, value in policy.items())
    return (
        f"memory:\n  gpu_metrics_url: {exporter.url}\n  return_seconds: 3\n"
        f"models:\n  {model}:\n    rollout: {{unready_seconds: 0.5}}\n{lines}"
    )


def _steps(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["name"]: step for step in answer["operation"]["steps"]}


def test_auto_deploys_a_release_that_fits_twice_blue_green(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_big_release(store, model_name, "r1", k=1.0, hint=4 * GIB)
    write_big_release(store, model_name, "r2", k=2.0, hint=4 * GIB)
    with GpuExporter() as exporter:
        exporter.set_memory(**{GPU: (16 * GIB, 4 * GIB)})  # r1 loaded: 12 GiB free
        daemon = daemons(store, config=_config(exporter, model_name))
        assert daemon.deploy(model_name, "r1").status_code == 200
        answer = daemon.deploy(model_name, "r2")

    assert answer.status_code == 200, answer.text
    steps = _steps(answer.json())
    assert steps["headroom"]["detail"]["strategy"] == "blue-green"
    assert "drain" not in steps  # beside the serving one: nothing left rotation
    assert "turn" not in steps
    assert infer_once(triton.grpc_url, model_name) == 2.0
    assert daemon.get("/readyz").status_code == 200


def test_a_fleet_of_one_refuses_an_update_that_would_be_an_outage(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_big_release(store, model_name, "r1", k=1.0, hint=9 * GIB)
    write_big_release(store, model_name, "r2", k=2.0, hint=9 * GIB)
    with GpuExporter() as exporter:
        exporter.set_memory(**{GPU: (16 * GIB, 0)})
        daemon = daemons(store, config=_config(exporter, model_name))
        assert daemon.deploy(model_name, "r1").status_code == 200
        exporter.set_memory(**{GPU: (16 * GIB, 9 * GIB)})  # r1 holds 9 GiB: 7 GiB free
        refused = daemon.deploy(model_name, "r2")

    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "would_be_an_outage"
    assert "no other member of the fleet serves it" in error["message"]
    assert "allow_downtime: true" in error["message"]
    steps = _steps(refused.json())
    assert steps["headroom"]["detail"]["strategy"] == "rolling"
    assert "unload" not in steps  # refused before anything left
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert daemon.get("/readyz").status_code == 200


def test_a_fleet_of_one_with_allow_downtime_rolls_and_records_the_downtime(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    write_big_release(store, model_name, "r1", k=1.0, hint=9 * GIB)
    write_big_release(store, model_name, "r2", k=2.0, hint=9 * GIB)
    with GpuExporter() as exporter:
        # 9 GiB a loaded slot of the model, of 16: r2 fits only once r1 is unloaded.
        exporter.follow(triton.http_url, counts=lambda name: name.startswith(f"{model_name}__"))
        config = _config(exporter, model_name, allow_downtime="true")
        daemon = daemons(store, config=config)
        assert daemon.deploy(model_name, "r1").status_code == 200
        answer = daemon.deploy(model_name, "r2")

    assert answer.status_code == 200, answer.text
    steps = _steps(answer.json())
    # The first headroom step chose (the second, after the unload, found room for the load).
    chose = next(s for s in answer.json()["operation"]["steps"] if s["name"] == "headroom")
    assert chose["detail"]["strategy"] == "rolling"
    assert "allow_downtime" in chose["detail"]["downtime"]
    names = [step["name"] for step in answer.json()["operation"]["steps"]]
    assert names.index("drain") < names.index("unload") < names.index("load")
    assert names.index("load") < names.index("switch") < names.index("record")
    downtime = steps["record"]["detail"]["downtime_seconds"]
    assert 0 < downtime <= steps["record"]["detail"]["out_of_rotation_seconds"]
    assert infer_once(triton.grpc_url, model_name) == 2.0
    assert daemon.get("/readyz").status_code == 200


def test_a_rolling_update_runs_the_stress_test_and_a_refused_release_gives_way_to_the_old(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    """Rolling (allow_downtime, a fleet of one): the new release, alone on the GPU, is
    stress-tested before the switch; one that errs under load is refused and the release it
    replaced is loaded back and serves."""
    write_big_release(store, model_name, "r1", k=1.0, hint=9 * GIB)
    write_big_release(store, model_name, "r2", k=2.0, hint=9 * GIB, fail_every=3)
    with GpuExporter() as exporter:
        exporter.follow(triton.http_url, counts=lambda name: name.startswith(f"{model_name}__"))
        stress = "{stress: {enabled: true, seconds: 1.5, concurrency: 4}}"
        config = _config(exporter, model_name, allow_downtime="true", preflight=stress)
        daemon = daemons(store, config=config)
        assert daemon.deploy(model_name, "r1").status_code == 200
        refused = daemon.deploy(model_name, "r2")

    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["code"] == "preflight_failed"
    assert "failed on purpose" in refused.json()["error"]["message"]
    names = [step["name"] for step in refused.json()["operation"]["steps"]]
    assert names.index("unload") < names.index("load") < names.index("stress")
    assert names.index("stress") < names.index("restore")
    assert "switch" not in names
    assert infer_once(triton.grpc_url, model_name) == 1.0
    assert daemon.get(f"/v1/models/{model_name}").json()["active_release"] == "r1"
    assert daemon.get("/readyz").status_code == 200


def test_memory_that_does_not_come_back_stops_the_update_before_any_load(
    daemons: DaemonFactory, store: Path, model_name: str, triton: RunningTriton
) -> None:
    """A GPU that keeps the unloaded release's memory: no load (it would run out of memory),
    memory_not_returned with the figures, the member out of rotation and left alone by the
    reconcile loop; a later deploy, once the memory is back, serves again."""
    write_big_release(store, model_name, "r1", k=1.0, hint=9 * GIB)
    write_big_release(store, model_name, "r2", k=2.0, hint=9 * GIB)
    with GpuExporter() as exporter:
        exporter.set_memory(**{GPU: (16 * GIB, 0)})
        config = _config(exporter, model_name, allow_downtime="true", strategy="rolling")
        daemon = daemons(store, config=config)
        assert daemon.deploy(model_name, "r1").status_code == 200
        exporter.set_memory(**{GPU: (16 * GIB, 9 * GIB)})  # and it stays there

        refused = daemon.deploy(model_name, "r2")

        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "memory_not_returned"
        assert "the GPU memory r1 held did not come back within 3 s" in error["message"]
        assert f"GPU {GPU} used 9.0 GiB before the unload and 9.0 GiB now" in error["message"]
        assert "needs about 9.0 GiB (memory_hint)" in error["message"]
        steps = _steps(refused.json())
        assert [name for name in steps][-3:] == ["drain", "unload", "memory"]
        assert "load" not in steps
        ready = daemon.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["code"] == "out_of_rotation"
        assert "memory_not_returned" in ready.json()["error"]["message"]
        # The reconcile loop does not load r1 back either: it would be the same load.
        eventually(
            lambda: (
                "not repaired: memory_not_returned"
                in str(daemon.get(f"/v1/models/{model_name}").json()["drift"])
            ),
            30,
            "a reconcile pass that leaves the held model alone",
        )
        index = {m["name"]: m.get("state") for m in _index(triton)}
        assert index.get(f"{model_name}__blue") != "READY", index

        exporter.set_memory(**{GPU: (16 * GIB, 0)})  # Triton restarted, say: memory is back
        again = daemon.deploy(model_name, "r2")

    assert again.status_code == 200, again.text
    assert infer_once(triton.grpc_url, model_name) == 2.0
    assert daemon.get("/readyz").status_code == 200


def _index(triton: RunningTriton) -> list[dict[str, str]]:
    answer = httpx.post(f"{triton.http_url}/v2/repository/index", json={}, timeout=10)
    answer.raise_for_status()
    found: list[dict[str, str]] = answer.json()
    return found
