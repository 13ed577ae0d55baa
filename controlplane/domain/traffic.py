"""How a model's traffic moves to a new release: the strategy, its slots, and the alias.

Under ``blue-green`` a model has two slots, separate Triton models named ``<model>__blue`` and
``<model>__green``, and clients call ``<model>``: an alias, a one-step Triton ensemble that maps
the active slot's inputs and outputs. Switching traffic is re-pointing the alias, a reload of
the ensemble with a config override (a few milliseconds when the slot is unchanged). The old
slot stays loaded for ``retire_after`` so that a rollback is one more re-point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from controlplane.domain.errors import UnsupportedByAlias


class Strategy(StrEnum):
    BLUE_GREEN = "blue-green"
    INPLACE = "inplace"


@dataclass(frozen=True)
class TrafficPolicy:
    strategy: Strategy = Strategy.BLUE_GREEN
    retire_after: float = 30.0
    drain_timeout: float = 60.0
    blue_suffix: str = "__blue"
    green_suffix: str = "__green"

    def slots(self, model: str) -> tuple[str, str]:
        return (model + self.blue_suffix, model + self.green_suffix)


def check_aliasable(model: str, *, decoupled: bool, sequence_batching: bool) -> None:
    """Refuse models a one-step ensemble cannot front, naming ``inplace`` as the way."""
    if decoupled or sequence_batching:
        kind = "decoupled" if decoupled else "sequence-batched"
        raise UnsupportedByAlias(
            f"model {model!r} is {kind}; a Triton ensemble alias cannot front it, so "
            "blue-green is not possible. Set strategy: inplace for this model"
        )


def _signature(tensors: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, tuple[str, ...]]]:
    return sorted(
        (str(t["name"]), str(t["data_type"]), tuple(str(d) for d in t.get("dims", ())))
        for t in tensors
    )


def same_signature(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two model configs (Triton's JSON) have the same inputs and outputs."""
    return (
        _signature(a.get("input", ())) == _signature(b.get("input", ()))
        and _signature(a.get("output", ())) == _signature(b.get("output", ()))
        and int(a.get("max_batch_size", 0)) == int(b.get("max_batch_size", 0))
    )


def alias_config(alias: str, slot_config: Mapping[str, Any]) -> dict[str, Any]:
    """The one-step ensemble named ``alias`` that forwards everything to the slot."""
    slot = str(slot_config["name"])

    def tensors(kind: str) -> list[dict[str, Any]]:
        return [
            {"name": t["name"], "data_type": t["data_type"], "dims": list(t.get("dims", []))}
            for t in slot_config.get(kind, [])
        ]

    inputs, outputs = tensors("input"), tensors("output")
    return {
        "name": alias,
        "platform": "ensemble",
        "max_batch_size": int(slot_config.get("max_batch_size", 0)),
        "input": inputs,
        "output": outputs,
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": slot,
                    "model_version": -1,
                    "input_map": {t["name"]: t["name"] for t in inputs},
                    "output_map": {t["name"]: t["name"] for t in outputs},
                }
            ]
        },
    }


def alias_target(config: Mapping[str, Any]) -> str | None:
    """The slot an alias config points at."""
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return str(steps[0]["model_name"]) if len(steps) == 1 else None
