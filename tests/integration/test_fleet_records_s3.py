"""The fleet's records in an S3 store against a real S3 API (moto's server) over real HTTP.

Every :class:`S3DesiredStates` reaches moto through a :class:`FaultProxy`, which counts the
requests, lands another writer's object just before a PutObject (``on_put``), loses the answer to
a PutObject that moto carried out (``lose_answer``), or takes the endpoint down. Other writers
and the checks of what is stored go straight to moto.

What moto's server (5.x) does with conditional PutObject, checked by the first test below:
``If-None-Match: *`` on a key that exists and ``If-Match`` with another ETag are refused with
412 ``PreconditionFailed`` (quotes around the ETag do not matter); ``If-Match`` on a key that
does not exist is 404 ``NoSuchKey``, as on AWS. It never answers 409
``ConditionalRequestConflict``. And it checks, then writes, with no lock between: on its
threaded server two PutObjects racing with the same ``If-Match`` can both succeed (16 raw
racing requests gave two winners in about one round of eight), which AWS S3 never allows. So
the test of racing swaps runs on a moto server that answers one request at a time (atomic, as
AWS is); on the threaded one, what it would test is moto's race, not ours.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.exceptions  # type: ignore[import-untyped]
import pytest

from controlplane.adapters.stores.fleet_records import encode_beat, encode_desired, utc_now
from controlplane.adapters.stores.s3 import SCAN_RETRY_SECONDS, S3Store
from controlplane.adapters.stores.s3_fleet import S3DesiredStates
from controlplane.domain.errors import DesiredStateConflict, StoreUnavailable
from controlplane.domain.fleet import (
    DesiredModel,
    MemberBeat,
    MemberModel,
    MemberState,
    desired_from_storage,
    first_generation,
)
from tests.support.fault_proxy import FaultProxy
from tests.support.s3 import moto_server, s3_client, upload_release
from tests.support.s3_fixtures import fault_proxy, moto_endpoint, s3_bucket  # noqa: F401

PREFIX = "store"
MODEL = "m"
KEY = f"{PREFIX}/_controlplane/desired/{MODEL}.json"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
RecordsFactory = Callable[..., S3DesiredStates]
LISTING_EVERY = 300.0  # store.full_scan_seconds: the records are listed at a reader's first read


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
    )


# The imported fixtures are named once each, here (ruff's F811 would flag every test).
@pytest.fixture
def bucket(s3_bucket: tuple[Any, str]) -> str:  # noqa: F811
    return s3_bucket[1]


@pytest.fixture
def direct(s3_bucket: tuple[Any, str]) -> Any:  # noqa: F811
    """A client straight to moto: another writer, and the test's own eyes."""
    return s3_bucket[0]


@pytest.fixture
def proxy(fault_proxy: FaultProxy) -> FaultProxy:  # noqa: F811
    return fault_proxy


@pytest.fixture
def make_records(proxy: FaultProxy, bucket: str) -> Iterator[RecordsFactory]:
    """Build S3DesiredStates that reach moto through the proxy; clients close at teardown."""
    clients: list[Any] = []

    def make(
        prefix: str = PREFIX, *, clock: Callable[[], datetime] = utc_now, **kwargs: Any
    ) -> S3DesiredStates:
        client = s3_client(proxy.endpoint)
        clients.append(client)
        kwargs.setdefault("backoff_max", 0.005)
        listing_every = kwargs.pop("listing_every", LISTING_EVERY)
        store = S3Store(f"s3://{bucket}/{prefix}", client=client, **kwargs)
        return S3DesiredStates(store, clock=clock, listing_every=listing_every)

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def records(make_records: RecordsFactory) -> S3DesiredStates:
    return make_records()


def stored(direct: Any, bucket: str, key: str = KEY) -> DesiredModel:
    body = direct.get_object(Bucket=bucket, Key=key)["Body"]
    try:
        return desired_from_storage(json.loads(body.read()))
    finally:
        body.close()


def error_code(call: Callable[[], Any]) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    return str(caught.value.response["Error"]["Code"])


# --- what moto does with conditional writes --------------------------------------------------


def test_moto_refuses_the_conditional_writes_the_swap_relies_on(direct: Any, bucket: str) -> None:
    def put(body: bytes, key: str = "k", **condition: str) -> str:
        return str(direct.put_object(Bucket=bucket, Key=key, Body=body, **condition)["ETag"])

    first = put(b"1", IfNoneMatch="*")
    assert error_code(lambda: put(b"2", IfNoneMatch="*")) == "PreconditionFailed"
    second = put(b"2", IfMatch=first)
    assert error_code(lambda: put(b"3", IfMatch=first)) == "PreconditionFailed"
    put(b"3", IfMatch=second.strip('"'))  # with quotes or without, the same ETag
    assert error_code(lambda: put(b"4", "absent", IfMatch=first)) == "NoSuchKey"


