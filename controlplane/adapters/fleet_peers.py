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
        # trust_env=False: a proxy set for the store's egress (HTTPS_PROXY) is not the way to
        # a pod next door.
        async with httpx.AsyncClient(
            timeout=self._timeout, follow_redirects=False, trust_env=False
        ) as client:
            answers = await asyncio.gather(*(self._wake(client, url) for url in urls))
        return dict(zip(urls, answers, strict=True))

    async def _wake(self, client: httpx.AsyncClient, url: str) -> str | None:
        """Why ``url`` was not woken; None when it was. Never raises: one member that cannot
        be reached (or an address httpx refuses) must not cost the others their wake."""
        try:
            async with asyncio.timeout(self._timeout):  # the whole call, a slow answer too
                async with client.stream("POST", url + WAKE_PATH) as response:
                    status = response.status_code  # the body is not read
        except TimeoutError:
            return f"no answer within {self._timeout:g} s"
        except Exception as exc:  # anything from one peer stays with that peer
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return None if status == 202 else f"HTTP {status}"
