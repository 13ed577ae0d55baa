"""Members whose clocks are wrong, as they are on real fleets: each daemon runs under
libfaketime (Debian's ``faketime``), 10 minutes ahead of this machine or 10 minutes behind.

Liveness goes by when a heartbeat landed in the store (here, its file's mtime, which the kernel
sets with the true time), never by the time its writer put in it: found from outside, a member
60 s ahead stayed alive for a minute after it was killed, and one 40 s behind was taken for dead
while it served, so a ``--fleet`` deploy answered converged with that member still serving the
old release.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from devtools.launcher import RunningTriton
from tests.integration.test_cli import cli
from tests.support.fleet import BEAT, Fleet, Member, running_fleet
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.triton_pool import unique_model

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SKEW = 600  # s: ten minutes


def skewed(seconds: int) -> dict[str, str]:
    """The environment that runs a daemon ``seconds`` ahead of this machine's clock (behind,
    when negative); its monotonic clock is left true, as a skewed wall clock leaves it."""
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": f"{seconds:+d}",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


@pytest.fixture
def fleet(
    pooled_tritons: Callable[[Path], RunningTriton], store: Path, tmp_path: Path
) -> Iterator[Fleet]:
    assert LIBFAKETIME.exists(), "libfaketime is missing: make system-deps installs faketime"
    with running_fleet(
        pooled_tritons, store, tmp_path / "fleet", unique_model("clocks")
    ) as running:
        yield running


def alive(fleet: Fleet, via: Member) -> dict[str, bool]:
    return {m["member"]: m["alive"] for m in fleet.fleet(via=via)["members"]}


def sees_all_alive(fleet: Fleet, via: Member) -> bool:
    seen = alive(fleet, via)
    return len(seen) == 3 and all(seen.values())


def sees_dead(fleet: Fleet, via: Member, name: str) -> bool:
    return alive(fleet, via).get(name) is False


def test_members_ten_minutes_ahead_and_behind_are_alive_while_they_beat_and_dead_once_killed(
    fleet: Fleet, store: Path
) -> None:
    write_scale_release(store, fleet.model, "r1", k=1.0)
    write_scale_release(store, fleet.model, "r2", k=2.0)
    true = fleet.add("true")
    ahead = fleet.add("ahead", extra_env=skewed(SKEW))
    behind = fleet.add("behind", extra_env=skewed(-SKEW))
    members = (true, ahead, behind)
    clock_of = {m["member"]: m["clock_ahead_seconds"] for m in fleet.fleet(via=true)["members"]}
    assert abs(clock_of["ahead"] - SKEW) <= 5, clock_of  # the daemons do run skewed
    assert abs(clock_of["behind"] + SKEW) <= 5, clock_of

    # Every member sees every other alive, whichever way its own clock is off.
    for via in members:
        eventually(
            partial(sees_all_alive, fleet, via), 30, f"{via.name} seeing all three members alive"
        )

    # A --fleet deploy waits for the member behind, and answers once it serves the release.
    for release, value in (("r1", 1.0), ("r2", 2.0)):
        answer = true.api.post(
            f"/v1/models/{fleet.model}/deploy",
            {"release": release, "wait": True, "fleet": True, "fleet_timeout_seconds": 120},
        )
        assert answer.status_code == 200, answer.text
        waited = {m["member"] for m in answer.json()["fleet"]["members"]}
        assert waited == {"true", "ahead", "behind"}, answer.json()["fleet"]
        for member in members:  # converged means every member serves it, at the answer
            state = member.api.get(f"/v1/models/{fleet.model}").json()
            assert state["active_release"] == release, (member.name, state)
            assert member.answer(fleet.model) == value

    # Killed, the member ahead is dead within three keepalives (and the timestamps' slack)
    # in the eyes of a true clock and of one behind; not after its ten minutes run out.
    ahead.api.kill()
    for via in (true, behind):
        eventually(
            partial(sees_dead, fleet, via, "ahead"),
            3 * BEAT + 2 + 15,
            f"{via.name} seeing the killed member ahead dead",
        )
    assert alive(fleet, true) == {"true": True, "ahead": False, "behind": True}
    table = cli(true.api.url, "fleet").stdout
    assert "s ahead of the one of the member answering" in table, table
    assert "s behind the one of the member answering" in table, table
