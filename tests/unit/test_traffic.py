"""The blue-green alias and the ``smoke.json`` sample, as pure functions of Triton's JSON.

The alias is a one-step ensemble; these tests pin the shape Triton is handed (every tensor
mapped by name, the slot as the step's model) and the comparisons the preflight relies on to
notice that a release changed the model's signature. ``parse_smoke`` refuses a malformed
sample with ``preflight_failed`` before anything is loaded.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from controlplane.adapters.triton.overrides import alias_config, alias_target, signature_of
from controlplane.domain.errors import PermanentError, PreflightFailed, UnsupportedByAlias
from controlplane.domain.smoke import SMOKE_NAME, SmokeTensor, parse_smoke
from controlplane.domain.traffic import Strategy, TrafficPolicy, check_aliasable

MODEL = "resnet"
SLOT = "resnet__green"


def slot_config() -> dict[str, Any]:
    """A slot's config as Triton serves it (JSON), two inputs and two outputs."""
    return {
        "name": SLOT,
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [
            {"name": "IMAGE", "data_type": "TYPE_FP32", "dims": ["3", "224", "224"]},
            {"name": "SCALE", "data_type": "TYPE_FP32", "dims": ["1"]},
        ],
        "output": [
            {"name": "LOGITS", "data_type": "TYPE_FP32", "dims": ["1000"]},
            {"name": "LABEL", "data_type": "TYPE_STRING", "dims": ["1"]},
        ],
        "instance_group": [{"kind": "KIND_GPU", "count": 1}],
    }


# --- the alias ----------------------------------------------------------------------------


def alias_of(slot: dict[str, Any]) -> dict[str, Any]:
    """The alias the Triton adapter builds onto ``slot`` (a served config)."""
    return alias_config(MODEL, str(slot["name"]), signature_of(slot))


