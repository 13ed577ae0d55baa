"""The fleet's records in a directory store: compare-and-swap of a desired state, heartbeats.

Real files on ``tmp_path``: the records are read back as the other members would read them, the
races are run for real, from threads and from separate processes (POSIX record locks only
exclude other processes, so the threads of one process need a test of their own).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.adapters.stores.fleet_local import LocalDesiredStates
from controlplane.adapters.stores.fleet_records import encode_beat, encode_desired
from controlplane.adapters.stores.local import LocalStore
from controlplane.domain.errors import (
    DesiredStateConflict,
    InvalidName,
    StoreError,
    StoreUnavailable,
)
from controlplane.domain.fleet import (
    DesiredModel,
    MemberBeat,
    MemberModel,
    MemberState,
    desired_from_storage,
    first_generation,
)
from controlplane.domain.refusals import RecordKind, RefusalReason
from controlplane.services.fleet_upkeep import DEPARTED_AFTER, forget_departed

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
MODEL = "m"


def generation_one(model: str = MODEL, *, by: str = "a", release: str = "r1") -> DesiredModel:
    base = first_generation(model, by=by, at=T0, trigger="api", reason="")
    return base.changed(by=by, at=T0, trigger="api", reason=f"deploy of {release}", release=release)


def next_of(current: DesiredModel, *, by: str, release: str) -> DesiredModel:
    return current.changed(
        by=by,
        at=current.set_at + timedelta(seconds=1),
        trigger="api",
        reason=f"deploy of {release} by {by}",
        release=release,
        previous=current.release,
    )


def heartbeat(member: str, release: str = "r1") -> MemberBeat:
    return MemberBeat(
        member=member,
        incarnation=f"{member}-inc",
        at=T0,
        interval=5.0,
        version="1.0",
        models={MODEL: MemberModel(release, MemberState.SERVING, target=release, generation=1)},
        overload="healthy",
    )


def as_written(beats: dict[str, MemberBeat]) -> dict[str, MemberBeat]:
    """Heartbeats as their writers wrote them: without when they landed, which the store adds."""
    return {name: replace(beat, landed=None) for name, beat in beats.items()}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture
def records(root: Path) -> LocalDesiredStates:
    return LocalDesiredStates(root)


def desired_file(root: Path, model: str = MODEL) -> Path:
    return root / "_controlplane" / "desired" / f"{model}.json"


def beat_file(root: Path, member: str) -> Path:
    return root / "_controlplane" / "members" / f"{member}.json"


# --- compare-and-swap ------------------------------------------------------------------------


def test_the_first_swap_creates_generation_one_only_when_there_is_no_record(
    records: LocalDesiredStates, root: Path
) -> None:
    first = generation_one(by="a")
    records.swap(first)

    with pytest.raises(DesiredStateConflict) as caught:
        records.swap(generation_one(by="b", release="r9"))

    assert records.read(MODEL) == first
    assert desired_from_storage(json.loads(desired_file(root).read_bytes())) == first
    assert caught.value.details["set_by"] == "a"
    assert caught.value.details["generation"] == 1


def test_a_swap_of_the_next_generation_replaces_the_record_whole(
    records: LocalDesiredStates, root: Path
) -> None:
    current = generation_one()
    records.swap(current)
    for n, by in enumerate(("b", "c", "a"), start=2):
        current = next_of(current, by=by, release=f"r{n}")
        records.swap(current)

    assert records.read(MODEL) == current
    assert current.generation == 4
    assert sorted(p.name for p in desired_file(root).parent.iterdir()) == [
        f"{MODEL}.json",
        f"{MODEL}.lock",
    ]  # no temp file left behind


def test_a_stale_swap_is_refused_naming_the_record_that_won(records: LocalDesiredStates) -> None:
    one = generation_one(by="a")
    records.swap(one)
    winner = next_of(one, by="b", release="r2")
    records.swap(winner)
    loser = next_of(one, by="c", release="r3")

    with pytest.raises(DesiredStateConflict) as caught:
        records.swap(loser)

    assert caught.value.code == "desired_state_conflict"
    message = str(caught.value)
    assert "expected generation 1" in message
    assert "generation 2 (r2, set by b at 2026-01-01T12:00:01+00:00" in message
    assert caught.value.details == {
        "model": MODEL,
        "expected_generation": 1,
        "generation": 2,
        "release": "r2",
        "set_by": "b",
        "set_at": "2026-01-01T12:00:01+00:00",
    }
    assert records.read(MODEL) == winner


def test_a_swap_that_skips_a_generation_or_has_nothing_to_replace_is_refused(
    records: LocalDesiredStates,
) -> None:
    one = generation_one()
    with pytest.raises(DesiredStateConflict, match="holds no record"):
        records.swap(next_of(one, by="b", release="r2"))
    records.swap(one)

    with pytest.raises(DesiredStateConflict, match="expected generation 2 but"):
        records.swap(next_of(next_of(one, by="b", release="r2"), by="b", release="r3"))

    assert records.read(MODEL) == one


def test_a_model_name_that_spells_a_path_is_refused(records: LocalDesiredStates) -> None:
    with pytest.raises(InvalidName):
        records.swap(generation_one("../escape"))
    with pytest.raises(InvalidName):
        records.read("../escape")


# --- racing writers --------------------------------------------------------------------------


def race(writers: int, write: Callable[[int], None]) -> tuple[list[int], list[Exception]]:
    """``write(i)`` from ``writers`` threads released together: who returned, what was raised."""
    barrier = threading.Barrier(writers)
    won: list[int] = []
    lost: list[Exception] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait()
        try:
            write(i)
        except Exception as exc:
            with lock:
                lost.append(exc)
            return
        with lock:
            won.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won, lost


@contextmanager
def reading(path: Path) -> Iterator[list[str]]:
    """Read ``path`` over and over while the block runs; yield the reads that were not a whole
    record (filled in by the time the block ends)."""
    done = threading.Event()
    torn: list[str] = []

    def read() -> None:
        while not done.is_set():
            data = path.read_bytes()
            try:
                desired_from_storage(json.loads(data))
            except ValueError as exc:
                torn.append(f"{exc}: {data[:80]!r}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        yield torn
    finally:
        done.set()
        reader.join()


def test_of_many_threads_swapping_the_same_generation_exactly_one_wins(
    records: LocalDesiredStates,
) -> None:
    one = generation_one()
    records.swap(one)
    wanted = [next_of(one, by=f"w{i}", release=f"r{i}") for i in range(16)]

    won, lost = race(16, lambda i: records.swap(wanted[i]))

    assert len(won) == 1
    assert records.read(MODEL) == wanted[won[0]]
    assert len(lost) == 15
    assert all(isinstance(exc, DesiredStateConflict) for exc in lost)
    assert {exc.details["set_by"] for exc in lost if isinstance(exc, DesiredStateConflict)} == {
        f"w{won[0]}"
    }


def test_threads_of_one_process_exclude_each_other_through_separate_stores_too(
    root: Path,
) -> None:
    # POSIX record locks do not exclude the threads of one process from each other, and closing
    # any descriptor of the lock file drops the process's lock: the threads' own lock must be
    # one per file in the process, not one per LocalDesiredStates.
    LocalDesiredStates(root).swap(one := generation_one())
    stores = [LocalDesiredStates(root) for _ in range(8)]
    wanted = [next_of(one, by=f"w{i}", release=f"r{i}") for i in range(8)]

    won, lost = race(8, lambda i: stores[i].swap(wanted[i]))

    assert len(won) == 1
    assert len(lost) == 7
    assert all(isinstance(exc, DesiredStateConflict) for exc in lost)
    assert LocalDesiredStates(root).read(MODEL) == wanted[won[0]]


def test_threads_bumping_the_generation_lose_no_update_and_readers_see_whole_records(
    records: LocalDesiredStates, root: Path
) -> None:
    records.swap(generation_one())
    rounds = 15

    def bump(i: int) -> None:
        wins = 0
        while wins < rounds:
            current = records.read(MODEL)
            assert current is not None
            try:
                records.swap(next_of(current, by=f"w{i}", release=f"r{current.generation}"))
            except DesiredStateConflict:
                continue
            wins += 1

    with reading(desired_file(root)) as torn:
        won, lost = race(8, bump)

    assert lost == []
    assert len(won) == 8
    final = records.read(MODEL)
    assert final is not None
    assert final.generation == 1 + 8 * rounds  # every win is one generation: none overwritten
    assert torn == []


CHILD = """
import json, sys
from datetime import timedelta
from dataclasses import replace
from pathlib import Path
from controlplane.adapters.stores.fleet_local import LocalDesiredStates
from controlplane.domain.errors import DesiredStateConflict

