"""The Triton driver against the real server: every call it makes, and how errors map."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from controlplane.adapters.triton.driver import TritonDriver
from controlplane.adapters.triton.tensors import Array
from controlplane.domain.errors import TritonLoadFailed, TritonUnavailable
from controlplane.domain.smoke import parse_smoke
from devtools.launcher import RunningTriton, free_port
from tests.conftest import TritonFactory
from tests.support.chaos import kill_triton
from tests.support.models import write_scale_release

pytestmark = pytest.mark.triton
OUTAGE = 20.0  # gRPC's default back-off: attempts near 16 s and 26 s into the outage


def _place(store: Path, model: str, release: str, repository: Path) -> None:
    """Copy a release into the repository as `model` (what staging does, minus its checks)."""
    shutil.copytree(store / model / release, repository / model)


def test_load_config_signature_infer_unload(
    triton: RunningTriton, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=3.0)
    _place(store, model_name, "r1", triton.repository)

    async def scenario() -> None:
        driver = TritonDriver(triton.grpc_url)
        try:
            await driver.load(model_name)
            states = {e.name: e.state for e in await driver.index()}
            assert states[model_name] == "READY"
            config = await driver.model_config(model_name)
            assert config["backend"] == "python"
            signature = await driver.signature(model_name)
            assert [t.name for t in signature.inputs] == ["INPUT0"]
            outputs = await driver.infer(model_name, {"INPUT0": Array("FP32", (2,), (1.0, 2.0))})
            assert outputs["OUTPUT0"].values == (3.0, 6.0)
            await driver.unload(model_name)
            await driver.wait_unavailable(model_name, timeout=30)
            after = {e.name: e for e in await driver.index()}
            assert after[model_name].state == "UNAVAILABLE"
        finally:
            await driver.close()
            shutil.rmtree(triton.repository / model_name)

    asyncio.run(scenario())


def test_a_failing_load_carries_tritons_reason(
    triton: RunningTriton, store: Path, model_name: str
) -> None:
    write_scale_release(store, model_name, "r1", k=1.0, fail_init=True)
    _place(store, model_name, "r1", triton.repository)

    async def scenario() -> None:
        driver = TritonDriver(triton.grpc_url)
        try:
            with pytest.raises(TritonLoadFailed, match="initialize failed on purpose"):
                await driver.load(model_name)
        finally:
            await driver.unload(model_name)
            await driver.close()
            shutil.rmtree(triton.repository / model_name)

    asyncio.run(scenario())


def test_an_unreachable_triton_is_transient_and_retried_a_bounded_number_of_times() -> None:
    async def scenario() -> None:
        driver = TritonDriver(f"127.0.0.1:{free_port()}", call_timeout=2.0, attempts=2)
        try:
            assert await driver.is_live() is False
            with pytest.raises(TritonUnavailable) as caught:
                await driver.index()
            assert caught.value.retryable
        finally:
            await driver.close()

    asyncio.run(scenario())


def test_a_smoke_inference_that_cannot_reach_triton_is_transient_not_a_bad_release() -> None:
    # A Triton restart during preflight says nothing about the release: reported as
    # preflight_failed (permanent, 422), the watcher would never retry an auto-deployed release.
    sample = parse_smoke('{"inputs": {"INPUT0": {"datatype": "FP32", "shape": [1], "data": [1]}}}')

    async def scenario() -> None:
        driver = TritonDriver(f"127.0.0.1:{free_port()}", call_timeout=2.0, attempts=2)
        try:
            with pytest.raises(TritonUnavailable) as caught:
                await driver.smoke("m", sample)
            assert caught.value.code == "triton_unavailable"
        finally:
            await driver.close()

    asyncio.run(scenario())


def test_a_restarted_triton_is_seen_live_within_a_second_or_so_whatever_the_outage(
    own_triton: TritonFactory, tmp_path: Path
) -> None:
    # gRPC's reconnect back-off grows to 120 s by default: after a 30 s outage the daemon saw
    # Triton live again ~17 s late, and repaired nothing meanwhile. Found by the fault campaign.
    (tmp_path / "repository").mkdir()
    first = own_triton(tmp_path / "repository")

    async def scenario() -> float:
        driver = TritonDriver(first.grpc_url, call_timeout=2.0)
        try:
            assert await driver.is_live()
            kill_triton(first)
            loop = asyncio.get_running_loop()
            down_until = loop.time() + OUTAGE
            while loop.time() < down_until:  # as the reconcile loop does while Triton is down
                assert not await driver.is_live()
                await asyncio.sleep(0.5)
            await asyncio.to_thread(own_triton, tmp_path / "repository", ports=first.ports)
            live = loop.time()
            while not await driver.is_live():
                assert loop.time() - live < 30, "Triton was never seen live again"
                await asyncio.sleep(0.05)
            return loop.time() - live
        finally:
            await driver.close()

    assert asyncio.run(scenario()) < 1.5
