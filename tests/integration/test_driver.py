"""The Triton driver against the real server: every call it makes, and how errors map."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from controlplane.adapters.triton.driver import TritonDriver
from controlplane.adapters.triton.launcher import RunningTriton, free_port
from controlplane.domain.errors import TritonLoadFailed, TritonUnavailable
from tests.conftest import TritonFactory
from tests.support.models import write_scale_release

pytestmark = pytest.mark.triton
OUTAGE = 20.0  # seconds Triton stays down: long enough for gRPC's default backoff to grow


def _place(store: Path, model: str, release: str, repository: Path) -> None:
    """Copy a release into the repository as `model` (what staging does, minus its checks)."""
    shutil.copytree(store / model / release, repository / model)


def test_load_config_metadata_infer_unload(
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
            metadata = await driver.model_metadata(model_name)
            assert [i["name"] for i in metadata["inputs"]] == ["INPUT0"]
            outputs = await driver.infer(
                model_name, {"INPUT0": np.array([1.0, 2.0], dtype=np.float32)}
            )
            assert outputs["OUTPUT0"].tolist() == [3.0, 6.0]
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


def test_a_triton_back_after_a_long_outage_is_seen_at_once(
    own_triton: TritonFactory, tmp_path: Path
) -> None:
    """gRPC backs off longer and longer between reconnects to a server that went away (after
    20 s down, a restarted Triton was seen 6.6 s late with its defaults, and up to 2 min after
    longer outages); the driver asks for reconnects at least twice a second."""
    repository = tmp_path / "repository"
    repository.mkdir()
    first = own_triton(repository)

    async def scenario() -> float:
        driver = TritonDriver(first.grpc_url, call_timeout=2.0)
        try:
            assert await driver.is_live()
            os.killpg(first.process.pid, signal.SIGKILL)
            first.process.wait()
            loop = asyncio.get_running_loop()
            down_until = loop.time() + OUTAGE
            while loop.time() < down_until:  # the daemon's reconcile loop asks meanwhile
                assert not await driver.is_live()
                await asyncio.sleep(0.5)
            await asyncio.to_thread(own_triton, repository, ports=first.ports)
            back = loop.time()
            while not await driver.is_live():
                assert loop.time() - back < 10, "Triton is back but still not seen"
                await asyncio.sleep(0.05)
            return loop.time() - back
        finally:
            await driver.close()

    assert asyncio.run(scenario()) < 1.5
