"""``smoke.json``: a sample request a release may ship, with an optional expected answer.

Format (all keys but ``inputs`` optional)::

    {
      "inputs":   {"INPUT0": {"datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}},
      "expected": {"OUTPUT0": [2.0, 4.0]},
      "tolerance": 1e-5
    }

Without ``smoke.json`` the preflight generates inputs from the model config (ones, ``-1``
dims as 1). Either way the answer must carry every output the served config declares, none
of them empty unless its dims allow it (:func:`check_answer`): Triton serves an answer that
lacks an output, or holds zero elements, without an error, and clients would get
``"outputs": []`` or ``"data": []`` from a release that looked healthy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.domain.errors import PreflightFailed
from controlplane.domain.traffic import Tensor

SMOKE_NAME = "smoke.json"
DATATYPES = frozenset(
    {"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"}
    | {"FP16", "FP32", "FP64", "BYTES"}
)


@dataclass(frozen=True)
class SmokeTensor:
    datatype: str
    shape: tuple[int, ...]
    data: tuple[object, ...]


@dataclass(frozen=True)
class SmokeSample:
    inputs: dict[str, SmokeTensor]
    expected: dict[str, tuple[float, ...]] | None = None
    tolerance: float = 1e-5
    notes: dict[str, str] = field(default_factory=dict)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def parse_smoke(text: str) -> SmokeSample:
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise PreflightFailed(f"{SMOKE_NAME} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("inputs"), dict) or not raw["inputs"]:
        raise PreflightFailed(f'{SMOKE_NAME} needs an "inputs" object naming each input')
    inputs = {}
    for name, tensor in raw["inputs"].items():
        if not isinstance(tensor, dict):
            raise PreflightFailed(f"{SMOKE_NAME}: input {name!r} must be an object")
        datatype = str(tensor.get("datatype", "")).upper()
        if datatype not in DATATYPES:
            raise PreflightFailed(f"{SMOKE_NAME}: input {name!r} has unknown datatype {datatype!r}")
        shape, data = tensor.get("shape"), tensor.get("data")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise PreflightFailed(f"{SMOKE_NAME}: input {name!r} needs a shape of whole numbers")
        if not isinstance(data, list):
            raise PreflightFailed(f"{SMOKE_NAME}: input {name!r} needs a flat 'data' list")
        if len(data) != math.prod(shape):
            raise PreflightFailed(
                f"{SMOKE_NAME}: input {name!r} has {len(data)} values for shape {shape}"
            )
        inputs[name] = SmokeTensor(datatype, tuple(shape), tuple(data))
    expected = raw.get("expected")
    if expected is not None:
        if not isinstance(expected, dict) or not all(
            isinstance(v, list) for v in expected.values()
        ):
            raise PreflightFailed(f'{SMOKE_NAME}: "expected" maps output names to flat lists')
        try:
            expected = {k: tuple(_number(x) for x in v) for k, v in expected.items()}
        except (TypeError, ValueError):
            raise PreflightFailed(f'{SMOKE_NAME}: "expected" values must be numbers') from None
    try:
        tolerance = _number(raw.get("tolerance", 1e-5))
    except (TypeError, ValueError):
        raise PreflightFailed(f'{SMOKE_NAME}: "tolerance" must be a number') from None
    if not math.isfinite(tolerance) or tolerance < 0:
        raise PreflightFailed(f'{SMOKE_NAME}: "tolerance" must be finite and at least 0')
    return SmokeSample(inputs=inputs, expected=expected, tolerance=tolerance)


def check_answer(declared: Sequence[Tensor], answered: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a smoke answer that lacks a declared output or holds an empty one.

    ``declared`` are the outputs of the served config; ``answered`` maps each output of the
    answer to its shape. An output may be empty only when its declared dims have a 0 (``-1``
    dims are variable, but a model that answers nothing there is broken all the same).
    """
    for tensor in declared:
        shape = answered.get(tensor.name)
        if shape is None:
            returned = ", ".join(repr(name) for name in sorted(answered)) or "no output at all"
            raise PreflightFailed(
                f"the smoke answer has no output {tensor.name!r}, which config.pbtxt declares "
                f"(it returned {returned}); make model.py return every declared output under "
                "the name config.pbtxt gives it, or rename the output in config.pbtxt",
                details={"output": tensor.name, "problem": "missing"},
            )
        if math.prod(shape) == 0 and 0 not in tensor.dims:
            raise PreflightFailed(
                f"the smoke answer's output {tensor.name!r} is empty (shape {list(shape)}) "
                f"although config.pbtxt declares dims {list(tensor.dims)}; make model.py "
                "return values of the declared shape for it",
                details={"output": tensor.name, "problem": "empty"},
            )
