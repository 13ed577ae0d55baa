"""How a model's traffic moves to a new release: the strategy, its slots, and the alias.

Under ``blue-green`` a model has two slots, separate Triton models named ``<model>__blue`` and
``<model>__green``, and clients call ``<model>``: an alias, a one-step Triton ensemble that maps
the active slot's inputs and outputs (its :class:`Signature`). Switching traffic is re-pointing
the alias, a reload of the ensemble with a config override (a few milliseconds when the slot is
unchanged); the Triton adapter builds that config. The old slot stays loaded for
``retire_after`` so that a rollback is one more re-point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from controlplane.domain.errors import UnsupportedByAlias


class Strategy(StrEnum):
    BLUE_GREEN = "blue-green"
    INPLACE = "inplace"
    ROLLING = "rolling"  # out of rotation, unload, load: for a model that fits once
    AUTO = "auto"  # blue-green when the new release fits beside the serving one, else rolling

    @property
    def aliased(self) -> bool:
        """Served through an alias in front of two slots (every strategy but inplace: rolling
        and auto keep blue-green's layout, so one deploy can pick either way)."""
        return self is not Strategy.INPLACE

    @property
    def may_roll(self) -> bool:
        """An update may take the member out of rotation (rolling, and auto when the new
        release does not fit beside the serving one)."""
        return self in (Strategy.ROLLING, Strategy.AUTO)


@dataclass(frozen=True)
class TrafficPolicy:
    strategy: Strategy = Strategy.BLUE_GREEN
    retire_after: float = 30.0
    drain_timeout: float = 60.0
    keep_warm: bool = False  # the old slot is never retired: a rollback stays a re-point
    blue_suffix: str = "__blue"
    green_suffix: str = "__green"

    def slots(self, model: str) -> tuple[str, str]:
        return (model + self.blue_suffix, model + self.green_suffix)

    def spare(self, base: str, number: int) -> str:
        """The ``number``-th spare of slot ``base``: used while Triton holds ``base`` stuck
        (a load that never ended), since Triton frees a stuck name only when it restarts."""
        return f"{base}-{number}"

    def owns(self, model: str, name: str) -> bool:
        """Whether ``name`` is one of ``model``'s slots (a base slot or one of its spares)."""
        return any(
            name == base or re.fullmatch(re.escape(base) + r"-[0-9]+", name) is not None
            for base in self.slots(model)
        )


def check_aliasable(model: str, *, decoupled: bool, sequence_batching: bool) -> None:
    """Refuse models a one-step ensemble cannot front, naming ``inplace`` as the way."""
    if decoupled or sequence_batching:
        kind = "decoupled" if decoupled else "sequence-batched"
        raise UnsupportedByAlias(
            f"model {model!r} is {kind}; a Triton ensemble alias cannot front it, so "
            "blue-green is not possible. Set strategy: inplace for this model"
        )


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # Triton's type name, TYPE_FP32, ...
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs as Triton serves them: what an alias must forward."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    max_batch_size: int = 0

    def same_as(self, other: Signature) -> bool:
        """Same tensors (in any order) and the same batching: clients see no difference."""
        return (
            sorted(self.inputs, key=_by_name) == sorted(other.inputs, key=_by_name)
            and sorted(self.outputs, key=_by_name) == sorted(other.outputs, key=_by_name)
            and self.max_batch_size == other.max_batch_size
        )


def _by_name(tensor: Tensor) -> str:
    return tensor.name
