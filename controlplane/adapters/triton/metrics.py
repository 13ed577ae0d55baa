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
        samples = await self._scrape(PENDING)
        if samples is None:
            return None
        return int(sum(value for labels, value in samples if labels.get("model") == model))

    async def gpu_utilization(self) -> dict[str, float] | None:
        """Utilisation per GPU (``gpu_uuid`` -> ratio); None when the scrape failed.

        An empty dict means Triton answered but exports no GPU (no NVML, or CPU only).
        """
        samples = await self._scrape(GPU_UTILIZATION)
        if samples is None:
            return None
        return {labels.get("gpu_uuid", ""): value for labels, value in samples}

    async def _scrape(self, metric: str) -> list[tuple[dict[str, str], float]] | None:
        """(labels, value) of every sample of ``metric``; None when the scrape failed."""
        try:
            response = await self._client.get(self._url)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return [
            (dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(response.text)
            if family.name == metric
            for sample in family.samples
        ]

    async def close(self) -> None:
        await self._client.aclose()
