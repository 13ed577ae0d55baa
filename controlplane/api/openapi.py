"""The OpenAPI document, corrected once when it is built so that it says what the API does.

The routes' ``responses`` come from ``api/answers.py``. FastAPI's default ``422 Validation
Error`` is removed (this API answers validation errors with 400 ``invalid_request`` and never
sends it). What the token gate (``api/security.py``) answers is added here, from the gate's own
rule (:func:`~controlplane.api.security.access_of`), so no route has to name it and a route
added later is documented as guarded: with ``api.token`` set, each write declares the bearer
scheme and its 401 ``unauthorized`` (and, with ``api.read_token`` set, 403 ``forbidden``);
with ``api.read_token`` set, each read but the probes declares bearer or Basic and its 401.
The bearer scheme is declared even while ``api.token`` is unset (no operation requires it then),
so ``/docs`` always has its Authorize button and a client generator always knows the scheme.

Every operation has a ``summary`` that reads as a sentence, set where the route is declared
(FastAPI would make one of the function's name: "Get Operation").
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI

from controlplane.api.answers import ERROR_CODES_KEY
from controlplane.api.errors import STATUS_BY_CODE
from controlplane.api.security import Access, access_of

BEARER, BASIC = "bearer", "basic"
_FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")
_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


class DocumentedAPI(FastAPI):
    """FastAPI whose OpenAPI document says what this API answers (see the module docstring)."""

    def __init__(self, *, bearer: bool, reads_guarded: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bearer = bearer
        self.reads_guarded = bearer and reads_guarded

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            document = super().openapi()
            _drop_default_validation_answers(document)
            if self.bearer:
                _declare_gate(document, reads_guarded=self.reads_guarded)
            else:
                _declare_unused_bearer(document)
        return super().openapi()


def _operations(document: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    for path_item in document.get("paths", {}).values():
        yield from path_item.items()


def _drop_default_validation_answers(document: dict[str, Any]) -> None:
    for _method, operation in _operations(document):
        responses = operation.get("responses", {})
        default = responses.get("422", {}).get("content", {}).get("application/json", {})
        if default.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
            del responses["422"]
    schemas = document.get("components", {}).get("schemas", {})
    for name in _FASTAPI_VALIDATION:
        schemas.pop(name, None)


def _declare_gate(document: dict[str, Any], *, reads_guarded: bool) -> None:
    schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes[BEARER] = {
        "type": "http",
        "scheme": "bearer",
        "description": "api.token (the write token) on every write but POST /v1/fleet/wake"
        + ("; api.read_token or api.token on every read but the probes" if reads_guarded else "")
        + ".",
    }
    if reads_guarded:
        schemes[BASIC] = {
            "type": "http",
            "scheme": "basic",
            "description": "Reads only: any user name, api.read_token or api.token as the "
            "password (for browsers: the status page, /docs).",
        }
    for path, path_item in document.get("paths", {}).items():
        for method, operation in path_item.items():
            access = access_of(method, path)
            if access is Access.WRITE:
                operation["security"] = [{BEARER: []}]
                _refused(operation, ("unauthorized", *(("forbidden",) if reads_guarded else ())))
            elif access is Access.READ and reads_guarded:
                operation["security"] = [{BEARER: []}, {BASIC: []}]
                _refused(operation, ("unauthorized",))


def _declare_unused_bearer(document: dict[str, Any]) -> None:
    schemes = document.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes[BEARER] = {
        "type": "http",
        "scheme": "bearer",
        "description": "api.token (the write token). This daemon runs without api.token, so "
        "no route asks for it: set api.token (and api.read_token) to guard writes (and reads).",
    }


def _refused(operation: dict[str, Any], codes: Iterable[str]) -> None:
    """Document the gate's refusals ``codes`` among the operation's answers."""
    responses = operation.setdefault("responses", {})
    for code in codes:
        status = STATUS_BY_CODE[code]
        answer = responses.setdefault(
            str(status),
            {"description": f"{HTTPStatus(status).phrase}.", ERROR_CODES_KEY: []},
        )
        answer.setdefault("content", _ERROR_BODY)
        named = answer.setdefault(ERROR_CODES_KEY, [])
        if code not in named:
            named.insert(0, code)
            answer["description"] += f" Refused by the token gate: `{code}`."
