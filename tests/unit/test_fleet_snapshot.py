"""How a fleet view judges the others after the store was away for everyone (FleetSnapshot).

Found under load: the last read of the fleet before the outage was long before it (a deploy of
several seconds ran in between), the others' last beats landed after that read and just before
the outage, and the view after the outage called them dead, so a fleet wait concluded on the
member it ran on alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.domain.fleet import MemberBeat
from controlplane.services.fleet import BACK_AFTER_OUTAGE, FleetSnapshot

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
INTERVAL = 1.0


def _beat(member: str, at: datetime) -> MemberBeat:
    return MemberBeat(
        member=member, incarnation=f"{member}-1", at=at, interval=INTERVAL, version="1"
    )


def _view(now: datetime, *beats: MemberBeat, blind: tuple[datetime, datetime]) -> FleetSnapshot:
    return FleetSnapshot(
        at=now,
        member="me",
        desired={},
        beats={b.member: b for b in beats},
        read_at=now,
        blind=blind,
    )


def test_a_beat_that_landed_after_the_last_read_and_before_the_outage_is_alive_for_the_grace() -> (
    None
):
    before, back = T0, T0 + timedelta(seconds=13)  # last read, then the store came back
    landed = _beat("m1", T0 + timedelta(seconds=8))  # its last beat, just before the outage
    grace = 3 * INTERVAL + BACK_AFTER_OUTAGE

    soon = _view(back + timedelta(seconds=1), landed, blind=(before, back))
    late = _view(back + timedelta(seconds=grace + 1), landed, blind=(before, back))

    assert soon.alive(landed)
    assert not late.alive(landed)  # it had its time to beat again


def test_a_member_dead_before_the_blind_stretch_stays_dead() -> None:
    before, back = T0, T0 + timedelta(seconds=13)
    dead = _beat("m2", T0 - timedelta(seconds=60))

    assert not _view(back + timedelta(seconds=1), dead, blind=(before, back)).alive(dead)
