"""Model and release names: what is accepted, what is refused, and what the error says."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.errors import InvalidName
from controlplane.domain.names import (
    MAX_NAME_LENGTH,
    MAX_SLOT_NAME_LENGTH,
    validate_model_name,
    validate_release_name,
    validate_slot_name,
    validate_slot_suffix,
)

Validator = Callable[[object], str]
VALIDATORS = pytest.mark.parametrize(
    ("validate", "kind"),
    [(validate_model_name, "model"), (validate_release_name, "release")],
    ids=["model", "release"],
)


@VALIDATORS
@pytest.mark.parametrize(
    "name",
    ["resnet", "r1", "v1.2.3", "bert-base_uncased", "A", "0", "x" * MAX_NAME_LENGTH, "a.b-c_d"],
)
def test_valid_names_are_returned_unchanged(validate: Validator, kind: str, name: str) -> None:
    assert validate(name) == name


@VALIDATORS
@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "a/b",
        "..",
        ".hidden",
        "a..b",
        "with space",
        "nul\x00byte",
        "-leading-dash",
        "_leading_underscore",
        "back\\slash",
        "trailing-newline\n",
        "tab\there",
        "ünïcode",
    ],
)
def test_unsafe_names_are_refused_with_the_character_rule(
    validate: Validator, kind: str, name: str
) -> None:
    with pytest.raises(InvalidName) as caught:
        validate(name)
    error = caught.value
    assert error.code == "invalid_name"
    assert f"{kind} name" in error.message
    assert "letters, digits" in error.message
    assert "'..'" in error.message


@VALIDATORS
def test_empty_name_is_refused(validate: Validator, kind: str) -> None:
    with pytest.raises(InvalidName, match=f"{kind} name must be a non-empty string") as caught:
        validate("")
    assert caught.value.code == "invalid_name"


@VALIDATORS
@pytest.mark.parametrize("name", [None, 42, b"resnet", ["resnet"], 1.5])
def test_non_strings_are_refused(validate: Validator, kind: str, name: object) -> None:
    with pytest.raises(InvalidName, match="must be a non-empty string") as caught:
        validate(name)
    assert caught.value.code == "invalid_name"


@VALIDATORS
def test_overlong_name_is_refused_with_the_length_rule(validate: Validator, kind: str) -> None:
    with pytest.raises(InvalidName) as caught:
        validate("a" * 300)
    assert caught.value.code == "invalid_name"
    assert "300 characters" in caught.value.message
    assert f"limit is {MAX_NAME_LENGTH}" in caught.value.message


def test_one_past_the_limit_is_refused() -> None:
    with pytest.raises(InvalidName, match="limit"):
        validate_model_name("a" * (MAX_NAME_LENGTH + 1))


def test_str_shows_code_and_message() -> None:
    with pytest.raises(InvalidName) as caught:
        validate_model_name("a/b")
    assert str(caught.value).startswith("invalid_name: model name 'a/b' is not allowed")


@given(st.text(max_size=MAX_NAME_LENGTH + 20))
def test_accepted_names_cannot_spell_a_path(candidate: str) -> None:
    for validate in (validate_model_name, validate_release_name):
        try:
            accepted = validate(candidate)
        except InvalidName:
            continue
        assert accepted == candidate
        assert "/" not in accepted
        assert not accepted.startswith(".")
        assert ".." not in accepted
        assert 0 < len(accepted) <= MAX_NAME_LENGTH


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,60}", fullmatch=True))
def test_names_from_the_allowed_alphabet_round_trip(candidate: str) -> None:
    assert validate_release_name(candidate) == candidate
    if "__" not in candidate:
        assert validate_model_name(candidate) == candidate


# --- the names the daemon gives slots -------------------------------------------------------


@pytest.mark.parametrize("name", ["c__green", "c__blue", "a__b", "x__", "a___b"])
def test_a_model_name_may_not_contain_the_slot_separator(name: str) -> None:
    """``c__green`` would be the dir and the Triton name of model ``c``'s green slot."""
    with pytest.raises(InvalidName) as caught:
        validate_model_name(name)
    assert caught.value.code == "invalid_name"
    assert "'__'" in caught.value.message
    assert "reserved" in caught.value.message


def test_release_names_may_contain_the_separator() -> None:
    assert validate_release_name("2026__rc1") == "2026__rc1"  # releases are never Triton names


def test_a_model_of_the_maximum_length_has_slot_names_that_are_valid() -> None:
    model = validate_model_name("m" * MAX_NAME_LENGTH)
    for suffix in ("__blue", "__green", "__green-12"):
        assert validate_slot_name(model + suffix) == model + suffix
    assert len(model + "__green-12") <= MAX_SLOT_NAME_LENGTH


@pytest.mark.parametrize(
    ("suffix", "says"),
    [
        ("-blue", "must start with '__'"),
        ("_blue", "must start with '__'"),
        ("__", "must start with '__'"),
        ("__b/lue", "not allowed"),
        ("__" + "x" * 40, "not allowed"),
    ],
)
def test_slot_suffixes_start_with_the_reserved_separator(suffix: str, says: str) -> None:
    with pytest.raises(InvalidName) as caught:
        validate_slot_suffix(suffix)
    assert says in caught.value.message
