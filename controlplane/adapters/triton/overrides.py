"""The config overrides the daemon loads into Triton, in Triton's JSON form.

Two intents need a config that is not on disk: an alias (a one-step ensemble that forwards a
slot's inputs and outputs, re-pointed by reloading it with another target) and a CPU-only
reload (the same model with every instance on CPU, which Triton applies in place). Both are
built here, from Triton's own JSON of the served config, so services never see that JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controlplane.domain.traffic import Signature, Tensor


def signature_of(config: Mapping[str, Any]) -> Signature:
    """The inputs and outputs of a served config (``get_model_config`` as JSON)."""

    def tensors(kind: str) -> tuple[Tensor, ...]:
        return tuple(
            Tensor(
                name=str(t["name"]),
                data_type=str(t.get("data_type", "")),
                dims=tuple(int(d) for d in t.get("dims", ())),
            )
            for t in config.get(kind, ())
        )

    return Signature(
        inputs=tensors("input"),
        outputs=tensors("output"),
        max_batch_size=int(config.get("max_batch_size", 0) or 0),
    )


def alias_config(alias: str, slot: str, signature: Signature) -> dict[str, Any]:
    """The one-step ensemble named ``alias`` that forwards everything to ``slot``."""

    def tensors(items: Sequence[Tensor]) -> list[dict[str, Any]]:
        return [{"name": t.name, "data_type": t.data_type, "dims": list(t.dims)} for t in items]

    return {
        "name": alias,
        "platform": "ensemble",
        "max_batch_size": signature.max_batch_size,
        "input": tensors(signature.inputs),
        "output": tensors(signature.outputs),
        "ensemble_scheduling": {
            "step": [
                {
                    "model_name": slot,
                    "model_version": -1,
                    "input_map": {t.name: t.name for t in signature.inputs},
                    "output_map": {t.name: t.name for t in signature.outputs},
                }
            ]
        },
    }


def alias_target(config: Mapping[str, Any]) -> str | None:
    """The slot an alias config points at; None when it is not a one-step ensemble."""
    if config.get("platform") != "ensemble":
        return None
    steps = config.get("ensemble_scheduling", {}).get("step", [])
    return str(steps[0]["model_name"]) if len(steps) == 1 else None


def cpu_only_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The same model config with every instance on CPU.

    Only ``instance_group`` changes, which Triton applies as an in-place update. The count is
    the total of the groups it replaces (at least one), so the model keeps its parallelism.
    """
    groups = config.get("instance_group") or []
    count = sum(int(group.get("count", 1) or 1) for group in groups) or 1
    changed = dict(config)
    changed["instance_group"] = [{"kind": "KIND_CPU", "count": count}]
    return changed
