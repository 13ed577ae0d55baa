"""Natural ordering of release names: digit runs compare by value, letters ignore case."""

from __future__ import annotations

import pytest

from controlplane.domain.releases import natural_key


@pytest.mark.parametrize(
    "expected",
    [
        ["r1", "r2", "r10"],
        ["v1.2", "v1.10"],
        ["v1.9.9", "v1.10.0", "v2.0.0"],
        ["2024-01-02", "2024-01-10", "2024-02-01"],
        ["a", "B", "c"],
        ["alpha", "Beta", "gamma"],
        ["1", "2", "10", "a"],
    ],
)
def test_sorting_is_natural(expected: list[str]) -> None:
    rotated = expected[1:] + expected[:1]
    assert sorted(rotated, key=natural_key) == expected
    assert sorted(reversed(expected), key=natural_key) == expected


def test_plain_sort_would_differ() -> None:
    names = ["r10", "r2", "r1"]
    assert sorted(names) != sorted(names, key=natural_key)


def test_case_does_not_change_the_key() -> None:
    assert natural_key("Release-10") == natural_key("release-10")
    assert natural_key("R2") < natural_key("r10")
