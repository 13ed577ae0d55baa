"""The /docs page: Swagger UI's files and its start-up script, all from the daemon."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from controlplane.api.docs import ASSETS, START, docs_page


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def _tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Tags()
    parser.feed(html)
    return parser.tags


def test_every_file_the_page_loads_comes_from_the_daemon_under_its_root_path() -> None:
    html = docs_page(
        title="controlplane - API", root="/cp", openapi_url="/openapi.json", options={}
    )
    sources = [a.get("src") or a.get("href") for tag, a in _tags(html) if tag in ("script", "link")]
    assert sources == [
        f"/cp{ASSETS}/swagger-ui.css",
        f"/cp{ASSETS}/favicon.png",
        f"/cp{ASSETS}/swagger-ui-bundle.js",
        f"/cp{START}",
    ]
    assert "<script>" not in html  # no inline script: the start-up is a file


def test_the_start_up_script_gets_the_document_and_the_options_as_data() -> None:
    options: dict[str, object] = {"docExpansion": "none", "odd": '"><script>x</script>'}
    html = docs_page(title="<t>", root="", openapi_url="/openapi.json", options=options)
    start = next(a for tag, a in _tags(html) if tag == "script" and a.get("id") == "docs-start")
    assert start["data-spec"] == "/openapi.json"
    given = json.loads(start["data-options"] or "")
    assert given["odd"] == options["odd"]  # escaped in the attribute, intact when read
    assert given["deepLinking"] is True
    assert "<title>&lt;t&gt;</title>" in html
