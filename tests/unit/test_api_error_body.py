"""The API's error body: an error's details beside its code and message, whatever their keys."""

from __future__ import annotations

from controlplane.api.errors import error_body


def test_details_named_like_the_parameters_or_error_neither_crash_nor_replace_it() -> None:
    details = {"code": "x", "message": "y", "error": "z", "fleet": {"converged": False}}

    body = error_body("member_failed", "m2: release_too_large", **details)

    assert body == {
        "error": {"code": "member_failed", "message": "m2: release_too_large"},
        "code": "x",
        "message": "y",
        "fleet": {"converged": False},
    }
