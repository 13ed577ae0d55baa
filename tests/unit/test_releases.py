"""Natural ordering of release names (digit runs compare by value, letters ignore case), and
the floor under them that it orders."""

from __future__ import annotations

import pytest

from controlplane.domain.errors import ReleaseBelowFloor
from controlplane.domain.releases import below_floor, check_floor, natural_key


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


@pytest.mark.parametrize(
    ("release", "floor", "below"),
    [
        ("r9", "r10", True),  # natural order: r9 before r10, though "r9" > "r10" as text
        ("r10", "r10", False),  # the floor itself may serve
        ("r11", "r10", False),
        ("R9", "r10", True),
        ("2026-11-29.1", "2026-12-01.1", True),
        ("v1.2.10", "v1.2.9", False),
        ("r1", None, False),  # no floor
    ],
)
def test_a_release_is_below_the_floor_in_the_order_the_watcher_finds_the_newest(
    release: str, floor: str | None, below: bool
) -> None:
    assert below_floor(release, floor) is below


def test_a_release_below_the_floor_is_refused_naming_both() -> None:
    with pytest.raises(ReleaseBelowFloor) as refused:
        check_floor("resnet", "r9", "r10")
    assert refused.value.code == "release_below_floor"
    assert refused.value.message.startswith(
        "release 'r9' of 'resnet' sorts before the model's min_release 'r10'"
    )
    assert refused.value.details == {"model": "resnet", "release": "r9", "min_release": "r10"}
    check_floor("resnet", "r10", "r10")
