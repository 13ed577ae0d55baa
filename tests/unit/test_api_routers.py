"""The routes moved into routers (``api/routes/``) and the OpenAPI document said the same.

``data/openapi_before_routers.json`` is ``create_app(settings).openapi()`` with ``api.token``
and ``api.read_token`` set (so the token gate's answers are in it too), dumped as JSON with
sorted keys by the code before the move (commit ed3d60e), when every route was a closure
inside ``create_app``. The test compares what a client generator reads: each path and method,
its operation id, tags, parameters, body, security, the statuses it answers with their schemas
and error codes, and the schemas' names. Prose (descriptions) is left to change. A route added
on purpose, or one that answers another status, changes this file: dump it again then.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controlplane.api.app import create_app
from controlplane.settings import Settings

BEFORE = Path(__file__).parent / "data" / "openapi_before_routers.json"


def _shape(document: dict[str, Any]) -> dict[str, Any]:
    """What a client of the document relies on, without the prose."""
    operations: dict[str, Any] = {}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            operations[f"{method.upper()} {path}"] = {
                "operationId": operation["operationId"],
                "tags": operation.get("tags"),
                "security": operation.get("security"),
                "parameters": [
                    (p["name"], p["in"], p.get("required", False), p["schema"])
                    for p in operation.get("parameters", [])
                ],
                "requestBody": operation.get("requestBody"),
                "responses": {
                    status: (answer.get("content"), answer.get("x-error-codes"))
                    for status, answer in operation["responses"].items()
                },
            }
    components = document["components"]
    return {
        "operations": operations,
        "schemas": sorted(components["schemas"]),
        "securitySchemes": sorted(components.get("securitySchemes", {})),
    }


def test_the_document_has_the_paths_methods_and_answers_it_had_before_the_routers(
    tmp_path: Path,
) -> None:
    settings = Settings(
        repository={"path": tmp_path / "repository"},
        store={"uri": (tmp_path / "store").as_uri()},
        api={"token": "t0ken", "read_token": "r3ad"},
    )
    before = _shape(json.loads(BEFORE.read_text(encoding="utf-8")))
    now = _shape(json.loads(json.dumps(create_app(settings).openapi())))
    assert sorted(now["operations"]) == sorted(before["operations"])
    for route, shape in before["operations"].items():
        assert now["operations"][route] == shape, route
    assert now["schemas"] == before["schemas"]
    assert now["securitySchemes"] == before["securitySchemes"]
