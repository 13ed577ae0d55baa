"""``config.pbtxt`` through Triton's own schema: name rewritten, the rest kept, bad text refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from controlplane.adapters.triton.model_config import ProtobufConfigEditor
from controlplane.domain.errors import InvalidModelConfig
from controlplane.ports import ModelSummary

PYTHON_MODEL = """\
name: "whatever_the_publisher_called_it"
backend: "python"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ -1, 3 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ -1, 3 ]
  }
]
instance_group [
  { count: 2, kind: KIND_CPU },
  { count: 1, kind: KIND_GPU, gpus: [ 0 ] }
]
dynamic_batching { max_queue_delay_microseconds: 100 }
parameters { key: "k" value: { string_value: "2.5" } }
"""


def parse(text: str) -> Any:
    config = model_config_pb2.ModelConfig()
    text_format.Parse(text, config)
    return config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.pbtxt"
    path.write_text(text, encoding="utf-8")
    return path


def test_prepare_rewrites_the_name_and_keeps_the_rest(tmp_path: Path) -> None:
    path = write(tmp_path, PYTHON_MODEL)

    summary = ProtobufConfigEditor().prepare(path, "resnet__blue")

    written = parse(path.read_text(encoding="utf-8"))
    expected = parse(PYTHON_MODEL)
    assert written.name == "resnet__blue"
    expected.name = "resnet__blue"
    assert written == expected
    assert written.max_batch_size == 8
    assert list(written.input[0].dims) == [-1, 3]
    assert written.parameters["k"].string_value == "2.5"
    assert written.dynamic_batching.max_queue_delay_microseconds == 100
    assert summary == ModelSummary(
        name="resnet__blue",
        backend="python",
        decoupled=False,
        sequence_batching=False,
        instance_kinds=("KIND_CPU", "KIND_GPU"),
        instances=3,  # the /dev/shm regions a Python-backend load takes
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.pbtxt"]  # no temp file left


def test_a_config_without_a_name_gets_one(tmp_path: Path) -> None:
    path = write(tmp_path, 'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n')
    summary = ProtobufConfigEditor().prepare(path, "m")
    assert parse(path.read_text(encoding="utf-8")).name == "m"
    assert summary.backend == "onnxruntime_onnx"
    assert summary.instance_kinds == ()
    assert summary.instances == 1  # Triton makes one instance without an instance_group


def test_decoupled_is_detected(tmp_path: Path) -> None:
    path = write(tmp_path, PYTHON_MODEL + "model_transaction_policy { decoupled: true }\n")
    summary = ProtobufConfigEditor().prepare(path, "m")
    assert summary.decoupled is True
    assert summary.sequence_batching is False
    assert parse(path.read_text(encoding="utf-8")).model_transaction_policy.decoupled is True


def test_explicitly_coupled_is_not_decoupled(tmp_path: Path) -> None:
    path = write(tmp_path, PYTHON_MODEL + "model_transaction_policy { decoupled: false }\n")
    assert ProtobufConfigEditor().prepare(path, "m").decoupled is False


def test_sequence_batching_is_detected(tmp_path: Path) -> None:
    text = PYTHON_MODEL.replace(
        "dynamic_batching { max_queue_delay_microseconds: 100 }",
        "sequence_batching { max_sequence_idle_microseconds: 5000000 }",
    )
    path = write(tmp_path, text)
    summary = ProtobufConfigEditor().prepare(path, "m")
    assert summary.sequence_batching is True
    assert summary.decoupled is False


def test_an_empty_sequence_batching_block_counts(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend: "python"\nsequence_batching { }\n')
    assert ProtobufConfigEditor().prepare(path, "m").sequence_batching is True


@pytest.mark.parametrize(
    "text",
    [
        "this is { not a config",
        'backend: "python"\nmax_batch_size: "eight"\n',
        'backend: "python"\ninput [ { name: "x" data_type: TYPE_NOPE } ]\n',
        'backend "python"\n}',
    ],
    ids=["garbage", "wrong-type", "bad-enum", "unbalanced"],
)
def test_text_that_does_not_parse_is_refused(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InvalidModelConfig) as caught:
        ProtobufConfigEditor().prepare(path, "m")
    assert caught.value.code == "invalid_model_config"
    assert "does not parse with Triton's model config schema" in caught.value.message
    assert path.read_text(encoding="utf-8") == text  # untouched


def test_an_unknown_field_is_refused_and_named(tmp_path: Path) -> None:
    path = write(tmp_path, 'backend: "python"\nmax_batch_sise: 4\n')
    with pytest.raises(InvalidModelConfig, match="max_batch_sise") as caught:
        ProtobufConfigEditor().prepare(path, "m")
    assert "schema" in caught.value.message


def test_neither_backend_nor_platform_is_refused(tmp_path: Path) -> None:
    text = 'name: "m"\nmax_batch_size: 0\n'
    path = write(tmp_path, text)
    with pytest.raises(InvalidModelConfig) as caught:
        ProtobufConfigEditor().prepare(path, "m")
    assert caught.value.code == "invalid_model_config"
    assert "'backend'" in caught.value.message
    assert "'platform'" in caught.value.message
    assert path.read_text(encoding="utf-8") == text


def test_a_missing_or_binary_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelConfig, match=r"cannot read config\.pbtxt"):
        ProtobufConfigEditor().prepare(tmp_path / "config.pbtxt", "m")
    (tmp_path / "config.pbtxt").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(InvalidModelConfig, match=r"cannot read config\.pbtxt"):
        ProtobufConfigEditor().prepare(tmp_path / "config.pbtxt", "m")
