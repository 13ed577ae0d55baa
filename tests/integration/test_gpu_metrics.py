"""Reading GPU utilisation over HTTP, from a test exporter and from the real Triton (CPU)."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.adapters.triton.launcher import RunningTriton
from controlplane.adapters.triton.metrics import TritonMetrics
from tests.support.gpu_exporter import GpuExporter


def test_gpu_utilization_per_gpu_and_a_failed_scrape() -> None:
    async def scenario(exporter: GpuExporter) -> None:
        metrics = TritonMetrics(exporter.url)
        try:
            exporter.set(**{"GPU-a": 0.99, "GPU-b": 0.25})
            assert await metrics.gpu_utilization() == {"GPU-a": 0.99, "GPU-b": 0.25}
            exporter.failing = True
            assert await metrics.gpu_utilization() is None
        finally:
            await metrics.close()

    with GpuExporter() as exporter:
        asyncio.run(scenario(exporter))


@pytest.mark.triton
def test_a_triton_without_gpus_exports_none(triton: RunningTriton) -> None:
    async def scenario() -> None:
        metrics = TritonMetrics(triton.metrics_url)
        try:
            assert await metrics.gpu_utilization() == {}
        finally:
            await metrics.close()

    asyncio.run(scenario())
