"""The OpenAPI document promises exactly the statuses and error codes the API answers.

The table below is the maintained list of what each route can answer. A route that starts
answering a new code must say so in its ``responses`` (``api/routes/``) and here; the statuses
always come from ``STATUS_BY_CODE``. The API fuzzer (tests/integration/test_api_fuzz.py) checks
the other direction: that every answer the real daemon gives is one documented here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.api.app import create_app  # also defines the API's own error classes
from controlplane.api.errors import STATUS_BY_CODE
from controlplane.api.schemas.names import MODEL_NAME_PATTERN, NAME_PATTERN
from controlplane.domain import errors as domain_errors
from controlplane.domain.errors import ControlPlaneError, InvalidName
from controlplane.domain.names import MAX_NAME_LENGTH, validate_model_name, validate_release_name
from controlplane.settings import Settings

WRITE = ("invalid_request", "unsupported_media_type", "request_too_large", "not_ready")
LOAD_FAILURES = (
    "release_not_found",
    "release_incomplete",
    "release_changed",
    "checksum_mismatch",
    "signature_missing",
    "signature_invalid",
    "signature_unbound",
    "unknown_signer",
    "invalid_release",
    "invalid_model_config",
    "strategy_unsupported",
    "insufficient_memory",
    "memory_not_returned",
    "would_be_an_outage",
    "insufficient_disk",
    "release_too_large",
    "triton_load_failed",
    "preflight_failed",
    "invalid_transition",
    "store_error",
    "store_unavailable",
    "triton_error",
    "triton_unavailable",
    "triton_timeout",
    "staging_failed",
    "name_conflict",
    "interrupted",
    # In a fleet: the publish lost the race; with "fleet": true, a member could not follow.
    "desired_state_conflict",
    "member_failed",
    "fleet_timeout",
)
DEPLOY = (
    *WRITE,
    "invalid_name",
    "release_not_found",
    "release_incomplete",
    "release_below_floor",
    "operation_in_progress",
    "store_error",
    "store_unavailable",
    *LOAD_FAILURES,
)

# What every rollout control can answer besides its own refusals.
CONTROL = (
    *WRITE,
    "invalid_name",
    "model_not_found",
    "desired_state_conflict",
    "store_error",
    "store_unavailable",
)

# (method, path) -> (success statuses, error codes it can answer without a token configured)
ROUTES: dict[tuple[str, str], tuple[set[int], set[str]]] = {
    ("get", "/healthz"): ({200}, set()),
    ("get", "/readyz"): (
        {200},
        {"not_ready", "out_of_rotation", "triton_unavailable", "not_serving"},
    ),
    ("get", "/metrics"): ({200}, set()),
    ("get", "/v1/memory"): ({200}, set()),
    ("get", "/v1/config"): ({200}, set()),
    ("get", "/v1/fleet"): ({200}, {"invalid_request", "store_error", "store_unavailable"}),
    ("post", "/v1/fleet/wake"): (
        {202},
        {"invalid_request", "unsupported_media_type", "request_too_large"},
    ),
    ("get", "/v1/models"): ({200}, {"invalid_request", "invalid_name"}),
    ("get", "/v1/models/{name}"): ({200}, {"invalid_name", "model_not_found"}),
    ("post", "/v1/models/{name}/deploy"): ({200, 202}, set(DEPLOY)),
    ("post", "/v1/models/{name}/rollback"): (
        {200, 202},
        {*DEPLOY, "model_not_found", "no_previous_release"},
    ),
    ("post", "/v1/models/{name}/unload"): (
        {200, 202},
        {
            *WRITE,
            "invalid_name",
            "model_not_found",
            "operation_in_progress",
            "invalid_transition",
            "triton_error",
            "triton_unavailable",
            "triton_timeout",
            "staging_failed",
            "interrupted",
            "store_error",
            "store_unavailable",
            "desired_state_conflict",
            "member_failed",
            "fleet_timeout",
        },
    ),
    ("post", "/v1/models/{name}/rollout/pause"): (
        {200},
        {*CONTROL, "no_rollout_in_progress", "rollout_already_paused"},
    ),
    ("post", "/v1/models/{name}/rollout/resume"): ({200}, {*CONTROL, "rollout_not_paused"}),
    ("post", "/v1/models/{name}/rollout/promote"): ({200}, {*CONTROL, "no_rollout_in_progress"}),
    ("post", "/v1/models/{name}/rollout/abort"): ({200}, {*CONTROL, "no_rollout_in_progress"}),
    ("get", "/v1/operations/{operation_id}"): ({200}, {"operation_not_found"}),
    ("get", "/v1/operations"): ({200}, {"invalid_request", "invalid_name"}),
    ("post", "/v1/alerts"): ({200}, set(WRITE)),
    ("get", "/v1/alerts"): ({200}, {"invalid_request"}),
    ("post", "/api/v1/model/reload"): (
        {200},
        {*WRITE, "invalid_name", "model_not_found", "no_fallback", "rollback_failed"},
    ),
}


PROBES = ("/healthz", "/readyz")
TOKENS = [(None, None), ("t0ken", None), ("t0ken", "r3ad")]
TOKEN_IDS = ["no-token", "token", "read-token"]


def _document(tmp_path: Path, token: str | None, read_token: str | None = None) -> dict[str, Any]:
    settings = Settings(
        repository={"path": tmp_path / "repository"},
        store={"uri": (tmp_path / "store").as_uri()},
        api={"token": token, "read_token": read_token},
    )
    document: dict[str, Any] = create_app(settings).openapi()
    return document


def _operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }


def _all_subclasses(cls: type[ControlPlaneError]) -> list[type[ControlPlaneError]]:
    found: list[type[ControlPlaneError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_all_subclasses(sub)]
    return found


def test_every_error_code_of_the_domain_has_a_status() -> None:
    classes: list[type[ControlPlaneError]] = [
        ControlPlaneError,
        *_all_subclasses(ControlPlaneError),
    ]
    from_domain = [c for c in classes if c.__module__ == domain_errors.__name__]
    assert len(from_domain) >= 25  # the walk found the tree drawn in domain/errors.py
    missing = sorted({c.code for c in classes} - set(STATUS_BY_CODE))
    assert missing == [], f"codes with no HTTP status in api/errors.py: {missing}"


def _gate_codes(route: tuple[str, str], token: str | None, read_token: str | None) -> set[str]:
    """What the token gate answers on ``route`` besides the route's own codes."""
    method, path = route
    if token is None:
        return set()
    if method == "post" and path != "/v1/fleet/wake":
        return {"unauthorized", *({"forbidden"} if read_token else set())}
    if method == "get" and path not in PROBES and read_token is not None:
        return {"unauthorized"}
    return set()


