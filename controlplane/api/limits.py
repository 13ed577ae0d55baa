"""Request body bound, enforced before FastAPI reads a byte of JSON.

A body over the limit is answered 413 from its ``Content-Length``, or as soon as the streamed
bytes pass the limit, so a 10 MB upload costs at most the limit in memory.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane.api.errors import send_error


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self._app = app
        self._max = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await send_error(send, "invalid_request", "Content-Length is not a number")
                return
            if int(declared) > self._max:
                await self._too_large(send)
                return
        buffered: list[Message] = []
        received = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            received += len(message.get("body", b""))
            if received > self._max:
                await self._too_large(send)
                return
            buffered.append(message)
            more = bool(message.get("more_body", False))

        async def replay() -> Message:
            if buffered:
                return buffered.pop(0)
            return await receive()

        await self._app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        await send_error(
            send,
            "request_too_large",
            f"request body is larger than {self._max} bytes (api.max_body_bytes)",
        )
