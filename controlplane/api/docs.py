"""``/docs``: Swagger UI that works with no internet.

FastAPI's own docs pages load their scripts and styles from a CDN, so on an air-gapped cluster
they are blank. Here the page loads the files that the ``fastapi-offline`` package ships,
served by the daemon under :data:`ASSETS`, and one script of this package (``docs.js``) that
starts Swagger UI. Nothing is copied into this repository: upgrading that package upgrades
Swagger UI. The start-up is a script file rather than FastAPI's inline one because it has to
compute the document's address: a page opened as ``http://ops:TOKEN@cp:8080/docs`` would
otherwise fetch ``/openapi.json`` with the credentials in its URL, which browsers refuse.
ReDoc is not served: its page fetches its makers' logo from their CDN whatever it is told.
"""

from __future__ import annotations

import json
from html import escape
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

ASSETS = "/ui/docs-assets"
START = "/ui/docs.js"
BUNDLE = "fastapi_offline"  # the package whose static/ holds Swagger UI's files
SCRIPT = resources.files("controlplane.api").joinpath("docs.js").read_text("utf-8")
# What FastAPI's own page starts Swagger UI with, besides the document and the presets.
OPTIONS = {
    "layout": "BaseLayout",
    "deepLinking": True,
    "showExtensions": True,
    "showCommonExtensions": True,
}
HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def docs_page(*, title: str, root: str, openapi_url: str, options: dict[str, object]) -> str:
    """The HTML of ``/docs``: Swagger UI's files and the start-up script, all from ``root``."""
    attribute = escape(json.dumps({**OPTIONS, **options}), quote=True)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1.0">\n'
        f'<link rel="stylesheet" href="{escape(root)}{ASSETS}/swagger-ui.css">\n'
        f'<link rel="icon" href="{escape(root)}{ASSETS}/favicon.png">\n'
        f"<title>{escape(title)}</title>\n</head>\n<body>\n"
        '<div id="swagger-ui"></div>\n'
        f'<script src="{escape(root)}{ASSETS}/swagger-ui-bundle.js"></script>\n'
        f'<script id="docs-start" src="{escape(root)}{START}" '
        f'data-spec="{escape(root + openapi_url, quote=True)}" data-options="{attribute}">'
        "</script>\n</body>\n</html>\n"
    )


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI and its files; FastAPI's CDN pages must be off (``docs_url`` and
    ``redoc_url`` None)."""
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("FastAPI's own docs pages load from a CDN: build the app with None")
    openapi_url = app.openapi_url or "/openapi.json"
    static = resources.files(BUNDLE).joinpath("static")
    app.mount(ASSETS, StaticFiles(directory=str(static), check_dir=True), name="docs-assets")

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return HTMLResponse(
            docs_page(
                title=f"{app.title} - API",
                root=str(request.scope.get("root_path", "")),
                openapi_url=openapi_url,
                options=dict(app.swagger_ui_parameters or {}),
            ),
            headers=HEADERS,
        )

    @app.get(START, include_in_schema=False)
    async def swagger_start() -> Response:
        return Response(SCRIPT, media_type="text/javascript; charset=utf-8", headers=HEADERS)