# --- compare-and-swap ------------------------------------------------------------------------


def test_swaps_write_generation_after_generation_under_controlplane(
    records: S3DesiredStates, direct: Any, bucket: str
) -> None:
    one = generation_one()
    records.swap(one)
    two = next_of(one, by="b", release="r2")
    records.swap(two)

    assert records.read(MODEL) == two
    assert stored(direct, bucket) == two
    assert records.read("other") is None
    assert records.where == f"s3://{bucket}/{PREFIX}/_controlplane"


def test_a_stale_swap_is_refused_naming_the_record_that_won(
    records: S3DesiredStates, bucket: str, proxy: FaultProxy
) -> None:
    one = generation_one()
    records.swap(one)
    winner = next_of(one, by="b", release="r2")
    records.swap(winner)
    puts = proxy.puts(KEY)

    with pytest.raises(DesiredStateConflict) as caught:
        records.swap(next_of(one, by="c", release="r3"))
    with pytest.raises(DesiredStateConflict, match="expected generation 0"):
        records.swap(generation_one(by="c"))

    assert f"s3://{bucket}/{KEY} holds generation 2 (r2, set by b" in str(caught.value)
    assert caught.value.details["set_by"] == "b"
    assert caught.value.details["generation"] == 2
    assert proxy.puts(KEY) == puts  # refused on what it read: nothing was sent
    assert records.read(MODEL) == winner


@pytest.mark.parametrize("generation", [1, 2], ids=["if-none-match", "if-match"])
def test_a_writer_that_lands_between_the_read_and_the_put_wins(
    records: S3DesiredStates, direct: Any, bucket: str, proxy: FaultProxy, generation: int
) -> None:
    base = generation_one()
    if generation == 2:
        records.swap(base)
    ours = base if generation == 1 else next_of(base, by="a", release="r2")
    theirs = (
        generation_one(by="b", release="r9")
        if generation == 1
        else next_of(base, by="b", release="r9")
    )
    proxy.on_put(
        KEY, lambda _: direct.put_object(Bucket=bucket, Key=KEY, Body=encode_desired(theirs))
    )
    puts = proxy.puts(KEY)

    with pytest.raises(DesiredStateConflict) as caught:
        records.swap(ours)

    assert caught.value.details["set_by"] == "b"
    assert caught.value.details["release"] == "r9"
    assert stored(direct, bucket) == theirs
    assert proxy.puts(KEY) == puts + 1  # ours went, and moto refused it