root, name, mode, rounds = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
records = LocalDesiredStates(root)
base = records.read("m")
print("ready", flush=True)
sys.stdin.readline()  # the parent releases every child at once
wins, conflicts = 0, []
while wins < rounds and len(conflicts) < 100000:
    current = base if mode == "same" else records.read("m")
    new = current.changed(
        by=name, at=current.set_at + timedelta(seconds=1), trigger="api",
        reason=f"by {name}", release=f"{name}-{current.generation}",
    )
    try:
        records.swap(new)
    except DesiredStateConflict as exc:
        conflicts.append(exc.details.get("set_by"))
        if mode == "same":
            break
        continue
    wins += 1
print(json.dumps({"wins": wins, "conflicts": conflicts}), flush=True)
"""


def race_processes(root: Path, processes: int, mode: str, rounds: int) -> list[dict[str, object]]:
    """Run ``processes`` children on ``root``, released together once every one is ready."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(root), f"p{i}", mode, str(rounds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        answers = []
        for child in children:
            out, _ = child.communicate(timeout=60)
            assert child.returncode == 0, out
            answers.append(json.loads(out))
        return answers
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
            child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()


def test_of_several_processes_swapping_the_same_generation_exactly_one_wins(
    records: LocalDesiredStates, root: Path
) -> None:
    records.swap(generation_one())

    answers = race_processes(root, 6, "same", 1)

    winners = [f"p{i}" for i, answer in enumerate(answers) if answer["wins"] == 1]
    assert len(winners) == 1
    assert [a["conflicts"] for a in answers if a["wins"] == 0] == [winners] * 5
    final = records.read(MODEL)
    assert final is not None
    assert (final.generation, final.set_by) == (2, winners[0])


