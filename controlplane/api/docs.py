"""``/docs``: Swagger UI that works with no internet.

FastAPI's own docs pages load their scripts and styles from a CDN, so on an air-gapped cluster
they are blank. Here FastAPI's Swagger UI page (``get_swagger_ui_html``) points at the files
that the ``fastapi-offline`` package ships, served by the daemon under :data:`ASSETS`. Nothing
is copied into this repository: upgrading that package upgrades Swagger UI. ReDoc is not
served: its page fetches its makers' logo from their CDN whatever it is told.
"""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/ui/docs-assets"
BUNDLE = "fastapi_offline"  # the package whose static/ holds Swagger UI's files


def install_docs(app: FastAPI) -> None:
    """Serve Swagger UI and its files; FastAPI's CDN pages must be off (``docs_url`` and
    ``redoc_url`` None)."""
    if app.docs_url is not None or app.redoc_url is not None:
        raise ValueError("FastAPI's own docs pages load from a CDN: build the app with None")
    openapi_url = app.openapi_url or "/openapi.json"
    static = resources.files(BUNDLE).joinpath("static")
    app.mount(ASSETS, StaticFiles(directory=str(static), check_dir=True), name="docs-assets")

    def prefix(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = prefix(request)
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}",
            title=f"{app.title} - API",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )
