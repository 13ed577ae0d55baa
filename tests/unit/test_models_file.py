"""The file of releases that `controlplane apply -f` and `diff -f` read: what it accepts, and
each way it is refused with the file, the line and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.cli.models_file import (
    MAX_BYTES,
    ModelsFileError,
    WantedRelease,
    read_models_file,
)


def read(text: str, tmp_path: Path) -> list[WantedRelease]:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return read_models_file(path)


def test_models_and_releases_are_read_in_the_files_order_as_text(tmp_path: Path) -> None:
    text = "# what serves\nmodels:\n  resnet: 2026-11-29\n  bert: 1.10\n  a-b_c.d: r7\n"

    wanted = read(text, tmp_path)

    # YAML alone would read a date and the number 1.1: the names stay as written.
    assert wanted == [
        WantedRelease("resnet", "2026-11-29", 3),
        WantedRelease("bert", "1.10", 4),
        WantedRelease("a-b_c.d", "r7", 5),
    ]


def test_standard_input_is_read_from_the_text_given() -> None:
    assert read_models_file(None, "models: {m: r1}") == [WantedRelease("m", "r1", 1)]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "models.yaml: the file is empty: expected a mapping 'models:'"),
        ("- m: r1\n", "models.yaml: expected a mapping 'models:'"),
        ("models:\n", "models.yaml:1: expected a mapping 'models:'"),
        ("models: {}\n", "with at least one model"),
        ("model:\n  m: r1\n", "models.yaml:1: unknown key 'model'"),
        ("models:\n  m: r1\n  m: r2\n", "models.yaml:3: 'm' is listed twice (first on line 2)"),
        ("models:\n  m: [r1]\n", "models.yaml:2: model 'm': the release must be a name"),
        ("models:\n  m:\n    release: r1\n", "not a mapping"),
        ("models:\n  m: feature/x\n", "models.yaml:2: invalid_name: release name 'feature/x'"),
        ("models:\n  ../m: r1\n", "models.yaml:2: invalid_name: model name '../m'"),
        ("models:\n  m: r1\n  [x]: r2\n", "models.yaml:3: a key must be a name, not a list"),
        ("models: [\n", "models.yaml: not YAML"),
    ],
)
def test_a_bad_file_is_refused_with_where_and_why(text: str, says: str, tmp_path: Path) -> None:
    with pytest.raises(ModelsFileError) as refused:
        read(text, tmp_path)

    assert says in str(refused.value)


def test_a_file_that_is_not_there_or_too_large_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelsFileError, match="cannot read it"):
        read_models_file(tmp_path / "absent.yaml")

    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_BYTES + 1))
    with pytest.raises(ModelsFileError, match=f"larger than {MAX_BYTES} bytes"):
        read_models_file(big)