def test_processes_bumping_the_generation_lose_no_update(
    records: LocalDesiredStates, root: Path
) -> None:
    records.swap(generation_one())

    with reading(desired_file(root)) as torn:
        answers = race_processes(root, 4, "bump", 15)

    assert [a["wins"] for a in answers] == [15] * 4
    final = records.read(MODEL)
    assert final is not None
    assert final.generation == 1 + 4 * 15
    assert torn == []


# --- reading every record --------------------------------------------------------------------


def test_read_all_leaves_out_and_lists_a_record_that_cannot_be_read(
    records: LocalDesiredStates, root: Path
) -> None:
    good = generation_one("good")
    records.swap(good)
    desired_file(root, "broken").write_bytes(b'{"model": "broken", "generation": ')

    assert records.read_all() == {"good": good}
    [(where, refusal)] = records.unreadable().items()
    assert where == str(desired_file(root, "broken"))
    assert (refusal.kind, refusal.name, refusal.reason) == (
        RecordKind.DESIRED,
        "broken",
        RefusalReason.NOT_JSON,
    )
    assert where in refusal.message
    assert "no member acts on this model" in refusal.message


def test_a_record_is_read_again_only_when_it_changed(
    records: LocalDesiredStates, root: Path
) -> None:
    """Every member reads every poll: a bad record is decoded once, not every few seconds,
    and a changed one (a rename over it, as every write is) is read again."""
    good = generation_one("good")
    records.swap(good)
    broken = desired_file(root, "broken")
    broken.write_bytes(b'{"model": "broken", "generation": ')

    records.read_all()
    first = records.unreadable()[str(broken)]
    for _ in range(3):
        assert records.read_all() == {"good": good}
        # ... and said where and why for as long as it is broken (GET /v1/fleet shows it).
        assert list(records.unreadable()) == [str(broken)]
        assert records.unreadable()[str(broken)] is first  # as decoded at the first read

    fixed = generation_one("broken")
    replacement = broken.with_name(".replacement")
    replacement.write_bytes(encode_desired(fixed))
    replacement.replace(broken)
    assert records.read_all() == {"good": good, "broken": fixed}
    assert records.unreadable() == {}
    newer = good.changed(by="m2", at=good.set_at, trigger="api", reason="again")
    records.swap(newer)
    assert records.read_all()["good"] == newer


