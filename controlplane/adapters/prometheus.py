"""Reading GPU utilisation from a Prometheus instant query, for the overload watcher.

Owns every call to Prometheus's HTTP API (``GET /api/v1/query``). The watcher can read the same
numbers from Triton's ``/metrics`` (:mod:`controlplane.adapters.triton.metrics`); this source is
for a fleet where Prometheus already scrapes Triton and the query may aggregate or smooth.

Invariant: an answer that cannot be trusted is None ("unknown"), never a number or ``{}``, so
the caller holds instead of acting on it. Unknown means: the request failed, the status is not
2xx, the body's ``status`` is not ``success``, the result is neither a vector nor a scalar, or
a value is not a finite float (NaN, ±Inf). An empty vector is ``{}``: Prometheus answered, and
no series matched.

Series are keyed by their ``gpu_uuid`` label; a series without one (an aggregate such as
``avg(...)``), or whose ``gpu_uuid`` another series shares, by its labels rendered as
``{a="1",b="2"}`` (``""`` when it has none). A scalar result is ``{"": value}``.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

log = logging.getLogger(__name__)

GPU_UUID = "gpu_uuid"
_ERROR_CHARS = 200


class _Unknown(Exception):
    """Why an answer cannot be trusted; becomes None for the caller and one warning."""


class PrometheusQuery:
    def __init__(self, base_url: str, query: str, *, timeout: float = 2.0) -> None:
        self._endpoint = base_url.rstrip("/") + "/api/v1/query"
        self._query = query
        self._where = _without_credentials(base_url)
        self._client = httpx.AsyncClient(timeout=timeout, trust_env=False)
        # The reason last warned about: a failure that persists is logged once, not per poll.
        self._last_reason: str | None = None

    async def gpu_utilization(self) -> dict[str, float] | None:
        """The query's value per series (see the module docstring); None when unknown."""
        try:
            values = _values(await self._answer())
        except _Unknown as unknown:
            reason = str(unknown)
            if reason != self._last_reason:
                log.warning(
                    "Prometheus at %s: query %r unknown: %s", self._where, self._query, reason
                )
                self._last_reason = reason
            return None
        if self._last_reason is not None:
            log.info("Prometheus at %s: query %r answers again", self._where, self._query)
            self._last_reason = None
        return values

    async def _answer(self) -> Mapping[str, Any]:
        """The ``data`` of a successful answer."""
        try:
            response = await self._client.get(self._endpoint, params={"query": self._query})
        except httpx.HTTPError as exc:
            # The type only: some httpx messages carry the URL, and it may hold credentials.
            raise _Unknown(f"request failed ({type(exc).__name__})") from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise _Unknown(f"HTTP {response.status_code}, the body is not a JSON object")
        if not response.is_success or body.get("status") != "success":
            error = f"{body.get('errorType', '')}: {body.get('error', '')}"[:_ERROR_CHARS]
            raise _Unknown(f"HTTP {response.status_code}, status {body.get('status')!r}, {error}")
        data = body.get("data")
        if not isinstance(data, dict):
            raise _Unknown("a success without data")
        return data

    async def close(self) -> None:
        await self._client.aclose()


def _values(data: Mapping[str, Any]) -> dict[str, float]:
    result_type, result = data.get("resultType"), data.get("result")
    if result_type == "scalar":
        return {"": _finite(result)}
    if result_type != "vector" or not isinstance(result, list):
        raise _Unknown(f"unexpected result type {result_type!r}")
    series = [_series(item) for item in result]
    uuids = Counter(labels[GPU_UUID] for labels, _ in series if GPU_UUID in labels)

    def key(labels: Mapping[str, str]) -> str:
        uuid = labels.get(GPU_UUID)
        return uuid if uuid is not None and uuids[uuid] == 1 else _render(labels)

    return {key(labels): value for labels, value in series}


def _series(item: Any) -> tuple[dict[str, str], float]:
    if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
        raise _Unknown("a vector element without labels")
    return {str(k): str(v) for k, v in item["metric"].items()}, _finite(item.get("value"))


def _finite(sample: Any) -> float:
    """The value of a ``[timestamp, "value"]`` pair, if it is a finite number."""
    if not isinstance(sample, list) or len(sample) != 2:
        raise _Unknown(f"a malformed sample {sample!r:.{_ERROR_CHARS}}")
    try:
        value = float(sample[1])
    except (TypeError, ValueError):
        raise _Unknown(f"a value that is not a number: {sample[1]!r:.{_ERROR_CHARS}}") from None
    if not math.isfinite(value):
        raise _Unknown(f"a value that is not finite: {sample[1]!r}")
    return value


def _render(labels: Mapping[str, str]) -> str:
    """``{a="1",b="2"}`` in label-name order, escaped as PromQL does; ``""`` for no labels."""
    if not labels:
        return ""
    escaped = (
        (name, value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))
        for name, value in sorted(labels.items())
    )
    return "{" + ",".join(f'{name}="{value}"' for name, value in escaped) + "}"


def _without_credentials(url: str) -> str:
    """``url`` for the logs: no user, password, query or fragment."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
