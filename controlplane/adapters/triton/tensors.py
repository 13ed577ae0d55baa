"""Tensors on Triton's wire, with the standard library: what a smoke inference sends and reads.

Triton's gRPC API carries a tensor's data in ``raw_input_contents`` / ``raw_output_contents``:
its values flattened row-major, little-endian, each of its datatype's size; a ``BYTES`` tensor
is each element's length (4 bytes, little-endian) followed by the element. numpy is not needed
for that (:mod:`struct` packs and unpacks it), and leaving it out keeps 20 MiB out of an idle
daemon. ``BF16`` is read (the upper half of an FP32) but never generated, as before.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass

Value = bool | int | float | bytes

FORMATS = {  # Triton's datatype -> struct's code (little-endian, standard sizes)
    "BOOL": "?",
    "UINT8": "B",
    "UINT16": "H",
    "UINT32": "I",
    "UINT64": "Q",
    "INT8": "b",
    "INT16": "h",
    "INT32": "i",
    "INT64": "q",
    "FP16": "e",
    "FP32": "f",
    "FP64": "d",
}
_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class Array:
    """A tensor: Triton's datatype (``FP32``, ``BYTES``...), its shape, its values flat."""

    datatype: str
    shape: tuple[int, ...]
    values: tuple[Value, ...]

    @classmethod
    def of(cls, datatype: str, shape: tuple[int, ...], values: tuple[object, ...]) -> Array:
        """Values of any Python type that converts to ``datatype`` (a number given as text,
        an int for a float); ValueError saying which value does not convert or fit."""
        if len(values) != math.prod(shape):
            raise ValueError(f"{len(values)} values do not fill shape {list(shape)}")
        convert = _converter(datatype)
        converted = []
        for value in values:
            try:
                converted.append(convert(value))
            except (TypeError, ValueError, OverflowError) as exc:
                raise ValueError(f"{value!r} is not a valid {datatype} value ({exc})") from None
        array = cls(datatype, tuple(shape), tuple(converted))
        array.raw()  # a value out of the datatype's range says so now, not at the send
        return array

    @classmethod
    def filled(cls, datatype: str, shape: tuple[int, ...]) -> Array:
        """Ones of ``datatype`` (empty bytes for ``BYTES``)."""
        one: Value = b"" if datatype == "BYTES" else _converter(datatype)(1)
        return cls(datatype, tuple(shape), (one,) * math.prod(shape))

    def raw(self) -> bytes:
        """The values as Triton reads them from ``raw_input_contents``."""
        if self.datatype == "BYTES":
            return b"".join(_LENGTH.pack(len(v)) + v for v in self.values if isinstance(v, bytes))
        try:
            return struct.pack(f"<{len(self.values)}{FORMATS[self.datatype]}", *self.values)
        except (struct.error, OverflowError) as exc:
            raise ValueError(f"a value does not fit {self.datatype} ({exc})") from None


def decode(datatype: str, shape: tuple[int, ...], raw: bytes) -> Array:
    """An output from its ``raw_output_contents``; ValueError when the data does not fit the
    shape and datatype (the model's fault: its answer says one thing and carries another)."""
    count = math.prod(shape)
    values: tuple[Value, ...]
    if datatype == "BYTES":
        values = _split(raw)
    elif datatype == "BF16":
        values = _bf16(raw)
    elif datatype in FORMATS:
        size = struct.calcsize(f"<{FORMATS[datatype]}")
        if len(raw) != count * size:
            raise ValueError(
                f"{len(raw)} bytes of data where shape {list(shape)} of {datatype} "
                f"({size} bytes each) takes {count * size}"
            )
        values = struct.unpack(f"<{count}{FORMATS[datatype]}", raw)
    else:
        raise ValueError(f"datatype {datatype!r} is not one Triton defines")
    if len(values) != count:
        raise ValueError(f"{len(values)} values where shape {list(shape)} takes {count}")
    return Array(datatype, shape, values)


def _converter(datatype: str) -> Callable[[object], Value]:
    if datatype == "BYTES":
        return _to_bytes
    code = FORMATS.get(datatype)
    if code is None:
        raise ValueError(f"datatype {datatype!r} cannot be sent")
    if code == "?":
        return _to_bool
    return _to_float if code in "efd" else _to_int


def _to_bool(value: object) -> Value:
    """From a bool or a number, as numpy reads a number into BOOL."""
    if not isinstance(value, bool | int | float):
        raise TypeError(f"{type(value).__name__} is not a boolean")
    return bool(value)


def _to_int(value: object) -> Value:
    """From a number (truncated, as numpy does) or its text."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"{type(value).__name__} is not a number")
    return int(value)


def _to_float(value: object) -> Value:
    if not isinstance(value, int | float | str):
        raise TypeError(f"{type(value).__name__} is not a number")
    return float(value)


def _to_bytes(value: object) -> Value:
    """Text as UTF-8, anything else as its text (as tritonclient serializes BYTES)."""
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def _split(raw: bytes) -> tuple[bytes, ...]:
    values, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise ValueError(f"a BYTES element's length is cut short at byte {at}")
        (length,) = _LENGTH.unpack_from(raw, at)
        at += 4
        if at + length > len(raw):
            raise ValueError(f"a BYTES element of {length} bytes runs past the data's end")
        values.append(raw[at : at + length])
        at += length
    return tuple(values)


def _bf16(raw: bytes) -> tuple[float, ...]:
    if len(raw) % 2:
        raise ValueError(f"{len(raw)} bytes is not a whole number of BF16 values")
    halves = struct.unpack(f"<{len(raw) // 2}H", raw)
    widened = struct.pack(f"<{len(halves)}I", *(half << 16 for half in halves))
    return struct.unpack(f"<{len(halves)}f", widened)