def test_a_record_with_a_list_where_an_object_belongs_is_left_out_not_fatal(
    records: LocalDesiredStates, root: Path
) -> None:
    # A hand-edited record must cost its own model only: the sync pass reads every model
    # through read_all and acts on none when it raises.
    good = generation_one("good")
    records.swap(good)
    records.swap(generation_one("edited"))
    data = json.loads(desired_file(root, "edited").read_bytes())
    data["rollout"] = ["canary"]
    desired_file(root, "edited").write_text(json.dumps(data))

    assert records.read_all() == {"good": good}
    [refusal] = records.unreadable().values()
    assert (refusal.reason, refusal.field) == (RefusalReason.WRONG_TYPE, "rollout")
    assert "rollout is a list, not an object" in refusal.message
    with pytest.raises(StoreError) as reading:
        records.read("edited")
    assert reading.value.details["reason"] == "wrong_type"


def test_reading_or_swapping_a_record_that_cannot_be_read_is_a_store_error_naming_it(
    records: LocalDesiredStates, root: Path
) -> None:
    path = desired_file(root)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"[1, 2, 3]\n")

    with pytest.raises(StoreError) as reading:
        records.read(MODEL)
    with pytest.raises(StoreError) as swapping:
        records.swap(generation_one())

    for caught in (reading, swapping):
        assert caught.value.details == {"record": str(path), "reason": "wrong_type", "field": None}
        assert "not an object" in str(caught.value)
    assert path.read_bytes() == b"[1, 2, 3]\n"  # left for a person to look at


def test_read_all_skips_and_lists_a_record_under_another_model_s_name(
    records: LocalDesiredStates, root: Path
) -> None:
    records.swap(generation_one("a"))
    desired_file(root, "copy").write_bytes(desired_file(root, "a").read_bytes())

    assert records.read_all() == {"a": generation_one("a")}
    [(where, refusal)] = records.unreadable().items()
    assert where == str(desired_file(root, "copy"))
    assert (refusal.name, refusal.reason) == ("copy", RefusalReason.MISNAMED)
    assert "holds the record of 'a'" in refusal.message


def test_nothing_is_read_from_a_store_that_has_no_records_yet(
    records: LocalDesiredStates,
) -> None:
    assert records.read(MODEL) is None
    assert records.read_all() == {}
    assert records.beats() == {}


def test_the_records_live_under_controlplane_where_no_model_can_be_listed(
    records: LocalDesiredStates, root: Path
) -> None:
    records.swap(generation_one())
    records.beat(heartbeat("a"))

    assert desired_file(root).is_file()
    assert beat_file(root, "a").is_file()
    assert records.where == (root / "_controlplane").as_uri()
    assert LocalStore(root).list_models() == []


# --- heartbeats ------------------------------------------------------------------------------


def test_heartbeats_round_trip_and_a_new_beat_replaces_the_last(
    records: LocalDesiredStates,
) -> None:
    records.beat(heartbeat("a"))
    records.beat(heartbeat("b"))
    newer = heartbeat("a", release="r2")
    records.beat(newer)

    assert as_written(records.beats()) == {"a": newer, "b": heartbeat("b")}


def test_a_heartbeat_that_is_not_one_hides_only_that_member(
    records: LocalDesiredStates, root: Path
) -> None:
    records.beat(heartbeat("a"))
    beat_file(root, "b").write_bytes(b"not json")
    beat_file(root, "c").write_bytes(encode_beat(heartbeat("a")))  # under another name
    listed = json.loads(encode_beat(heartbeat("d")))
    listed["models"] = [MODEL]
    beat_file(root, "d").write_text(json.dumps(listed))

    assert as_written(records.beats()) == {"a": heartbeat("a")}
    refused = records.unreadable()
    assert {where: (r.kind, r.name, r.reason) for where, r in refused.items()} == {
        str(beat_file(root, "b")): (RecordKind.MEMBER, "b", RefusalReason.NOT_JSON),
        str(beat_file(root, "c")): (RecordKind.MEMBER, "c", RefusalReason.MISNAMED),
        str(beat_file(root, "d")): (RecordKind.MEMBER, "d", RefusalReason.WRONG_TYPE),
    }


# What a hand edit may leave in a record, which Python's JSON reader takes but JSON has not:
# (the value replaced, its replacement).
NOT_JSON = {
    "NaN": b"NaN",
    "Infinity": b"-Infinity",
    "nested deeper than the parser goes": b"[" * 200_000 + b"]" * 200_000,
}


def edited(record: bytes, field: bytes, shape: str) -> bytes:
    """``record`` (one field a line, as the daemon writes it) with ``field``'s value edited
    to ``shape``'s."""
    new = NOT_JSON[shape]
    line = next(line for line in record.splitlines() if line.strip().startswith(field))
    return record.replace(line, line.replace(line.split(b": ")[1].rstrip(b","), new))


