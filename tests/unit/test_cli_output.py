"""How a client command says an error: the API's answer beside it, whatever its keys."""

from __future__ import annotations

import json

import pytest

from controlplane.cli.output import EXIT_FAILED, Format, Out


@pytest.mark.parametrize("fmt", [Format.TABLE, Format.JSON])
def test_an_answer_whose_keys_are_named_like_the_parameters_is_said_beside_the_error(
    fmt: Format, capsys: pytest.CaptureFixture[str]
) -> None:
    answer = {
        "unchanged": True,
        "message": "resnet serves r2 already",
        "code": "x",
        "exit_code": 7,
        "body": {},
        "error": {"code": "not_this_one", "message": "nor this"},
    }

    exit_ = Out(fmt).fail(EXIT_FAILED, "member_failed", "m2: release_too_large", answer)

    assert exit_.exit_code == EXIT_FAILED
    said = capsys.readouterr()
    if fmt is Format.TABLE:
        assert said.err == "error: member_failed: m2: release_too_large\n"
        return
    document = json.loads(said.out)
    assert document["error"] == {"code": "member_failed", "message": "m2: release_too_large"}
    assert (document["message"], document["exit_code"]) == ("resnet serves r2 already", 7)
