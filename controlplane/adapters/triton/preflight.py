"""Smoke inference for the preflight: one request to a freshly loaded slot, checked.

Inputs come from the release's ``smoke.json`` or are generated from the model config (ones,
``-1`` dims as 1, a batch of one when the model batches); the answer is decoded here, and
checked against the config by :func:`controlplane.domain.smoke.check_answer`. Tensors are
:class:`.tensors.Array` (the standard library on Triton's wire format, no numpy).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from controlplane.adapters.triton.tensors import FORMATS, Array, Value, decode
from controlplane.domain.errors import PreflightFailed
from controlplane.domain.smoke import SmokeSample

SHOWN = 16  # values of each output the operation records


def generated_inputs(config: Mapping[str, Any]) -> dict[str, Array]:
    """Inputs of the right shape and datatype for ``config`` (Triton's JSON model config)."""
    batched = int(config.get("max_batch_size", 0)) > 0
    inputs = {}
    for tensor in config.get("input", []):
        datatype = str(tensor["data_type"]).removeprefix("TYPE_").replace("STRING", "BYTES")
        dims = [1 if int(d) < 0 else int(d) for d in tensor.get("dims", [])]
        shape = (1, *dims) if batched else tuple(dims)
        if datatype not in FORMATS and datatype != "BYTES":
            raise PreflightFailed(
                f"cannot generate a smoke input of type {datatype}; ship smoke.json"
            )
        inputs[str(tensor["name"])] = Array.filled(datatype, shape)
    return inputs


def sample_inputs(sample: SmokeSample) -> dict[str, Array]:
    arrays = {}
    for name, tensor in sample.inputs.items():
        try:
            arrays[name] = Array.of(tensor.datatype, tensor.shape, tensor.data)
        except ValueError as exc:
            raise PreflightFailed(f"smoke.json input {name!r}: {exc}") from None
    return arrays


def decode_answer(model: str, response: Any) -> dict[str, Array]:
    """Every output of an inference answer (Triton's ``ModelInferResponse``).

    An output whose data does not fit the shape and datatype the answer gives it is the
    model's fault, so it is a :class:`PreflightFailed` naming the output, not an internal
    error of the daemon. The i-th output's data is the i-th raw content; an output with none
    has its ``contents.bytes_contents`` (BYTES) or no data at all.
    """
    outputs = {}
    raw_contents = response.raw_output_contents
    for index, out in enumerate(response.outputs):
        name, datatype = str(out.name), str(out.datatype)
        shape = tuple(int(d) for d in out.shape)
        try:
            if index < len(raw_contents):
                outputs[name] = decode(datatype, shape, bytes(raw_contents[index]))
            elif out.contents.bytes_contents:
                values = tuple(bytes(v) for v in out.contents.bytes_contents)
                if len(values) != math.prod(shape):
                    count = math.prod(shape)
                    raise ValueError(
                        f"{len(values)} values where shape {list(shape)} takes {count}"
                    )
                outputs[name] = Array(datatype, shape, values)
            else:
                outputs[name] = decode(datatype, shape, b"")
        except ValueError as exc:
            raise PreflightFailed(
                f"the answer of {model!r} cannot be decoded: output {name!r} is "
                f"{datatype or '?'} of shape {list(shape)} but its data does not fit ({exc}); "
                "make model.py return for it an array of the shape and datatype it declares",
                details={"output": name, "problem": "undecodable"},
            ) from exc
    return outputs


def check_outputs(outputs: Mapping[str, Array], sample: SmokeSample | None) -> dict[str, list[Any]]:
    """Compare with the expected answer, if the sample has one; return what was seen: the
    first values of each output (numbers, bools, or text for BYTES, so that the operation's
    record is JSON)."""
    seen = {name: [_shown(v) for v in array.values[:SHOWN]] for name, array in outputs.items()}
    if sample is None or sample.expected is None:
        return seen
    for name, expected in sample.expected.items():
        if name not in outputs:
            raise PreflightFailed(f"smoke inference returned no output {name!r}")
        got = _floats(name, outputs[name])
        want = [float(x) for x in expected]
        tol = sample.tolerance
        if len(got) != len(want) or not all(
            _close(g, w, tol) for g, w in zip(got, want, strict=True)
        ):
            raise PreflightFailed(
                f"smoke inference: {name} was {got[:8]}, expected {want[:8]}",
                details={"output": name},
            )
    return seen


def _floats(name: str, array: Array) -> list[float]:
    try:
        return [float(v) for v in array.values]
    except ValueError:
        raise PreflightFailed(
            f"smoke inference: {name} is {array.datatype}, which smoke.json's expected numbers "
            'cannot be compared with; leave it out of "expected"',
            details={"output": name},
        ) from None


def _close(got: float, want: float, tol: float) -> bool:
    """numpy's ``allclose`` with ``rtol = atol = tol``: infinities are close only to
    themselves, NaN to nothing."""
    if math.isinf(got) or math.isinf(want):
        return got == want
    return abs(got - want) <= tol + tol * abs(want)


def _shown(value: Value) -> Value | str:
    return value.decode("utf-8", "backslashreplace") if isinstance(value, bytes) else value