@pytest.mark.parametrize("shape", sorted(NOT_JSON))
def test_a_desired_state_of_json_python_reads_but_json_has_not_is_unreadable_and_listed(
    shape: str, records: LocalDesiredStates, root: Path
) -> None:
    good = generation_one("good")
    records.swap(good)
    broken = desired_file(root, "broken")
    broken.write_bytes(edited(encode_desired(generation_one("broken")), b'"bake_seconds"', shape))

    assert records.read_all() == {"good": good}
    assert list(records.unreadable()) == [str(broken)]
    with pytest.raises(StoreError, match="cannot be read"):
        records.read("broken")


@pytest.mark.parametrize("shape", sorted(NOT_JSON))
def test_a_heartbeat_of_json_python_reads_but_json_has_not_hides_that_member_only(
    shape: str, records: LocalDesiredStates, root: Path
) -> None:
    records.beat(heartbeat("a"))
    beat_file(root, "b").write_bytes(edited(encode_beat(heartbeat("b")), b'"interval"', shape))

    assert as_written(records.beats()) == {"a": heartbeat("a")}
    assert list(records.unreadable()) == [str(beat_file(root, "b"))]


def test_a_heartbeat_with_a_time_without_a_zone_is_listed_saying_so(
    records: LocalDesiredStates, root: Path
) -> None:
    records.beat(heartbeat("b"))
    stored = json.loads(beat_file(root, "b").read_bytes())
    stored["at"] = "2026-01-01T12:00:00"
    beat_file(root, "b").write_text(json.dumps(stored))

    assert records.beats() == {}
    [refusal] = records.unreadable().values()
    assert (refusal.reason, refusal.field) == (RefusalReason.TIME_WITHOUT_ZONE, "at")
    assert "at is '2026-01-01T12:00:00', a time without a zone" in refusal.message


def test_forget_deletes_a_member_s_heartbeat(records: LocalDesiredStates) -> None:
    records.beat(heartbeat("a"))
    records.beat(heartbeat("b"))

    records.forget("a")
    records.forget("never-seen")

    assert set(records.beats()) == {"b"}


# --- a store that cannot be written ----------------------------------------------------------


def test_a_store_path_through_a_regular_file_is_a_store_error_naming_the_path(
    tmp_path: Path,
) -> None:
    # Root ignores permission bits, so the store cannot be made read-only with chmod here;
    # a regular file where a directory should be refuses every user, root included.
    store = tmp_path / "store"
    store.mkdir()
    blocker = store / "_controlplane"
    blocker.write_text("a file, not a directory\n")
    records = LocalDesiredStates(store)

    with pytest.raises(StoreError) as swapping:
        records.swap(generation_one())
    with pytest.raises(StoreError) as beating:
        records.beat(heartbeat("a"))
    with pytest.raises(StoreError) as reading:
        records.read_all()

    for caught in (swapping, beating, reading):
        assert str(blocker) in str(caught.value.details["path"])
        assert str(blocker) in str(caught.value)
        assert "Not a directory" in str(caught.value)
    assert blocker.read_text() == "a file, not a directory\n"


def test_a_store_that_is_not_there_is_unreachable_and_nothing_is_made_in_its_place(
    tmp_path: Path,
) -> None:
    """An unmounted share, or a link to nowhere: the member is stale, not a fleet of none,
    and writes nothing onto the disk under the mount point."""
    store = tmp_path / "share"
    records = LocalDesiredStates(store)
    for call in (
        records.read_all,
        lambda: records.read("m"),
        lambda: records.swap(generation_one()),
        lambda: records.beat(heartbeat("a")),
    ):
        with pytest.raises(StoreUnavailable) as caught:
            call()
        assert str(store) in str(caught.value)
    assert not store.exists()


def test_a_regular_file_where_the_members_directory_belongs_is_a_store_error(
    records: LocalDesiredStates, root: Path
) -> None:
    members = root / "_controlplane" / "members"
    members.parent.mkdir()
    members.write_text("not a directory\n")

    with pytest.raises(StoreError) as beating:
        records.beat(heartbeat("a"))
    with pytest.raises(StoreError) as reading:
        records.beats()

    assert str(members) in str(beating.value)
    assert str(members) in str(reading.value)


