"""Smoke inference for the preflight: one request to a freshly loaded slot, checked.

Inputs come from the release's ``smoke.json`` or are generated from the model config (ones,
``-1`` dims as 1, a batch of one when the model batches); the answer is decoded here, and
checked against the config by :func:`controlplane.domain.smoke.check_answer`. numpy stays in
this adapter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from controlplane.domain.errors import PreflightFailed
from controlplane.domain.smoke import SmokeSample

_NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


def generated_inputs(config: Mapping[str, Any]) -> dict[str, np.ndarray[Any, Any]]:
    """Inputs of the right shape and dtype for ``config`` (Triton's JSON model config)."""
    batched = int(config.get("max_batch_size", 0)) > 0
    inputs = {}
    for tensor in config.get("input", []):
        datatype = str(tensor["data_type"]).removeprefix("TYPE_").replace("STRING", "BYTES")
        dims = [1 if int(d) < 0 else int(d) for d in tensor.get("dims", [])]
        shape = [1, *dims] if batched else dims
        dtype = _NUMPY.get(datatype)
        if dtype is None:
            raise PreflightFailed(
                f"cannot generate a smoke input of type {datatype}; ship smoke.json"
            )
        if dtype is np.object_:
            inputs[str(tensor["name"])] = np.full(shape, b"", dtype=np.object_)
        else:
            inputs[str(tensor["name"])] = np.ones(shape, dtype=dtype)
    return inputs


def sample_inputs(sample: SmokeSample) -> dict[str, np.ndarray[Any, Any]]:
    arrays = {}
    for name, tensor in sample.inputs.items():
        dtype = _NUMPY[tensor.datatype]
        try:
            arrays[name] = np.array(tensor.data, dtype=dtype).reshape(tensor.shape)
        except ValueError as exc:
            raise PreflightFailed(f"smoke.json input {name!r}: {exc}") from None
    return arrays


def decode_answer(model: str, result: Any) -> dict[str, np.ndarray[Any, Any]]:
    """Every output of an inference answer (tritonclient's ``InferResult``) as numpy.

    An output whose data does not fit the shape and datatype the answer gives it makes
    tritonclient's reshape raise ValueError: that is the model's fault, so it is a
    :class:`PreflightFailed` naming the output, not an internal error of the daemon.
    """
    outputs = {}
    for out in result.get_response(as_json=True).get("outputs", []):
        name = str(out["name"])
        try:
            outputs[name] = result.as_numpy(name)
        except ValueError as exc:
            shape = [int(d) for d in out.get("shape", [])]
            raise PreflightFailed(
                f"the answer of {model!r} cannot be decoded: output {name!r} is "
                f"{out.get('datatype', '?')} of shape {shape} but its data does not fit ({exc}); "
                "make model.py return for it an array of the shape and datatype it declares",
                details={"output": name, "problem": "undecodable"},
            ) from exc
    return outputs


def check_outputs(
    outputs: Mapping[str, np.ndarray[Any, Any]], sample: SmokeSample | None
) -> dict[str, list[float]]:
    """Compare with the expected answer, if the sample has one; return what was seen."""
    seen = {name: np.asarray(value).reshape(-1).tolist()[:16] for name, value in outputs.items()}
    if sample is None or sample.expected is None:
        return seen
    for name, expected in sample.expected.items():
        if name not in outputs:
            raise PreflightFailed(f"smoke inference returned no output {name!r}")
        got = np.asarray(outputs[name], dtype=np.float64).reshape(-1)
        want = np.asarray(expected, dtype=np.float64)
        tol = sample.tolerance
        if got.shape != want.shape or not np.allclose(got, want, rtol=tol, atol=tol):
            raise PreflightFailed(
                f"smoke inference: {name} was {got.tolist()[:8]}, expected {want.tolist()[:8]}",
                details={"output": name},
            )
    return seen
