"""What each route can answer besides success, as error codes, and its OpenAPI ``responses``.

The mutating routes' codes are named here (a read-only route names its one or two where it is
declared); their statuses come from ``STATUS_BY_CODE`` in ``api/errors.py``, so a status is
never written twice. :func:`answers` gives every status its error body's schema,
a description naming the codes behind it, and the same codes as a list under
``x-error-codes`` for tools (the API fuzzer checks each answer's code against it).
``tests/unit/test_api_schema.py`` keeps its own copy of these lists: a route that starts
answering a new code changes both, on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel

from controlplane.api.errors import statuses_for
from controlplane.api.schemas.envelopes import ErrorBody, OperationEnvelope, UnchangedAnswer

ERROR_CODES_KEY = "x-error-codes"

# A mutating request can be refused by the gates and by a daemon still reconciling.
WRITE_REFUSALS = ("invalid_request", "unsupported_media_type", "request_too_large", "not_ready")
DEPLOY_REFUSALS = (
    "invalid_name",
    "release_not_found",
    "release_incomplete",
    "release_below_floor",
    "operation_in_progress",
    "store_error",
    "store_unavailable",
)
ROLLBACK_REFUSALS = (*DEPLOY_REFUSALS, "model_not_found", "no_previous_release")
UNLOAD_REFUSALS = (
    "invalid_name",
    "model_not_found",
    "operation_in_progress",
    "store_error",
    "store_unavailable",
)
# What a deploy, rollback or unload can end with in a fleet: its publish lost the race, or
# (with "fleet": true) another member could not follow, or did not within the bound.
FLEET_FAILURES = ("desired_state_conflict", "member_failed", "fleet_timeout")
RELOAD_REFUSALS = ("invalid_name", "model_not_found", "no_fallback", "rollback_failed")
# What a waited deploy or rollback can end with: every step of the pipeline can fail.
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
    *FLEET_FAILURES,
)
UNLOAD_FAILURES = (
    "invalid_transition",
    "triton_error",
    "triton_unavailable",
    "triton_timeout",
    "staging_failed",
    "interrupted",
    "store_error",
    "store_unavailable",
    *FLEET_FAILURES,
)
STARTED: dict[int | str, dict[str, Any]] = {
    202: {"model": OperationEnvelope, "description": "The operation started."}
}
SUCCEEDED: dict[int | str, dict[str, Any]] = {
    200: {"model": OperationEnvelope, "description": "With wait: the operation succeeded."}
}
DEPLOYED: dict[int | str, dict[str, Any]] = {
    200: {
        "model": OperationEnvelope | UnchangedAnswer,
        "description": "With wait: the operation succeeded. Or, wait or not: the release "
        "serves already, unchanged in the store, so nothing was done (a deploy with force "
        "loads it again).",
    }
}


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