def test_encoded_records_are_json_a_person_can_read() -> None:
    data = encode_desired(generation_one())

    assert json.loads(data)["release"] == "r1"
    assert data.endswith(b"\n")


def test_member_records_that_cannot_be_used_are_listed_until_fixed(
    records: LocalDesiredStates, root: Path
) -> None:
    """A bad heartbeat hides one member: it is shown with the desired-state records that
    cannot be read, and not logged here (the fleet sync says it, once a minute: anyone who
    may read GET /v1/fleet would otherwise write warnings at will)."""
    records.beat(heartbeat("good"))
    members = root / "_controlplane" / "members"
    (members / "garbled.json").write_bytes(b"{nope")
    (members / "copied.json").write_bytes((members / "good.json").read_bytes())

    for _ in range(5):
        assert list(records.beats()) == ["good"]
    unreadable = records.unreadable()
    assert sorted(unreadable) == [str(members / "copied.json"), str(members / "garbled.json")]
    assert "cannot be read" in unreadable[str(members / "garbled.json")].message
    assert "holds the record of 'good'" in unreadable[str(members / "copied.json")].message

    (members / "garbled.json").unlink()
    (members / "copied.json").unlink()
    records.beats()
    assert records.unreadable() == {}


def skewed(seconds: float) -> Callable[[], datetime]:
    """A reader's clock ``seconds`` ahead of this machine's (behind, when negative)."""
    return lambda: datetime.now(UTC) + timedelta(seconds=seconds)


@pytest.mark.parametrize("reader_ahead", [-600.0, 0.0, 600.0])
def test_a_heartbeat_lands_when_its_file_was_written_on_the_readers_clock_whatever_it_says(
    root: Path, reader_ahead: float
) -> None:
    """The store's mtime dates a beat, moved onto the reader's clock by the offset measured at
    the reader's own beat: a writer 10 minutes ahead, and a record dated 2099 by hand, land
    now; a reader whose clock is off sees them land now on its own clock."""
    reader = LocalDesiredStates(root, clock=skewed(reader_ahead))
    reader.beat(heartbeat("reader"))
    LocalDesiredStates(root).beat(
        replace(heartbeat("ahead"), at=datetime.now(UTC) + timedelta(minutes=10))
    )
    dated = json.loads(encode_beat(heartbeat("ghost")))
    beat_file(root, "ghost").write_text(json.dumps({**dated, "at": "2099-01-01T00:00:00+00:00"}))

    read = reader.beats()
    now = datetime.now(UTC) + timedelta(seconds=reader_ahead)

    for name in ("reader", "ahead", "ghost"):
        assert abs((read[name].seen - now).total_seconds()) < 2, name
        assert read[name].alive(now)
        assert not read[name].alive(now + timedelta(seconds=3 * 5.0 + 3))  # 3 keepalives of 5 s
    skew = read["ahead"].skew()  # the writer's clock against the reader's
    assert skew is not None
    assert abs(skew - (600 - reader_ahead)) < 2
    assert (read["ghost"].skew() or 0) > 70 * 365 * 86400


def test_a_reader_that_has_not_beaten_yet_asks_the_store_for_its_clock(root: Path) -> None:
    LocalDesiredStates(root).beat(heartbeat("other"))
    reader = LocalDesiredStates(root, clock=skewed(-600))  # no beat of its own yet

    landed = reader.beats()["other"].seen

    assert abs((landed - (datetime.now(UTC) - timedelta(minutes=10))).total_seconds()) < 2
    assert list((root / "_controlplane").glob(".clock-*")) == []  # the probe is gone


def test_the_look_for_departed_members_dates_each_record_by_its_file_and_reads_none(
    records: LocalDesiredStates, root: Path
) -> None:
    for name in ("alive", "gone"):
        records.beat(heartbeat(name))
    beat_file(root, "junk").write_bytes(b"{not json")  # dated like any record, and forgotten
    beat_file(root, "Not A Name").write_bytes(b"{}")  # no member's: never deleted here
    an_hour_ago = time.time() - DEPARTED_AFTER - 60
    for name in ("gone", "junk", "Not A Name"):
        os.utime(beat_file(root, name), (an_hour_ago, an_hour_ago))

    forgotten = asyncio.run(forget_departed(records, "me", datetime.now(UTC)))

    assert sorted(forgotten) == ["gone", "junk"]
    assert sorted(p.name for p in (root / "_controlplane" / "members").iterdir()) == [
        "Not A Name.json",
        "alive.json",
    ]
