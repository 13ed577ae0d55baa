"""The OpenAPI document, corrected once when it is built so that it says what the API does.

The routes' ``responses`` come from ``api/answers.py``. Two things FastAPI adds on its own are
corrected here: its default ``422 Validation Error`` is removed (this API answers validation
errors with 400 ``invalid_request`` and never sends it), and with ``api.token`` set the
mutating operations declare the bearer scheme they really need (``api/security.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI

from controlplane.api.security import needs_token

BEARER = "bearer"
_FASTAPI_VALIDATION = ("HTTPValidationError", "ValidationError")


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
        "description": "api.token; every mutating route needs it (but POST /v1/fleet/wake).",
    }
    for path, path_item in document.get("paths", {}).items():
        for method, operation in path_item.items():
            if needs_token(method, path):
                operation["security"] = [{BEARER: []}]
