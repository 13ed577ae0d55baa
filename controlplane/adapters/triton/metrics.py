"""Reading Triton's Prometheus endpoint: pending requests per model (for the drain) and GPU
utilisation (for the overload watcher).

A scrape that fails answers None ("unknown"): the caller decides what that means, never this.
``nv_gpu_utilization`` is a ratio in [0, 1], one series per ``gpu_uuid``.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

PENDING = "nv_inference_pending_request_count"
GPU_UTILIZATION = "nv_gpu_utilization"


class TritonMetrics:
    def __init__(self, url: str, *, timeout: float = 2.0) -> None:
        self._url = url
        self._client = httpx.AsyncClient(timeout=timeout, trust_env=False)

    async def pending_requests(self, model: str) -> int | None:
        try:
            response = await self._client.get(self._url)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        total = 0.0
        for family in text_string_to_metric_families(response.text):
            if family.name != PENDING:
                continue
            for sample in family.samples:
                if sample.labels.get("model") == model:
                    total += sample.value
        return int(total)

    async def gpu_utilization(self) -> dict[str, float] | None:
        """Utilisation per GPU (``gpu_uuid`` -> ratio); None when the scrape failed.

        An empty dict means Triton answered but exports no GPU (no NVML, or CPU only).
        """
        try:
            response = await self._client.get(self._url)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        per_gpu: dict[str, float] = {}
        for family in text_string_to_metric_families(response.text):
            if family.name != GPU_UTILIZATION:
                continue
            for sample in family.samples:
                per_gpu[sample.labels.get("gpu_uuid", "")] = float(sample.value)
        return per_gpu

    async def close(self) -> None:
        await self._client.aclose()
