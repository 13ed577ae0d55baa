"""The load-balancer harness against the real haproxy and real Tritons: gRPC through haproxy
reaches every member, a member whose ``/readyz`` fails leaves rotation with no call failing,
and the GPU stand-in's memory follows what a Triton has loaded.

Each member's Triton serves one model under the same name with its own ``k``, so an answer
tells which member served it. The members' ``/readyz`` is a stand-in the test toggles (the
daemon's own comes with the rolling-update tests that use this harness).
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from controlplane.adapters.triton.metrics import TritonMetrics
from controlplane.ports import GpuMemory
from devtools.launcher import RunningTriton
from tests.conftest import TritonFactory
from tests.support.gpu_exporter import GIB, GpuExporter
from tests.support.grpc_load import LoadClient
from tests.support.haproxy import HAProxy, Member, RotationRecorder
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.triton_pool import unique_model

pytestmark = pytest.mark.triton

# fall 1: DOWN at the first check after /readyz fails, at most 300 ms later (0.3 s measured);
# the rest is slack for a loaded machine.
DOWN_WITHIN = 2.0


class ReadyzStandIn:
    """``GET /readyz`` answering ``status`` (200 or 503), as a member's daemon would."""

    def __init__(self) -> None:
        self.status = 200
        self.checks = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stand_in.checks += 1
                code = stand_in.status if self.path == "/readyz" else 404
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@dataclass
class Fleet:
    """Two members ("a" answers 1x, "b" 2x) behind haproxy."""

    model: str
    haproxy: HAProxy
    readyz: dict[str, ReadyzStandIn]


def _install(triton: RunningTriton, name: str, k: float, scratch: Path) -> None:
    """Put a scale model ``name`` (answers k x INPUT0) into Triton's repository and load it."""
    release = write_scale_release(scratch, name, f"k{k}", k=k, checksums=False)
    shutil.copytree(release, triton.repository / name)
    _load(triton, name)


def _load(triton: RunningTriton, name: str) -> None:
    response = httpx.post(
        f"{triton.http_url}/v2/repository/models/{name}/load", json={}, timeout=60
    )
    assert response.status_code == 200, response.text


def _unload(triton: RunningTriton, name: str) -> None:
    response = httpx.post(
        f"{triton.http_url}/v2/repository/models/{name}/unload", json={}, timeout=60
    )
    assert response.status_code == 200, response.text


@pytest.fixture
def fleet(pooled_tritons: Callable[[Path], RunningTriton], tmp_path: Path) -> Iterator[Fleet]:
    model = unique_model("lb")
    tritons = {"a": pooled_tritons(tmp_path), "b": pooled_tritons(tmp_path)}
    with ThreadPoolExecutor(2) as pool:
        loads = [
            pool.submit(_install, triton, model, k, tmp_path / f"store-{name}")
            for (name, triton), k in zip(tritons.items(), (1.0, 2.0), strict=True)
        ]
    for load in loads:
        load.result()
    readyz = {name: ReadyzStandIn() for name in tritons}
    members = [Member(name, triton.grpc_url, readyz[name].port) for name, triton in tritons.items()]
    try:
        with HAProxy(tmp_path / "haproxy", members) as haproxy:
            haproxy.wait_until_up()
            yield Fleet(model, haproxy, readyz)
    finally:
        for stand_in in readyz.values():
            stand_in.close()


def test_grpc_through_haproxy_reaches_both_members_and_no_call_fails(fleet: Fleet) -> None:
    with LoadClient(fleet.haproxy.frontend_url, fleet.model, callers=3) as load:
        load.wait_for_answers(60)
    summary = load.stop()

    assert summary.failures == (), "\n".join(str(f) for f in summary.failures)
    assert set(summary.answers) == {1.0, 2.0}, summary.answers
    assert fleet.haproxy.show_stat() == {"a": "UP", "b": "UP"}


