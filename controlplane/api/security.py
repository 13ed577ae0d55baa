"""The bearer-token gate: with ``api.token`` set, every mutating request is authenticated first.

It is an ASGI gate in front of everything else, so a request without the right token is
answered 401 from its headers alone: its body is never read, parsed, measured or described,
and no route, validation or 404 says anything to a caller who has not shown the token.
"Mutating" is every method but GET, HEAD and OPTIONS, so a route added later is guarded by
default; the one exception, by exact path, is ``POST /v1/fleet/wake``, which changes nothing
(another member asks this one to read the store now, and members never send their token to an
address read from the store). The token is compared in constant time
(:func:`hmac.compare_digest`) and never logged.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.errors import send_error

READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CHALLENGE = (b"www-authenticate", b'Bearer realm="controlplane"')
OPEN_POSTS = frozenset({"/v1/fleet/wake"})  # change nothing: see the module's docstring


def needs_token(method: str, path: str = "") -> bool:
    method = method.upper()
    return method not in READ_ONLY_METHODS and not (method == "POST" and path in OPEN_POSTS)


def token_problem(authorization: bytes | None, expected: bytes) -> str | None:
    """Why ``authorization`` (the raw header) does not carry ``expected``; None if it does."""
    scheme, _, presented = (authorization or b"").partition(b" ")
    if scheme.lower() != b"bearer" or not presented.strip():
        return "this route needs 'Authorization: Bearer <token>' (api.token)"
    if not hmac.compare_digest(presented.strip(), expected):
        return "the bearer token is not valid"
    return None


class Authenticate:
    """Answers 401 ``unauthorized`` to a mutating request without the configured token."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self._app = app
        self._expected = token.encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and self._expected is not None
            and needs_token(scope["method"], scope.get("path", ""))
        ):
            authorization = dict(scope.get("headers", [])).get(b"authorization")
            problem = token_problem(authorization, self._expected)
            if problem is not None:
                await send_error(send, "unauthorized", problem, headers=[CHALLENGE])
                return
        await self._app(scope, receive, send)
