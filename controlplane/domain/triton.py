"""Triton's own word for a model's state, as its repository index reports it.

The driver maps Triton's strings onto :class:`TritonState` once, where it reads the index;
everything after compares enum members. A state this code does not know (a newer Triton) is
:attr:`TritonState.UNKNOWN`: shown as such, never acted on as if it were one of the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Protocol, TypeVar


class TritonState(StrEnum):
    READY = "READY"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"
    UNKNOWN = "UNKNOWN"

    @classmethod
    def parse(cls, text: str) -> TritonState:
        """Triton's string (``READY``); UNAVAILABLE for an empty one (a model Triton knows
        only as a dir it has not loaded), UNKNOWN for one this code does not know."""
        if not text:
            return cls.UNAVAILABLE
        try:
            return cls(text.upper())
        except ValueError:
            return cls.UNKNOWN

    @property
    def busy(self) -> bool:
        """Triton is working on the name: wait for it, never act on it."""
        return self in (TritonState.LOADING, TritonState.UNLOADING)


class _Row(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def state(self) -> TritonState: ...


IndexRow = TypeVar("IndexRow", bound=_Row)


def index_by_name(entries: Iterable[IndexRow]) -> dict[str, IndexRow]:
    """Triton's index by model name; a READY row wins when a model lists several versions."""
    found: dict[str, IndexRow] = {}
    for entry in entries:
        if entry.name not in found or entry.state is TritonState.READY:
            found[entry.name] = entry
    return found
