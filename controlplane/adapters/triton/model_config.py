"""``config.pbtxt`` read and rewritten with Triton's own schema.

Parsing uses Triton's ``ModelConfig`` message (``model_config.proto`` as tritonclient compiled
it, built into :mod:`.protocol` at build time) with protobuf's text format, the same schema
Triton applies, so a config that Triton would reject is refused before anything is placed. The
``name`` is rewritten to the Triton model the release is placed as.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import text_format

from controlplane.adapters.triton.protocol import ModelConfig, ModelInstanceGroup
from controlplane.domain.errors import InvalidModelConfig
from controlplane.ports import ModelSummary

# parameters { key: "controlplane.memory_hint_bytes" value { string_value: "2147483648" } }
MEMORY_HINT = "controlplane.memory_hint_bytes"


class ProtobufConfigEditor:
    def prepare(self, config_path: Path, name: str) -> ModelSummary:
        try:
            text = config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidModelConfig(f"cannot read config.pbtxt: {exc}") from exc
        config = ModelConfig()
        try:
            text_format.Parse(text, config)
        except text_format.ParseError as exc:
            raise InvalidModelConfig(
                f"config.pbtxt does not parse with Triton's model config schema: {exc}"
            ) from exc
        if not config.backend and not config.platform:
            raise InvalidModelConfig(
                "config.pbtxt names neither a 'backend' nor a 'platform'; Triton cannot load it"
            )
        hint = _memory_hint(config)
        config.name = name
        tmp = config_path.with_suffix(".pbtxt.tmp")
        tmp.write_text(text_format.MessageToString(config), encoding="utf-8")
        tmp.replace(config_path)
        return ModelSummary(
            name=name,
            backend=config.backend or config.platform,
            decoupled=bool(config.model_transaction_policy.decoupled),
            sequence_batching=config.HasField("sequence_batching"),
            instance_kinds=tuple(
                ModelInstanceGroup.Kind.Name(group.kind) for group in config.instance_group
            ),
            memory_hint=hint,
            instances=_instances(config),
        )


def _instances(config: Any) -> int:
    """Model instances the config asks for: each group's count (Triton reads 0 as 1) on each
    GPU it names; a group on every GPU counts once, since the GPUs are not known here."""
    total = sum(
        max(1, int(group.count)) * max(1, len(group.gpus)) for group in config.instance_group
    )
    return max(1, total)


def _memory_hint(config: Any) -> int | None:
    """The release's own estimate of the memory its load needs, if it gives one."""
    if MEMORY_HINT not in config.parameters:
        return None
    raw = config.parameters[MEMORY_HINT].string_value.strip()
    try:
        hint = int(raw)
    except ValueError:
        hint = -1
    if hint <= 0:
        raise InvalidModelConfig(
            f"parameter {MEMORY_HINT!r} is {raw!r}; give a positive number of bytes, "
            'e.g. string_value: "2147483648" for 2 GiB'
        )
    return hint