def same_signature(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return signature_of(a).same_as(signature_of(b))


def test_alias_config_is_a_one_step_ensemble_onto_the_slot() -> None:
    config = alias_of(slot_config())

    assert config["name"] == MODEL
    assert config["platform"] == "ensemble"
    assert config["max_batch_size"] == 8
    assert [t["name"] for t in config["input"]] == ["IMAGE", "SCALE"]
    assert [t["name"] for t in config["output"]] == ["LOGITS", "LABEL"]
    assert config["input"][0] == {
        "name": "IMAGE",
        "data_type": "TYPE_FP32",
        "dims": [3, 224, 224],
    }
    (step,) = config["ensemble_scheduling"]["step"]
    assert step["model_name"] == SLOT
    assert step["model_version"] == -1
    assert step["input_map"] == {"IMAGE": "IMAGE", "SCALE": "SCALE"}
    assert step["output_map"] == {"LOGITS": "LOGITS", "LABEL": "LABEL"}
    # Nothing of the slot's own settings leaks into the ensemble.
    assert "backend" not in config
    assert "instance_group" not in config


def test_alias_config_is_plain_json_and_keeps_the_same_signature() -> None:
    config = alias_of(slot_config())

    assert json.loads(json.dumps(config)) == config
    assert same_signature(config, slot_config())


def test_alias_config_without_batching_or_dims() -> None:
    bare = {
        "name": SLOT,
        "input": [{"name": "X", "data_type": "TYPE_INT64"}],
        "output": [{"name": "Y", "data_type": "TYPE_INT64"}],
    }

    config = alias_of(bare)

    assert config["max_batch_size"] == 0
    assert config["input"] == [{"name": "X", "data_type": "TYPE_INT64", "dims": []}]


def test_alias_target_reads_the_slot_back() -> None:
    assert alias_target(alias_of(slot_config())) == SLOT


@pytest.mark.parametrize(
    "config",
    [
        {"name": SLOT, "backend": "python"},
        {"platform": "ensemble", "ensemble_scheduling": {"step": []}},
        {
            "platform": "ensemble",
            "ensemble_scheduling": {
                "step": [{"model_name": "a__blue"}, {"model_name": "a__green"}]
            },
        },
    ],
    ids=["not-an-ensemble", "no-step", "two-steps"],
)
def test_alias_target_is_none_for_anything_but_one_step(config: dict[str, Any]) -> None:
    assert alias_target(config) is None


# --- signatures ---------------------------------------------------------------------------


def test_same_signature_for_identical_configs_in_any_tensor_order() -> None:
    reordered = slot_config()
    reordered["input"].reverse()
    reordered["output"].reverse()
    reordered["name"] = "resnet__blue"

    assert same_signature(slot_config(), slot_config())
    assert same_signature(slot_config(), reordered)


def _changed(change: str) -> dict[str, Any]:
    config = copy.deepcopy(slot_config())
    if change == "dtype":
        config["input"][1]["data_type"] = "TYPE_FP16"
    elif change == "dims":
        config["output"][0]["dims"] = ["1001"]
    elif change == "extra-output":
        config["output"].append({"name": "PROBS", "data_type": "TYPE_FP32", "dims": ["1000"]})
    elif change == "missing-input":
        del config["input"][1]
    elif change == "renamed-input":
        config["input"][1]["name"] = "FACTOR"
    elif change == "max-batch-size":
        config["max_batch_size"] = 16
    else:
        raise AssertionError(change)
    return config


@pytest.mark.parametrize(
    "change",
    ["dtype", "dims", "extra-output", "missing-input", "renamed-input", "max-batch-size"],
)
def test_same_signature_notices_a_change(change: str) -> None:
    assert not same_signature(slot_config(), _changed(change))
    assert not same_signature(_changed(change), slot_config())


# --- slot names ---------------------------------------------------------------------------


def test_a_model_owns_its_two_slots_and_their_spares_only() -> None:
    policy = TrafficPolicy()
    assert policy.slots("c") == ("c__blue", "c__green")
    assert policy.spare("c__green", 2) == "c__green-2"
    for name in ("c__blue", "c__green", "c__green-2", "c__blue-13"):
        assert policy.owns("c", name), name
    for name in ("c", "c__green-", "c__green-x", "cc__green", "c__greenish", "d__blue"):
        assert not policy.owns("c", name), name


# --- what an alias cannot front -----------------------------------------------------------


@pytest.mark.parametrize(
    ("decoupled", "sequence_batching", "kind"),
    [(True, False, "decoupled"), (False, True, "sequence-batched"), (True, True, "decoupled")],
)
def test_check_aliasable_refuses_and_names_inplace(
    decoupled: bool, sequence_batching: bool, kind: str
) -> None:
    with pytest.raises(UnsupportedByAlias) as raised:
        check_aliasable(MODEL, decoupled=decoupled, sequence_batching=sequence_batching)

    assert raised.value.code == "strategy_unsupported"
    assert isinstance(raised.value, PermanentError)
    assert kind in raised.value.message
    assert MODEL in raised.value.message
    assert "inplace" in raised.value.message


def test_check_aliasable_accepts_a_plain_model() -> None:
    check_aliasable(MODEL, decoupled=False, sequence_batching=False)


# --- the policy ---------------------------------------------------------------------------


def test_policy_slots_use_the_suffixes() -> None:
    assert TrafficPolicy().slots(MODEL) == ("resnet__blue", "resnet__green")
    custom = TrafficPolicy(blue_suffix="-a", green_suffix="-b")
    assert custom.slots(MODEL) == ("resnet-a", "resnet-b")


def test_policy_defaults_to_blue_green() -> None:
    policy = TrafficPolicy()

    assert policy.strategy is Strategy.BLUE_GREEN
    assert Strategy("inplace") is Strategy.INPLACE
    assert policy.retire_after > 0
    assert policy.drain_timeout > 0


# --- smoke.json ---------------------------------------------------------------------------

VALID_SMOKE = {
    "inputs": {
        "INPUT0": {"datatype": "fp32", "shape": [2], "data": [1.0, 2.0]},
        "NAMES": {"datatype": "BYTES", "shape": [1, 1], "data": ["cat"]},
    },
    "expected": {"OUTPUT0": [2, 4.0]},
    "tolerance": 0.01,
}


def test_parse_smoke_reads_a_valid_sample() -> None:
    sample = parse_smoke(json.dumps(VALID_SMOKE))

    assert sample.inputs == {
        "INPUT0": SmokeTensor("FP32", (2,), (1.0, 2.0)),
        "NAMES": SmokeTensor("BYTES", (1, 1), ("cat",)),
    }
    assert sample.expected == {"OUTPUT0": (2.0, 4.0)}
    assert sample.tolerance == 0.01


def test_parse_smoke_defaults_without_expected() -> None:
    sample = parse_smoke('{"inputs": {"X": {"datatype": "INT64", "shape": [0], "data": []}}}')

    assert sample.inputs == {"X": SmokeTensor("INT64", (0,), ())}
    assert sample.expected is None
    assert sample.tolerance == 1e-5


def _input(**changes: object) -> str:
    tensor: dict[str, object] = {"datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}
    tensor.update(changes)
    return json.dumps({"inputs": {"INPUT0": tensor}})


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        ("[]", '"inputs"'),
        ("{}", '"inputs"'),
        ('{"inputs": {}}', '"inputs"'),
        ('{"inputs": [1, 2]}', '"inputs"'),
        ('{"inputs": {"INPUT0": [1.0]}}', "must be an object"),
        (_input(datatype="FLOAT128"), "unknown datatype"),
        (_input(datatype=None), "unknown datatype"),
        (_input(shape="2"), "shape"),
        (_input(shape=[-1]), "shape"),
        (_input(shape=[1.5]), "shape"),
        (_input(shape=None), "shape"),
        (_input(data="1.0, 2.0"), "'data' list"),
        (_input(data={"0": 1.0}), "'data' list"),
        (
            json.dumps({"inputs": json.loads(_input())["inputs"], "expected": [1.0]}),
            '"expected"',
        ),
        (
            json.dumps({"inputs": json.loads(_input())["inputs"], "expected": {"OUTPUT0": 2.0}}),
            '"expected"',
        ),
    ],
    ids=[
        "invalid-json",
        "empty-file",
        "not-an-object",
        "missing-inputs",
        "empty-inputs",
        "inputs-not-an-object",
        "input-not-an-object",
        "unknown-datatype",
        "no-datatype",
        "shape-not-a-list",
        "negative-dim",
        "fractional-dim",
        "no-shape",
        "data-not-a-list",
        "data-an-object",
        "expected-not-an-object",
        "expected-value-not-a-list",
    ],
)
def test_parse_smoke_refuses_a_malformed_sample(text: str, says: str) -> None:
    with pytest.raises(PreflightFailed) as raised:
        parse_smoke(text)

    assert raised.value.code == "preflight_failed"
    assert says in raised.value.message
    assert SMOKE_NAME in raised.value.message
