"""``GET /v1/config`` and the OpenAPI document around it, with the app in-process.

The app is called through httpx's ASGI transport without its lifespan: the settings route needs
no container (``create_app`` keeps the settings), and no background job reaches for Triton.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from controlplane.api.app import create_app
from controlplane.cli.config_view import render_effective, render_remote
from controlplane.settings import Settings, load_settings

WRITE, READ = "wr1te-s3cret", "r3ad-s3cret"
PASSWORD = "hunter2"
CONFIG = f"""\
repository: {{path: /srv/triton/repository}}
store: {{uri: 'file:///srv/store', poll_interval_seconds: 3}}
api: {{token: {WRITE}, read_token: {READ}}}
rollback: {{source: prometheus, prometheus_url: 'http://admin:{PASSWORD}@prom:9090'}}
models: {{resnet: {{auto_deploy: true}}}}
"""


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("CONTROLPLANE_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "controlplane.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


def get(config_file: Path, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    app = create_app(load_settings(config_file))

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://cp") as client:
            return await client.get(path, headers=headers or {})

    return asyncio.run(call())


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_the_daemons_settings_show_no_token_and_no_password_in_a_url(config_file: Path) -> None:
    response = get(config_file, "/v1/config", bearer(READ))

    assert response.status_code == 200, response.text
    for secret in (WRITE, READ, PASSWORD):
        assert secret not in response.text
    settings = response.json()["settings"]
    assert settings["api"]["token"] == "********"
    assert settings["api"]["read_token"] == "********"
    assert settings["rollback"]["prometheus_url"] == "http://admin:********@prom:9090"
    assert settings["store"]["poll_interval_seconds"] == 3.0
    assert settings["models"]["resnet"]["auto_deploy"] is True
    assert response.json()["derived"]["staging.path"] == "/srv/triton/staging"


def test_the_daemons_settings_print_as_the_local_ones_do(config_file: Path) -> None:
    answer = get(config_file, "/v1/config", bearer(WRITE)).json()

    remote = render_remote(answer, "http://cp:8080")
    local = render_effective(config_file)

    assert yaml.safe_load(remote) == yaml.safe_load(local)
    lines = remote.splitlines()
    assert "  poll_interval_seconds: 3.0  # from the running daemon" in lines
    assert '  token: "********"  # from the running daemon' in lines
    assert "  retry_seconds: 120.0" in lines  # a default says nothing of where it came from
    assert "  path: null  # that is: /srv/triton/staging" in lines


@pytest.mark.parametrize("headers", [{}, bearer("not-a-token")], ids=["no-token", "a-wrong-token"])
def test_the_settings_need_a_token_once_reads_are_guarded(
    config_file: Path, headers: dict[str, str]
) -> None:
    response = get(config_file, "/v1/config", headers)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert WRITE not in response.text
    assert READ not in response.text


def document(tmp_path: Path, **api: str) -> dict[str, Any]:
    settings = Settings(
        repository={"path": tmp_path / "repository"},
        store={"uri": (tmp_path / "store").as_uri()},
        api=api,
    )
    found: dict[str, Any] = create_app(settings).openapi()
    return found


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, item in doc["paths"].items()
        for method, operation in item.items()
    ]


def test_without_a_token_the_bearer_scheme_is_declared_and_no_route_asks_for_it(
    tmp_path: Path,
) -> None:
    doc = document(tmp_path)

    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert all("security" not in operation for _m, _p, operation in operations(doc))


def test_the_settings_route_asks_for_a_token_as_every_read_does(tmp_path: Path) -> None:
    guarded = document(tmp_path, token=WRITE, read_token=READ)["paths"]["/v1/config"]["get"]
    writes_only = document(tmp_path, token=WRITE)["paths"]["/v1/config"]["get"]

    assert guarded["security"] == [{"bearer": []}, {"basic": []}]
    assert "security" not in writes_only  # reads are open while no read token is set


def test_every_route_has_a_summary_that_reads_as_a_sentence(tmp_path: Path) -> None:
    doc = document(tmp_path, token=WRITE)

    for method, path, operation in operations(doc):
        summary = operation.get("summary", "")
        words = summary.split()
        assert len(words) >= 3, (method, path, summary)
        assert summary[0].isupper(), (method, path, summary)
        assert summary.endswith("."), (method, path, summary)
        # FastAPI's default is the function's name in title case ("Get Operation").
        assert not all(word[0].isupper() for word in words), (method, path, summary)