def test_of_many_threads_swapping_the_same_generation_exactly_one_wins(bucket: str) -> None:
    with moto_server(one_at_a_time=True) as endpoint:
        clients = [s3_client(endpoint) for _ in range(8)]
        try:
            clients[0].create_bucket(Bucket=f"{bucket}-serial")
            stores = [
                S3DesiredStates(S3Store(f"s3://{bucket}-serial/{PREFIX}", client=c))
                for c in clients
            ]
            one = generation_one()
            stores[0].swap(one)
            wanted = [next_of(one, by=f"w{i}", release=f"r{i}") for i in range(8)]
            barrier = threading.Barrier(8)
            won: list[int] = []
            lost: list[DesiredStateConflict] = []

            def swap(i: int) -> None:
                barrier.wait()
                try:
                    stores[i].swap(wanted[i])
                except DesiredStateConflict as exc:
                    lost.append(exc)
                    return
                won.append(i)

            threads = [threading.Thread(target=swap, args=(i,)) for i in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()

            assert len(won) == 1
            assert len(lost) == 7
            assert {exc.details["set_by"] for exc in lost} == {f"w{won[0]}"}
            assert stores[0].read(MODEL) == wanted[won[0]]
        finally:
            for client in clients:
                client.close()


@pytest.mark.parametrize("generation", [1, 2], ids=["if-none-match", "if-match"])
def test_a_put_retried_after_its_first_attempt_landed_is_a_success(
    records: S3DesiredStates, direct: Any, bucket: str, proxy: FaultProxy, generation: int
) -> None:
    base = generation_one()
    if generation == 2:
        records.swap(base)
    ours = base if generation == 1 else next_of(base, by="a", release="r2")
    puts = proxy.puts(KEY)
    proxy.fail_next(1, "lose_answer", KEY, method="PUT")

    records.swap(ours)

    # The first PUT landed and its answer was lost; the retry failed its own precondition.
    assert proxy.puts(KEY) == puts + 2
    assert stored(direct, bucket) == ours
    assert records.read(MODEL) == ours


# --- reading every record --------------------------------------------------------------------


def test_read_all_leaves_out_and_lists_what_it_cannot_use(
    records: S3DesiredStates, direct: Any, bucket: str
) -> None:
    good = generation_one("good")
    records.swap(good)
    desired = f"{PREFIX}/_controlplane/desired"
    direct.put_object(Bucket=bucket, Key=f"{desired}/broken.json", Body=b'{"model": ')
    direct.put_object(Bucket=bucket, Key=f"{desired}/copy.json", Body=encode_desired(good))
    direct.put_object(Bucket=bucket, Key=f"{desired}/deeper/x.json", Body=encode_desired(good))
    direct.put_object(Bucket=bucket, Key=f"{desired}/notes.txt", Body=b"hello")

    assert records.read_all() == {"good": good}
    unreadable = records.unreadable()
    assert sorted(unreadable) == [
        f"s3://{bucket}/{desired}/broken.json",
        f"s3://{bucket}/{desired}/copy.json",
    ]
    assert "cannot be read" in unreadable[f"s3://{bucket}/{desired}/broken.json"].message
    assert "holds the record of 'good'" in unreadable[f"s3://{bucket}/{desired}/copy.json"].message


def test_an_unchanged_desired_state_costs_one_listing_and_no_get(
    make_records: RecordsFactory, proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    """The listing (what every read is in a fleet whose generations index cannot be used, and
    every store.full_scan_seconds otherwise: test_fleet_index_s3.py) reads only what moved."""
    records = make_records(listing_every=0.0)
    for model in ("a", "b", "c"):
        records.swap(generation_one(model))
    first = records.read_all()
    before = proxy.gets("/_controlplane/desired/")
    assert records.read_all() == first  # nothing changed: the listing's ETags say so
    listings = [r for r in proxy.requests if "list-type=2" in r.query]
    assert proxy.gets("/_controlplane/desired/") - before == 0
    assert listings  # it did look
    # A record that changes is read again, and only that one.
    changed = first["b"].changed(by="other", at=first["b"].set_at, trigger="api", reason="r")
    direct.put_object(
        Bucket=bucket, Key=f"{PREFIX}/_controlplane/desired/b.json", Body=encode_desired(changed)
    )
    before = proxy.gets("/_controlplane/desired/")
    assert records.read_all()["b"] == changed
    assert proxy.gets("/_controlplane/desired/") - before == 1


def test_heartbeats_round_trip_and_are_forgotten(
    records: S3DesiredStates, direct: Any, bucket: str
) -> None:
    records.beat(heartbeat("a"))
    records.beat(heartbeat("b"))
    newer = heartbeat("a", release="r2")
    records.beat(newer)
    members = f"{PREFIX}/_controlplane/members"
    direct.put_object(Bucket=bucket, Key=f"{members}/bad.json", Body=b"[]")
    direct.put_object(Bucket=bucket, Key=f"{members}/c.json", Body=encode_beat(heartbeat("b")))

    assert as_written(records.beats()) == {"a": newer, "b": heartbeat("b")}
    records.forget("a")
    records.forget("never-seen")
    assert as_written(records.beats()) == {"b": heartbeat("b")}


def as_written(beats: dict[str, MemberBeat]) -> dict[str, MemberBeat]:
    """Heartbeats as their writers wrote them: without when they landed, which the store adds."""
    return {name: replace(beat, landed=None) for name, beat in beats.items()}


@pytest.mark.parametrize("reader_ahead", [-600.0, 0.0, 600.0])
def test_a_heartbeat_lands_when_s3_stored_it_on_the_readers_clock_whatever_it_says(
    make_records: RecordsFactory, proxy: FaultProxy, direct: Any, bucket: str, reader_ahead: float
) -> None:
    """LastModified against the Date of the same answer, both S3's clock, moved onto the
    reader's: a writer 10 minutes ahead and a record dated 2099 land now, for a reader whose
    clock is 10 minutes off either way too. A listing that finds nothing new GETs nothing."""

    def clock() -> datetime:
        return datetime.now(UTC) + timedelta(seconds=reader_ahead)

    reader = make_records(clock=clock)
    reader.beat(heartbeat("reader"))
    ahead = replace(heartbeat("ahead"), at=datetime.now(UTC) + timedelta(minutes=10))
    members = f"{PREFIX}/_controlplane/members"
    direct.put_object(Bucket=bucket, Key=f"{members}/ahead.json", Body=encode_beat(ahead))
    dated = {**json.loads(encode_beat(heartbeat("ghost"))), "at": "2099-01-01T00:00:00+00:00"}
    direct.put_object(Bucket=bucket, Key=f"{members}/ghost.json", Body=json.dumps(dated))

    read = reader.beats()
    now = clock()

    for name in ("reader", "ahead", "ghost"):
        # S3's timestamps are whole seconds: up to a second short each.
        assert -1 <= (now - read[name].seen).total_seconds() < 3, name
        assert read[name].alive(now)
        assert not read[name].alive(read[name].seen + timedelta(seconds=3 * 5.0 + 2.5))
    one = reader.beat_of("ghost")
    assert one is not None
    assert -1 <= (now - one.seen).total_seconds() < 3
    gets = proxy.gets(members)
    assert set(reader.beats()) == {"reader", "ahead", "ghost"}
    assert proxy.gets(members) == gets  # unchanged ETags: listed, not fetched again


def test_the_records_live_under_controlplane_and_list_models_never_lists_them(
    make_records: RecordsFactory, direct: Any, bucket: str, proxy: FaultProxy
) -> None:
    upload_release(direct, bucket, PREFIX, "model-a", "v1", {"config.pbtxt": b"x"})
    records = make_records()
    records.swap(generation_one())
    records.beat(heartbeat("a"))
    client = s3_client(proxy.endpoint)
    try:
        store = S3Store(f"s3://{bucket}/{PREFIX}", client=client)

        keys = [o["Key"] for o in direct.list_objects_v2(Bucket=bucket)["Contents"]]
        assert sorted(k for k in keys if "_controlplane" in k) == [
            f"{PREFIX}/_controlplane/desired/{MODEL}.json",
            f"{PREFIX}/_controlplane/generations.json",
            f"{PREFIX}/_controlplane/members/a.json",
        ]
        assert store.list_models() == ["model-a"]
    finally:
        client.close()


# --- the store down --------------------------------------------------------------------------


def test_with_the_store_down_reads_give_up_within_the_scan_budget(
    make_records: RecordsFactory, proxy: FaultProxy
) -> None:
    records = make_records(retry_seconds=60.0, backoff_max=0.2)
    proxy.go_down()

    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        records.read_all()
    took = time.monotonic() - started

    assert SCAN_RETRY_SECONDS <= took < SCAN_RETRY_SECONDS + 3  # not the 60 s of a deploy
    assert caught.value.details["cause"] == "connection"
    assert "_controlplane/" in str(caught.value)


def test_with_the_store_down_every_call_is_store_unavailable(
    make_records: RecordsFactory, proxy: FaultProxy
) -> None:
    records = make_records(retry_seconds=0.3, backoff_max=0.05)
    proxy.go_down()

    for call in (
        lambda: records.read(MODEL),
        records.read_all,
        records.beats,
        lambda: records.swap(generation_one()),
        lambda: records.beat(heartbeat("a")),
        lambda: records.forget("a"),
    ):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            call()
        assert time.monotonic() - started < 3


def test_a_record_deleted_between_the_read_and_the_put_is_a_conflict(
    records: S3DesiredStates, direct: Any, bucket: str, proxy: FaultProxy
) -> None:
    # Deleting a record is what the store_error for an unreadable one tells a person to do.
    one = generation_one()
    records.swap(one)
    proxy.on_put(KEY, lambda _: direct.delete_object(Bucket=bucket, Key=KEY))

    with pytest.raises(DesiredStateConflict) as caught:
        records.swap(next_of(one, by="a", release="r2"))

    assert "holds no record" in str(caught.value)
    assert caught.value.details["generation"] == 0
    assert records.read(MODEL) is None  # nothing was written in its place


def test_a_listing_cut_after_its_headers_is_retried_not_read_as_empty(
    records: S3DesiredStates, proxy: FaultProxy, bucket: str
) -> None:
    """Found by CI: a connection cut between a listing's headers and its body, as the store
    went away, was parsed by botocore as a listing without entries: the members' heartbeats
    vanished from one read, and a fleet wait concluded on the reading member alone."""
    records.beat(heartbeat("a"))
    records.beat(heartbeat("b"))
    records.swap(generation_one())
    reads: list[tuple[Callable[[], dict[str, Any]], list[str], int]] = [
        (records.beats, ["a", "b"], 0),
        (records.read_all, [MODEL], 1),  # after its GET of the generations index
    ]
    for read, expected, skip in reads:
        listings = _listings(proxy)
        proxy.fail_next(1, "cut_after_headers", key=f"/{bucket}", skip=skip)
        assert sorted(read()) == expected
        assert _listings(proxy) == listings + 2  # the cut one, and the one retried


def _listings(proxy: FaultProxy) -> int:
    return sum(1 for seen in proxy.requests if seen.method == "GET" and "list-type" in seen.query)
