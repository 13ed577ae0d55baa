"""Triton's memory as ``GET /v1/memory`` shows it: a sample taken after a swap, and the leak
trend over recent samples."""

from __future__ import annotations

from typing import Any

from controlplane.api.schemas.timestamps import iso
from controlplane.domain.memory import LeakTrend, MemorySample


def memory_sample_json(sample: MemorySample) -> dict[str, Any]:
    return {
        "at": iso(sample.at),
        "operation_id": sample.operation_id,
        "model": sample.model,
        "host_bytes": sample.host_bytes,
        "gpu_bytes": sample.gpu_bytes,
    }


def leak_trend_json(trend: LeakTrend) -> dict[str, Any]:
    return {
        "kind": trend.kind,
        "samples": trend.samples,
        "growth_bytes": trend.growth,
        "leak_suspected": trend.flagged,
    }
