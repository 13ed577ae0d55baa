"""The request media-type gate: every request body this API reads is JSON.

A body sent as anything else (``curl -d`` sends ``application/x-www-form-urlencoded``) is
answered 415 ``unsupported_media_type`` naming the header to send, before a byte of it is read,
instead of a validation error that does not say why. Accepted: no (or an empty) ``Content-Type``, or
``application/json`` and ``application/<anything>+json``, with any parameters (``charset``).
The media type is parsed the way FastAPI parses it, so what passes here is what it decodes.
"""

from __future__ import annotations

import email.message

from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.errors import send_error

SEND_JSON = "-H 'Content-Type: application/json'"


def is_json(content_type: str) -> bool:
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return b"transfer-encoding" in headers


class JsonBodies:
    """Answers 415 to a request whose body is declared as anything but JSON."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers", []))
            declared = headers.get(b"content-type")
            if declared is not None and declared.strip() and _has_body(headers):
                content_type = declared.decode("latin-1")
                if not is_json(content_type):
                    await send_error(
                        send,
                        "unsupported_media_type",
                        f"request bodies are JSON; Content-Type {content_type[:100]!r} is not "
                        f"supported: send {SEND_JSON} (or no Content-Type)",
                    )
                    return
        await self._app(scope, receive, send)
