"""Bad input from outside: every refusal is a 4xx with a clear message, and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devtools.launcher import RunningTriton
from tests.support.daemon import Daemon, start_daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.tree import snapshot

pytestmark = pytest.mark.triton
TOKEN = "s3cret-token-for-tests"
MODEL = "guarded"


@pytest.fixture(scope="module")
def daemon(triton: RunningTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("api-input")
    store = workdir / "store"
    write_scale_release(store, MODEL, "r1", k=1.0)
    running = start_daemon(triton=triton, store=store, workdir=workdir, token=TOKEN)
    try:
        assert running.deploy(MODEL, "r1").status_code == 200
        yield running
    finally:
        running.stop()


@pytest.fixture
def unchanged(daemon: Daemon, triton: RunningTriton) -> Iterator[None]:
    """Whatever the test sends, the repository and what serves stay as they were."""

    def model_dirs() -> dict[str, dict[str, str]]:  # the alias and its slots
        return {p.name: snapshot(p) for p in sorted(daemon.repository.glob(f"{MODEL}*"))}

    before = model_dirs()
    assert len(before) >= 2  # blue-green: the alias dir and the active slot
    yield
    assert model_dirs() == before
    assert daemon.staging_leftovers() == []
    assert infer_once(triton.grpc_url, MODEL) == 1.0
    assert daemon.get(f"/v1/models/{MODEL}").json()["active_release"] == "r1"


def _post_raw(daemon: Daemon, path: str, content: bytes, **headers: str) -> httpx.Response:
    with daemon.client() as client:
        return client.post(path, content=content, headers={**headers})


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("release", "says"),
    [
        ("../x", "not allowed"),
        ("a/b", "not allowed"),
        ("", "non-empty"),
        ("x" * 300, "300 characters"),
        (".hidden", "not allowed"),
    ],
    ids=["dotdot", "slash", "empty", "300-chars", "leading-dot"],
)
def test_invalid_release_names_are_refused(daemon: Daemon, release: str, says: str) -> None:
    response = daemon.deploy(MODEL, release)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_name"
    assert says in response.json()["error"]["message"]


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    "path",
    ["/v1/models/a%2Fb/deploy", "/v1/models/%2E%2E/deploy", "/v1/models/..%2Fx/deploy"],
    ids=["encoded-slash", "encoded-dotdot", "encoded-dotdot-slash"],
)
def test_model_names_that_spell_paths_are_refused(daemon: Daemon, path: str) -> None:
    response = daemon.post(path, {"release": "r1"})
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["code"] in ("invalid_name", "not_found")
    assert response.json()["error"]["message"]


@pytest.mark.usefixtures("unchanged")
def test_a_300_character_model_name_is_refused(daemon: Daemon) -> None:
    response = daemon.deploy("m" * 300, "r1")
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_name"
    assert "limit is 128" in response.json()["error"]["message"]


@pytest.mark.usefixtures("unchanged")
def test_an_unknown_model_is_404(daemon: Daemon) -> None:
    response = daemon.get("/v1/models/no-such-model")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    deploy = daemon.deploy("no-such-model", "r1")
    assert deploy.status_code == 404
    assert deploy.json()["error"]["code"] == "release_not_found"


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"{not json", "JSON"),
        (b"{}", "release"),
        (b'{"release": 5}', "release"),
        (b'{"release": "r1", "wait": "maybe"}', "wait"),
        (b'{"release": "r1", "wait": "yes"}', "wait"),
        (b'{"release": "r1", "force": 1}', "force"),
        (b'{"release": "r1", "surprise": 1}', "surprise"),
        (b"[]", "body"),
    ],
    ids=[
        "malformed",
        "missing-release",
        "wrong-type",
        "bad-wait",
        "wait-yes",
        "force-1",
        "unknown-field",
        "array",
    ],
)
def test_malformed_bodies_are_refused(daemon: Daemon, content: bytes, says: str) -> None:
    response = _post_raw(
        daemon, f"/v1/models/{MODEL}/deploy", content, **{"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert says in response.json()["error"]["message"]


def _alert(**fields: object) -> dict[str, object]:
    alert = {"status": "firing", "labels": {}, "startsAt": "2026-11-29T10:00:00Z"}
    return {"version": "4", "status": "firing", "alerts": [{**alert, **fields}]}


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    ("alert", "says"),
    [
        (_alert(fingerprint="f1", labels={"team": "\ud800"}), "lone surrogate"),
        (_alert(fingerprint="f2", annotations={"\udfff": "x"}), "lone surrogate"),
        (_alert(fingerprint="f3", startsAt=0), "startsAt"),
    ],
    ids=["surrogate-label", "surrogate-annotation-key", "numeric-starts-at"],
)
def test_alerts_that_cannot_be_stored_as_sent_are_refused(
    daemon: Daemon, alert: dict[str, object], says: str
) -> None:
    content = json.dumps(alert).encode()  # a lone surrogate travels as its JSON escape
    response = _post_raw(daemon, "/v1/alerts", content, **{"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert says in response.json()["error"]["message"]
    assert daemon.get("/v1/alerts").status_code == 200


@pytest.mark.usefixtures("unchanged")
def test_a_10_mb_body_is_refused_before_it_is_read(daemon: Daemon) -> None:
    body = b'{"release": "' + b"x" * (10 * 1024 * 1024) + b'"}'
    response = _post_raw(
        daemon, f"/v1/models/{MODEL}/deploy", body, **{"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


MUTATING_ROUTES = [
    f"/v1/models/{MODEL}/deploy",
    f"/v1/models/{MODEL}/rollback",
    f"/v1/models/{MODEL}/unload",
    "/v1/alerts",
    "/api/v1/model/reload?target=fallback",
]


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize("path", MUTATING_ROUTES)
@pytest.mark.parametrize(
    ("content", "headers"),
    [
        (b"{not json", {"content-type": "application/json"}),
        (b"release=r1", {"content-type": "application/x-www-form-urlencoded"}),
        (b'{"surprise": []}', {"content-type": "application/json"}),
        (b'{"release": "' + b"x" * (2 * 1024 * 1024) + b'"}', {}),
        (b'{"release": "r1"}', {"authorization": "Bearer not-the-token"}),
        (b'{"release": "r1"}', {"authorization": f"Basic {TOKEN}"}),
    ],
    ids=["broken-json", "form", "invalid-fields", "2-mb", "wrong-token", "not-bearer"],
)
def test_a_request_without_the_token_is_refused_before_its_body_is_read(
    daemon: Daemon, path: str, content: bytes, headers: dict[str, str]
) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as anonymous:
        response = anonymous.post(path, content=content, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert "Bearer" in response.headers["www-authenticate"]
    message = response.json()["error"]["message"].lower()
    assert not any(word in message for word in ("json", "body", "content", "release"))


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize("path", MUTATING_ROUTES)
@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data"]
)
def test_a_body_that_is_not_json_is_refused_naming_the_header_to_send(
    daemon: Daemon, path: str, content_type: str
) -> None:
    response = _post_raw(daemon, path, b'{"release": "r1"}', **{"content-type": content_type})
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert "-H 'Content-Type: application/json'" in response.json()["error"]["message"]
    assert content_type in response.json()["error"]["message"]


@pytest.mark.usefixtures("unchanged")
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"content-type": "application/json"},
        {"content-type": "application/json; charset=utf-8"},
        {"content-type": "Application/JSON"},
        {"content-type": "application/vnd.controlplane+json"},
    ],
    ids=["no-content-type", "json", "json-charset", "json-capitals", "plus-json"],
)
def test_a_json_body_is_read_with_a_json_content_type_or_none(
    daemon: Daemon, headers: dict[str, str]
) -> None:
    # A name that is refused proves the body was read and parsed as JSON.
    response = _post_raw(daemon, f"/v1/models/{MODEL}/deploy", b'{"release": "../x"}', **headers)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_name"


@pytest.mark.parametrize(
    ("path", "allowed"),
    [(f"/v1/models/{MODEL}", "GET"), ("/v1/alerts", "GET, POST"), ("/healthz", "GET")],
)
def test_a_method_a_path_does_not_have_is_405_naming_every_method_it_has(
    daemon: Daemon, path: str, allowed: str
) -> None:
    for method in ("DELETE", "OPTIONS"):
        response = daemon.http.request(method, path)
        assert response.status_code == 405
        assert response.json()["error"]["code"] == "method_not_allowed"
        assert response.headers["allow"] == allowed


@pytest.mark.usefixtures("unchanged")
def test_mutating_routes_need_the_token(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as anonymous:
        missing = anonymous.post(f"/v1/models/{MODEL}/deploy", json={"release": "r1"})
        wrong = anonymous.post(
            f"/v1/models/{MODEL}/rollback",
            json={},
            headers={"Authorization": "Bearer not-the-token"},
        )
        read = anonymous.get(f"/v1/models/{MODEL}")
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "unauthorized"
    assert "Bearer" in missing.json()["error"]["message"]
    assert wrong.status_code == 401
    assert read.status_code == 200
    assert TOKEN not in daemon.log()


def test_unknown_routes_and_operations_answer_in_the_error_format(daemon: Daemon) -> None:
    route = daemon.get("/v1/nothing-here")
    assert route.status_code == 404
    assert route.json()["error"]["code"] == "not_found"
    operation = daemon.get("/v1/operations/0123456789abcdef")
    assert operation.status_code == 404
    assert operation.json()["error"]["code"] == "operation_not_found"
    assert daemon.get("/docs").status_code == 200
    assert daemon.get("/openapi.json").json()["info"]["title"] == "controlplane"


def test_the_api_refuses_to_bind_beyond_loopback_without_a_token(
    triton: RunningTriton, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(RuntimeError, match=r"api\.token"):
        start_daemon(
            triton=triton,
            store=store,
            workdir=tmp_path,
            extra_env={"CONTROLPLANE_API__HOST": "0.0.0.0"},
        )


@pytest.mark.usefixtures("unchanged")
def test_a_reason_over_500_characters_is_refused_in_characters(daemon: Daemon) -> None:
    response = daemon.post(f"/v1/models/{MODEL}/deploy", {"release": "r1", "reason": "x" * 501})

    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "at most 500 characters" in message, message
