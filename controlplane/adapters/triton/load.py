"""Closed-loop inference load for the stress preflight: N clients, each sending its next request
the moment the last one answered, for a fixed time.

Latency is measured here, on the client side, around each gRPC call (the time a caller of the
model sees, queueing in Triton included); a failed request is counted with Triton's message and
never retried, since a retry would hide exactly what the stress test looks for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import aio as grpcclient
from tritonclient.utils import InferenceServerException

from controlplane.domain.stress import Load


async def closed_loop(
    client: grpcclient.InferenceServerClient,
    model: str,
    inputs: Sequence[Any],
    *,
    concurrency: int,
    seconds: float,
    timeout: float,
) -> Load:
    """Drive ``model`` with ``inputs`` (tritonclient ``InferInput``, read-only, shared by the
    clients) from ``concurrency`` clients for ``seconds``."""
    deadline = time.perf_counter() + seconds
    tensors = list(inputs)

    async def one_client() -> Load:
        latencies: list[float] = []
        errors = 0
        first: str | None = None
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                await client.infer(model, tensors, client_timeout=timeout)
            except InferenceServerException as exc:
                errors += 1
                if first is None:
                    first = str(exc.message() or exc).strip()
                continue
            latencies.append((time.perf_counter() - started) * 1000)
        return Load(tuple(latencies), errors, first)

    loads = await asyncio.gather(*(one_client() for _ in range(concurrency)))
    total = Load()
    for load in loads:
        total += load
    return total