def test_a_member_whose_readyz_fails_leaves_rotation_and_comes_back_with_no_call_failing(
    fleet: Fleet,
) -> None:
    haproxy = fleet.haproxy
    with (
        RotationRecorder(haproxy) as recorder,
        LoadClient(haproxy.frontend_url, fleet.model, callers=3) as load,
    ):
        load.wait_for_answers(30)

        fleet.readyz["b"].status = 503
        haproxy.wait_for_status("b", "DOWN", timeout=DOWN_WITHIN)
        out_at = time.monotonic()
        load.wait_for_answers(60, sent_after=out_at)
        served_while_out = load.answers_sent_after(out_at)
        # Seen by the recorder before b comes back, so its count does not hang on a sample.
        eventually(lambda: bool(recorder.out_of_rotation("b")), 5, "the recorder seeing b out")

        fleet.readyz["b"].status = 200
        haproxy.wait_until_up(["b"], timeout=5)
        back_at = time.monotonic()
        eventually(lambda: load.answers_sent_after(back_at)[2.0] >= 10, 10, "answers from b again")
        eventually(
            lambda: all(s.end is not None for s in recorder.out_of_rotation("b")),
            5,
            "the recorder seeing b back",
        )
    summary = load.stop()

    assert set(served_while_out) == {1.0}, served_while_out
    assert summary.failures == (), "\n".join(str(f) for f in summary.failures)
    assert recorder.left_rotation("b") == 1, recorder.timeline
    assert recorder.left_rotation("a") == 0, recorder.timeline
    assert recorder.max_out_at_once == 1, recorder.timeline
    [stretch] = recorder.out_of_rotation("b")
    assert stretch.statuses[0] == "DOWN", recorder.timeline


# --- the GPU stand-in follows a Triton ---------------------------------------------------------


def _gpu_memory(exporter: GpuExporter) -> dict[str, GpuMemory] | None:
    """The figures as the daemon reads them (its own parser of Triton's metrics)."""

    async def read() -> dict[str, GpuMemory] | None:
        metrics = TritonMetrics(exporter.url)
        try:
            return await metrics.gpu_memory()
        finally:
            await metrics.close()

    return asyncio.run(read())


def _used(exporter: GpuExporter) -> int:
    memory = _gpu_memory(exporter)
    assert memory is not None
    return memory["GPU-0"].used


def _write_alias(triton: RunningTriton, alias: str, slot: str) -> None:
    """A one-step ensemble ``alias`` -> ``slot``, as the daemon's blue-green alias is."""
    (triton.repository / alias / "1").mkdir(parents=True)
    (triton.repository / alias / "config.pbtxt").write_text(
        f'name: "{alias}"\nplatform: "ensemble"\nmax_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        "ensemble_scheduling { step [ {\n"
        f'  model_name: "{slot}" model_version: -1\n'
        '  input_map { key: "INPUT0" value: "INPUT0" }\n'
        '  output_map { key: "OUTPUT0" value: "OUTPUT0" }\n'
        "} ] }\n",
        encoding="utf-8",
    )


def test_gpu_memory_follows_the_models_triton_has_loaded_and_can_leak(
    pooled_tritons: Callable[[Path], RunningTriton], tmp_path: Path
) -> None:
    triton = pooled_tritons(tmp_path)
    model = unique_model("gpu")
    slot = f"{model}__blue"
    base, per_model = 1 * GIB, 9 * GIB
    with GpuExporter() as exporter:
        exporter.follow(triton.http_url, base_bytes=base, per_model_bytes=per_model)
        assert _gpu_memory(exporter) == {"GPU-0": GpuMemory(total=16 * GIB, used=base)}

        _install(triton, slot, 1.0, tmp_path / "store")
        _write_alias(triton, model, slot)
        _load(triton, model)
        assert _used(exporter) == base + per_model  # the ensemble alias uses none
        assert exporter.counted_models == {slot}

        _unload(triton, model)
        _unload(triton, slot)
        eventually(lambda: _used(exporter) == base, 10, "the slot's memory given back")

        _load(triton, slot)
        eventually(lambda: _used(exporter) == base + per_model, 10, "the slot's memory taken")
        exporter.keep_unloaded = True
        _unload(triton, slot)
        eventually(
            lambda: (
                not httpx.post(
                    f"{triton.http_url}/v2/repository/index", json={"ready": True}
                ).json()
            ),
            10,
            "the slot unloaded",
        )
        assert _used(exporter) == base + per_model  # a leaking GPU keeps it

        exporter.release_kept()
        assert _used(exporter) == base


def test_gpu_memory_stays_at_the_last_figures_when_triton_stops_answering(
    own_triton: TritonFactory, tmp_path: Path
) -> None:
    (tmp_path / "repository").mkdir()
    triton = own_triton(tmp_path / "repository")
    slot = unique_model("gpu") + "__green"
    _install(triton, slot, 1.0, tmp_path / "store")
    with GpuExporter() as exporter:
        exporter.follow(triton.http_url, counts=lambda name: "__" in name)
        assert _used(exporter) == 9 * GIB

        triton.stop()

        assert _gpu_memory(exporter) == {"GPU-0": GpuMemory(total=16 * GIB, used=9 * GIB)}
