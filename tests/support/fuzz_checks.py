"""A Schemathesis check the API fuzzer loads (``hooks`` in its config): codes match the document.

Every error answer must carry, in ``{"error": {"code", "message"}}``, a code that the operation's
OpenAPI entry lists for that status under ``x-error-codes`` (``api/openapi.py`` writes them from
the routes' own lists). A 500 ``internal_error`` fails here too, since no route documents it.
A method the path does not have is answered 405 ``method_not_allowed`` (or 401 first, for a
mutating method without the token).
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis import Case, CheckContext, Response


@schemathesis.check
def error_code_documented_for_the_status(
    ctx: CheckContext, response: Response, case: Case[Any]
) -> bool | None:
    if response.status_code < 400:
        return None
    if response.request.method != case.operation.method.upper():  # an undeclared method
        codes = ["method_not_allowed", "unauthorized"]
    else:
        responses = case.operation.definition.raw.get("responses", {})
        codes = responses.get(str(response.status_code), {}).get("x-error-codes", [])
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError) as exc:
        raise AssertionError(f"{response.status_code} without an error body ({exc!r})") from None
    if code not in codes:
        raise AssertionError(
            f"{response.status_code} {code!r} is not documented for {case.operation.label}: "
            f"its {response.status_code} lists {codes}"
        )
    return None
