"""Waking the other members of the fleet over their APIs (:class:`~controlplane.ports.FleetPeers`).

``POST <url>/v1/fleet/wake`` with no body and no token: the addresses come from heartbeats in
the store, and a member never sends its token to an address it read there. A wake that fails
costs nothing but time: that member follows at its next poll.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

WAKE_PATH = "/v1/fleet/wake"
WAKE_TIMEOUT = 1.0  # seconds per member: connect, send, answer


class HttpPeers:
    def __init__(self, *, timeout: float = WAKE_TIMEOUT) -> None:
        self._timeout = timeout

    async def wake(self, urls: Sequence[str]) -> dict[str, str | None]:
        if not urls:
            return {}
        async with httpx.AsyncClient(timeout=self._timeout, follow_redirects=False) as client:
            answers = await asyncio.gather(*(self._wake(client, url) for url in urls))
        return dict(zip(urls, answers, strict=True))

    @staticmethod
    async def _wake(client: httpx.AsyncClient, url: str) -> str | None:
        try:
            response = await client.post(url + WAKE_PATH)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if response.status_code != 202:
            return f"HTTP {response.status_code}"
        return None
