"""What a smoke answer must hold before a release takes traffic, and how it is decoded.

Triton serves an answer that lacks a declared output (model.py returned another name) or holds
zero elements without an error: clients would get ``"outputs": []`` or ``"data": []``. The
check is a pure function of the served config's outputs and the answer's shapes; decoding the
answer (Triton's ``ModelInferResponse``) turns data that does not fit its shape into the same
refusal instead of an internal error.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from controlplane.adapters.triton.preflight import decode_answer
from controlplane.adapters.triton.protocol import ModelInferResponse
from controlplane.domain.errors import PreflightFailed
from controlplane.domain.smoke import check_answer
from controlplane.domain.traffic import Tensor

OUTPUT0 = Tensor("OUTPUT0", "TYPE_FP32", (-1,))
LABEL = Tensor("LABEL", "TYPE_STRING", (1,))


def test_an_answer_with_every_declared_output_passes() -> None:
    check_answer((OUTPUT0, LABEL), {"OUTPUT0": (1, 3), "LABEL": (1, 1)})


def test_an_answer_may_carry_more_than_is_declared() -> None:
    check_answer((OUTPUT0,), {"OUTPUT0": (2,), "DEBUG": (4,)})


def test_a_missing_output_is_refused_naming_it_and_what_came_instead() -> None:
    declared = (Tensor("OUTPUTX", "TYPE_FP32", (1,)),)

    with pytest.raises(PreflightFailed) as raised:
        check_answer(declared, {"OUTPUT0": (1,)})

    assert raised.value.code == "preflight_failed"
    message = raised.value.message
    assert "no output 'OUTPUTX'" in message
    assert "it returned 'OUTPUT0'" in message
    assert "make model.py return every declared output" in message
    assert raised.value.details == {"output": "OUTPUTX", "problem": "missing"}


def test_an_answer_with_no_output_at_all_is_refused() -> None:
    with pytest.raises(PreflightFailed, match=r"no output 'OUTPUT0'.*no output at all"):
        check_answer((OUTPUT0,), {})


@pytest.mark.parametrize("dims", [(1,), (-1,), (-1, 4)], ids=["fixed", "variable", "mixed"])
@pytest.mark.parametrize("shape", [(0,), (1, 0), (0, 4)], ids=["flat", "batched", "no-rows"])
def test_an_empty_output_is_refused_unless_its_dims_allow_it(
    dims: tuple[int, ...], shape: tuple[int, ...]
) -> None:
    with pytest.raises(PreflightFailed) as raised:
        check_answer((Tensor("OUTPUT0", "TYPE_FP32", dims),), {"OUTPUT0": shape})

    message = raised.value.message
    assert f"output 'OUTPUT0' is empty (shape {list(shape)})" in message
    assert f"declares dims {list(dims)}" in message
    assert raised.value.details == {"output": "OUTPUT0", "problem": "empty"}


def test_an_empty_output_whose_dims_have_a_zero_passes() -> None:
    check_answer((Tensor("MASK", "TYPE_BOOL", (0,)),), {"MASK": (1, 0)})


def test_a_scalar_answer_is_not_empty() -> None:
    check_answer((Tensor("SCORE", "TYPE_FP32", (1,)),), {"SCORE": ()})


def _result(*outputs: tuple[str, str, list[int], bytes]) -> Any:
    """An answer as Triton sends it over gRPC."""
    return ModelInferResponse(
        model_name="m",
        outputs=[
            ModelInferResponse.InferOutputTensor(name=n, datatype=t, shape=s)
            for n, t, s, _ in outputs
        ],
        raw_output_contents=[raw for *_, raw in outputs],
    )


def test_decoding_gives_every_output_with_its_shape_and_values() -> None:
    names = b"".join(struct.pack("<I", len(word)) + word for word in (b"cat", b""))

    outputs = decode_answer(
        "m",
        _result(
            ("OUTPUT0", "FP32", [1, 2], struct.pack("<2f", 1.0, 2.5)),
            ("EMPTY", "FP32", [0], b""),
            ("LABEL", "BYTES", [2, 1], names),
            ("COUNT", "INT64", [], struct.pack("<q", -3)),
        ),
    )

    assert (outputs["OUTPUT0"].shape, outputs["OUTPUT0"].values) == ((1, 2), (1.0, 2.5))
    assert (outputs["EMPTY"].shape, outputs["EMPTY"].values) == ((0,), ())
    assert (outputs["LABEL"].shape, outputs["LABEL"].values) == ((2, 1), (b"cat", b""))
    assert (outputs["COUNT"].shape, outputs["COUNT"].values) == ((), (-3,))


def test_data_that_does_not_fit_its_shape_is_a_preflight_failure_naming_the_output() -> None:
    # What the tester saw as "500 internal_error: ValueError('cannot reshape array of size 0
    # into shape (1,)')": an output that says shape [1] and carries no bytes.
    fine = struct.pack("<f", 1.0)
    answer = _result(("OUTPUT0", "FP32", [1], fine), ("OUTPUT1", "FP32", [1], b""))

    with pytest.raises(PreflightFailed) as raised:
        decode_answer("m__green", answer)

    message = raised.value.message
    assert "answer of 'm__green' cannot be decoded: output 'OUTPUT1' is FP32 of shape [1]" in (
        message
    )
    assert "0 bytes of data where shape [1] of FP32 (4 bytes each) takes 4" in message
    assert "make model.py return" in message
    assert raised.value.details == {"output": "OUTPUT1", "problem": "undecodable"}