@pytest.mark.parametrize(("token", "read_token"), TOKENS, ids=TOKEN_IDS)
def test_each_route_documents_exactly_the_statuses_its_codes_are_answered_with(
    tmp_path: Path, token: str | None, read_token: str | None
) -> None:
    operations = _operations(_document(tmp_path, token, read_token))
    assert set(operations) == set(ROUTES)
    for route, (successes, codes) in ROUTES.items():
        codes = {*codes, *_gate_codes(route, token, read_token)}
        expected: dict[str, set[str]] = {}
        for code in codes:
            expected.setdefault(str(STATUS_BY_CODE[code]), set()).add(code)
        responses = operations[route]["responses"]
        documented = {
            status: set(answer.get("x-error-codes", ()))
            for status, answer in responses.items()
            if int(status) >= 400
        }
        assert documented == expected, route
        assert {int(s) for s in responses} == successes | {int(s) for s in expected}, route
        for status, named in expected.items():
            for code in named:
                assert f"`{code}`" in responses[status]["description"], (route, status, code)


def test_error_answers_are_documented_with_the_error_body(tmp_path: Path) -> None:
    document = _document(tmp_path, "t0ken")
    schemas = document["components"]["schemas"]
    for route, operation in _operations(document).items():
        for status, answer in operation["responses"].items():
            if int(status) < 400:
                continue
            ref = answer["content"]["application/json"]["schema"]["$ref"]
            body = schemas[ref.rsplit("/", 1)[-1]]
            assert body["required"] == ["error"], (route, status)
            error = schemas[body["properties"]["error"]["$ref"].rsplit("/", 1)[-1]]
            assert set(error["required"]) == {"code", "message"}, (route, status)
    failure = schemas["OperationFailure"]["properties"]["operation"]
    assert "#/components/schemas/OperationAnswer" in str(failure)


def test_fastapis_default_422_is_not_documented(tmp_path: Path) -> None:
    document = _document(tmp_path, None)
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert "ValidationError" not in document["components"]["schemas"]
    assert "Validation Error" not in str(document)


@pytest.mark.parametrize(("token", "read_token"), TOKENS, ids=TOKEN_IDS)
def test_routes_declare_the_token_they_need_only_when_one_is_set(
    tmp_path: Path, token: str | None, read_token: str | None
) -> None:
    document = _document(tmp_path, token, read_token)
    for (method, path), operation in _operations(document).items():
        # The wake changes nothing: another member asks this one to read the store now.
        writes = token is not None and method == "post" and path != "/v1/fleet/wake"
        reads = read_token is not None and method == "get" and path not in PROBES
        if writes:
            assert operation["security"] == [{"bearer": []}], (method, path)
        elif reads:
            assert operation["security"] == [{"bearer": []}, {"basic": []}], (method, path)
        else:
            assert "security" not in operation, (method, path)
    schemes = document.get("components", {}).get("securitySchemes", {})
    # Bearer is declared even with no token set (Swagger UI's Authorize button), used by none.
    expected = {"bearer", "basic"} if read_token else {"bearer"}
    assert set(schemes) == expected


NAME_ALPHABET = st.sampled_from("aZ09._-/ é_")


@given(st.text(NAME_ALPHABET, max_size=12) | st.from_regex(NAME_PATTERN, fullmatch=True))
def test_the_documented_name_patterns_are_the_domains_rules(name: str) -> None:
    for pattern, validate in (
        (MODEL_NAME_PATTERN, validate_model_name),
        (NAME_PATTERN, validate_release_name),
    ):
        try:
            validate(name)
            valid = True
        except InvalidName:
            valid = False
        documented = re.fullmatch(pattern, name) is not None and len(name) <= MAX_NAME_LENGTH
        assert documented == valid, (pattern, name)


def test_the_documented_status_table_is_the_api_table() -> None:
    api_doc = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")
    table = api_doc.split("The status of each code", 1)[1].split("\n\n", 2)[1]
    documented: dict[int, set[str]] = {}
    for row in re.finditer(r"^\| (\d{3}) \| (.+) \|$", table, flags=re.MULTILINE):
        documented[int(row[1])] = set(re.findall(r"`([a-z_]+)`", row[2]))
    expected: dict[int, set[str]] = {}
    for code, status in STATUS_BY_CODE.items():
        expected.setdefault(status, set()).add(code)
    assert documented == expected
