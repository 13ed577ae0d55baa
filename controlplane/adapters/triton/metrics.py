"""Reading Triton's Prometheus endpoint: pending requests per model (for the drain).

A scrape that fails answers None ("unknown"): the caller decides how to wait, never this.
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

PENDING = "nv_inference_pending_request_count"


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

    async def close(self) -> None:
        await self._client.aclose()
