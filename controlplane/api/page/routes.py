"""The status page's routes: the page, its content for the refresh, and its script.

Reads like the API's other GETs (the token gate in front treats them alike), left out of the
OpenAPI document: they are for people. The answers forbid caching, and the page's
Content-Security-Policy allows nothing but this daemon: its script, its content fetched from
the same origin, its one inline style (by hash). An image, a font or a script from elsewhere
would be refused by the browser even if one slipped into the markup.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

from controlplane import __version__
from controlplane.api.deps import Reader
from controlplane.api.page.render import CONTENT_PATH, SCRIPT_PATH, STYLE, content, page

SCRIPT = resources.files("controlplane.api.page").joinpath("refresh.js").read_text("utf-8")
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
POLICY = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; "
    f"style-src 'sha256-{_STYLE_HASH}'; img-src data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def install_page(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    async def status_page(c: Reader) -> HTMLResponse:
        overview = await c.overview.overview()
        return HTMLResponse(
            page(overview, version=__version__),
            headers={**HEADERS, "Content-Security-Policy": POLICY},
        )

    @app.get(f"/{CONTENT_PATH}", include_in_schema=False, response_class=HTMLResponse)
    async def status_content(c: Reader) -> HTMLResponse:
        overview = await c.overview.overview()
        return HTMLResponse(content(overview), headers=HEADERS)

    @app.get(f"/{SCRIPT_PATH}", include_in_schema=False)
    async def status_script() -> Response:
        return Response(SCRIPT, media_type="text/javascript; charset=utf-8", headers=HEADERS)
