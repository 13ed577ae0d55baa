"""Smoke inference for the preflight: one request to a freshly loaded slot, checked.

Inputs come from the release's ``smoke.json`` or are generated from the model config (ones,
``-1`` dims as 1, a batch of one when the model batches). numpy stays in this adapter.
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
