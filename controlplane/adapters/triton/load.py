"""Closed-loop inference load for the stress preflight: N clients, each sending its next request
the moment the last one answered, for a fixed time.

Latency is measured here, on the client side, around each gRPC call (the time a caller of the
model sees, queueing in Triton included); a failed request is counted with Triton's message and
never retried, since a retry would hide exactly what the stress test looks for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc

from controlplane.adapters.triton.protocol import status_of
from controlplane.domain.stress import Load


async def closed_loop(
    send: Callable[[], Awaitable[None]], *, concurrency: int, seconds: float
) -> Load:
    """Drive the model with ``send`` (one inference, its request built once and shared by
    the clients, its timeout set) from ``concurrency`` clients for ``seconds``."""
    deadline = time.perf_counter() + seconds

    async def one_client() -> Load:
        latencies: list[float] = []
        errors = 0
        first: str | None = None
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                await send()
            except grpc.RpcError as exc:
                errors += 1
                if first is None:
                    first = status_of(exc)[1].strip()
                continue
            latencies.append((time.perf_counter() - started) * 1000)
        return Load(tuple(latencies), errors, first)

    loads = await asyncio.gather(*(one_client() for _ in range(concurrency)))
    total = Load()
    for load in loads:
        total += load
    return total
