"""Reading GPU utilisation over HTTP, from a test exporter and from the real Triton (CPU)."""

from __future__ import annotations

import asyncio

import pytest

from controlplane.adapters.triton.metrics import TritonMetrics
from devtools.launcher import RunningTriton
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


TRITON_ALSO = """\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 41
# HELP nv_gpu_utilization_peak A family whose name starts like the one read
# TYPE nv_gpu_utilization_peak gauge
nv_gpu_utilization_peak{gpu_uuid="GPU-a"} 1
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="m",version="1"} 2
nv_inference_pending_request_count{model="other",version="1"} 5
"""


def test_only_the_families_asked_for_are_read_whatever_else_triton_exports() -> None:
    async def scenario(exporter: GpuExporter) -> None:
        metrics = TritonMetrics(exporter.url)
        try:
            exporter.set(**{"GPU-a": 0.5})
            exporter.set_memory(**{"GPU-a": (16, 4)})
            exporter.extra = TRITON_ALSO
            assert await metrics.gpu_utilization() == {"GPU-a": 0.5}
            assert await metrics.pending_requests("m") == 2
            memory = await metrics.gpu_memory()
            assert memory is not None
            assert (memory["GPU-a"].total, memory["GPU-a"].used) == (16, 4)
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
