"""Bearer-token check for mutating routes: constant-time compare, token never logged."""

from __future__ import annotations

import hmac

from fastapi import Request

from controlplane.domain.errors import PermanentError


class Unauthorized(PermanentError):
    code = "unauthorized"


def check_token(request: Request, expected: str | None) -> None:
    if expected is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented:
        raise Unauthorized("this route needs 'Authorization: Bearer <token>' (api.token)")
    if not hmac.compare_digest(presented.strip().encode(), expected.encode()):
        raise Unauthorized("the bearer token is not valid")
