"""The token gate: with ``api.token`` set, every write is authenticated first, and with
``api.read_token`` set too, every read.

It is an ASGI gate in front of everything else, so a request without a fitting token is
answered from its headers alone: its body is never read, parsed, measured or described, and no
route, validation or 404 says anything to a caller who has not shown a token. Each request has
one of three needs (:func:`access_of`):

- **write**: every method but GET, HEAD and OPTIONS, so a route added later is guarded by
  default. It takes the write token as ``Authorization: Bearer <token>``; the read token is
  refused with 403 ``forbidden`` (it is known, and cannot do this), anything else with 401. A
  write never takes HTTP Basic: a browser that was given Basic credentials sends them by itself,
  also with requests another site's page makes it send.
- **read**: GET, HEAD and OPTIONS. Open while no read token is set (as before there was one);
  once one is, it takes either token, as a bearer token or as the password of HTTP Basic with any
  user name (so a browser can open the status page and ``/docs``: the 401 challenges with Basic
  as well as Bearer, and the browser prompts).
- **open**: the probes ``/healthz`` and ``/readyz`` (the kubelet sends no token), and
  ``POST /v1/fleet/wake``, by exact path, which changes nothing (another member asks this one
  to read the store now, and members never send their token to an address read from the
  store).

Tokens are compared in constant time (:func:`hmac.compare_digest`), each presented secret
against both tokens, and never logged or echoed.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from enum import StrEnum

from starlette.types import ASGIApp, Receive, Scope, Send

from controlplane.api.errors import send_error

READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
OPEN_POSTS = frozenset({"/v1/fleet/wake"})  # change nothing: see the module's docstring
PROBES = frozenset({"/healthz", "/readyz"})
REALM = b'realm="controlplane"'
BEARER_CHALLENGE = (b"www-authenticate", b"Bearer " + REALM)
BASIC_CHALLENGE = (b"www-authenticate", b"Basic " + REALM)
CHALLENGE = BEARER_CHALLENGE


class Access(StrEnum):
    OPEN = "open"  # never a token
    READ = "read"  # either token, once api.read_token is set
    WRITE = "write"  # the write token, once api.token is set


def access_of(method: str, path: str) -> Access:
    method = method.upper()
    if method in READ_ONLY_METHODS:
        return Access.OPEN if path in PROBES else Access.READ
    return Access.OPEN if method == "POST" and path in OPEN_POSTS else Access.WRITE


def needs_token(method: str, path: str = "") -> bool:
    """Whether the request needs the write token (when one is set)."""
    return access_of(method, path) is Access.WRITE


@dataclass(frozen=True)
class Refusal:
    code: str  # unauthorized (401) or forbidden (403)
    message: str
    challenges: tuple[tuple[bytes, bytes], ...]


def _presented(authorization: bytes | None) -> tuple[bytes, bytes] | None:
    """(scheme, secret) of an ``Authorization`` header: ``bearer`` and the token, or ``basic``
    and the password; None when there is none or it cannot be read."""
    scheme, _, value = (authorization or b"").strip().partition(b" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme == b"bearer" and value:
        return scheme, value
    if scheme == b"basic" and value:
        try:
            decoded = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return None
        _user, colon, password = decoded.partition(b":")
        if colon and password:
            return scheme, password
    return None


class Gate:
    """What the two tokens let a request do: None when it may go on, else the refusal."""

    def __init__(self, write: str | None, read: str | None) -> None:
        self._write = write.encode() if write is not None else None
        self._read = read.encode() if read is not None and write is not None else None

    @property
    def reads_guarded(self) -> bool:
        return self._read is not None

    def check(self, method: str, path: str, authorization: bytes | None) -> Refusal | None:
        access = access_of(method, path)
        if self._write is None or access is Access.OPEN:
            return None
        if access is Access.READ and self._read is None:
            return None
        presented = _presented(authorization)
        is_write = is_read = False
        if presented is not None:
            secret = presented[1]
            is_write = hmac.compare_digest(secret, self._write)
            is_read = self._read is not None and hmac.compare_digest(secret, self._read)
        if access is Access.READ:
            if is_write or is_read:
                return None
            why = "the token is not valid" if presented is not None else "this route needs a token"
            return Refusal(
                "unauthorized",
                f"{why}: send 'Authorization: Bearer <token>' (api.read_token or api.token), "
                "or HTTP Basic with any user name and the token as the password",
                (BEARER_CHALLENGE, BASIC_CHALLENGE),
            )
        if presented is not None and presented[0] == b"basic":
            return Refusal(
                "unauthorized",
                "writes take the write token as 'Authorization: Bearer <token>' (api.token), "
                "not as HTTP Basic",
                (BEARER_CHALLENGE,),
            )
        if is_write:
            return None
        if is_read:
            return Refusal(
                "forbidden",
                f"the read token (api.read_token) can only read: {method.upper()} "
                f"{path[:200]} needs the write token (api.token)",
                (),
            )
        message = (
            "this route needs 'Authorization: Bearer <token>' (api.token)"
            if presented is None
            else "the bearer token is not valid; this route needs the write token (api.token)"
        )
        return Refusal("unauthorized", message, (BEARER_CHALLENGE,))


class Authenticate:
    """Answers 401 ``unauthorized`` or 403 ``forbidden`` to a request its token does not
    allow (see the module's docstring), before anything else reads it."""

    def __init__(self, app: ASGIApp, token: str | None, read_token: str | None = None) -> None:
        self._app = app
        self._gate = Gate(token, read_token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            authorization = dict(scope.get("headers", [])).get(b"authorization")
            refusal = self._gate.check(scope["method"], scope.get("path", ""), authorization)
            if refusal is not None:
                await send_error(send, refusal.code, refusal.message, headers=refusal.challenges)
                return
        await self._app(scope, receive, send)
