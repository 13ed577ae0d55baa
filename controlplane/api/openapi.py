"""The OpenAPI document: it lists exactly the statuses the API answers, from the one table.

Each route names the error codes it can answer (:func:`answers`); their statuses come from
``STATUS_BY_CODE`` in ``api/errors.py``, so a status is never written twice. Every error
status carries the error body's schema, a description naming the codes behind it, and the
same codes as a list under ``x-error-codes`` for tools (the API fuzzer checks every answer's
code against it). Two things FastAPI would add are corrected once, when the document is built:
its default ``422 Validation Error`` (this API answers validation errors with 400
``invalid_request``) is removed, and with ``api.token`` set the mutating operations declare the
bearer scheme they really need.
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from controlplane.api.errors import statuses_for
from controlplane.api.schemas import ErrorBody
from controlplane.api.security import needs_token

ERROR_CODES_KEY = "x-error-codes"
BEARER = "bearer"
_FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


def _codes(codes: Iterable[str]) -> str:
    return ", ".join(f"`{code}`" for code in codes)


def answers(
    refusals: Iterable[str] = (),
    failures: Iterable[str] = (),
    *,
    body: type[BaseModel] = ErrorBody,
) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a route that refuses a request with ``refusals`` at once and,
    with ``"wait": true``, answers an operation that failed with one of ``failures``."""
    refused = statuses_for(refusals)
    failed = statuses_for(failures)
    documented: dict[int | str, dict[str, Any]] = {}
    for status in sorted(set(refused) | set(failed)):
        parts = [f"{HTTPStatus(status).phrase}."]
        if status in refused:
            parts.append(f"Refused: {_codes(refused[status])}.")
        if status in failed:
            parts.append(f"The waited operation failed: {_codes(failed[status])}.")
        codes = list(dict.fromkeys([*refused.get(status, []), *failed.get(status, [])]))
        documented[status] = {
            "model": body,
            "description": " ".join(parts),
            ERROR_CODES_KEY: codes,
        }
    return documented


class DocumentedAPI(FastAPI):
    """FastAPI whose OpenAPI document says what this API answers (see the module docstring)."""

    def __init__(self, *, bearer: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bearer = bearer

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            document = super().openapi()
            _drop_default_validation_answers(document)
            if self.bearer:
                _declare_bearer(document)
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


def _declare_bearer(document: dict[str, Any]) -> None:
    components = document.setdefault("components", {})
    components.setdefault("securitySchemes", {})[BEARER] = {
        "type": "http",
        "scheme": "bearer",
        "description": "api.token; every mutating route needs it.",
    }
    for method, operation in _operations(document):
        if needs_token(method):
            operation["security"] = [{BEARER: []}]
