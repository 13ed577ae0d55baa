"""The desired state read through the fleet's generations index, against moto's server over
HTTP: what an idle reader asks of S3, and that every way the index can be behind, absent or
garbled still ends with every reader on the records.

Each reader reaches moto through a :class:`FaultProxy` that counts its requests; writers made
by hand (a person, or a member of an older version that writes no index) go straight to moto.
The listing's beat (``store.full_scan_seconds``) is driven by a clock the test moves.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from controlplane.adapters.stores.fleet_records import encode_desired
from controlplane.adapters.stores.s3 import S3Store
from controlplane.adapters.stores.s3_fleet import S3DesiredStates
from controlplane.adapters.stores.s3_generations import INDEX_NAME, encode_index, parse_index
from controlplane.domain.errors import StoreUnavailable
from controlplane.domain.fleet import DesiredModel, first_generation
from tests.support.fault_proxy import FaultProxy, SeenRequest
from tests.support.s3 import s3_client
from tests.support.s3_fixtures import fault_proxy, moto_endpoint, s3_bucket  # noqa: F401

PREFIX = "store"
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
LISTING_EVERY = 300.0


class Beat:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(model: str, generation: int, release: str, *, by: str = "a") -> DesiredModel:
    desired = first_generation(model, by=by, at=T0, trigger="api", reason="")
    for n in range(generation):
        desired = desired.changed(
            by=by,
            at=T0 + timedelta(seconds=n),
            trigger="api",
            reason=f"deploy of {release}",
            release=release if n == generation - 1 else f"{release}-{n}",
        )
    assert desired.generation == generation
    return desired


def next_of(current: DesiredModel, release: str, *, by: str = "a") -> DesiredModel:
    return current.changed(
        by=by,
        at=current.set_at + timedelta(seconds=1),
        trigger="api",
        reason=f"deploy of {release}",
        release=release,
        previous=current.release,
    )


@pytest.fixture
def bucket(s3_bucket: tuple[Any, str]) -> str:  # noqa: F811
    return s3_bucket[1]


@pytest.fixture
def direct(s3_bucket: tuple[Any, str]) -> Any:  # noqa: F811
    return s3_bucket[0]


@pytest.fixture
def proxy(fault_proxy: FaultProxy) -> FaultProxy:  # noqa: F811
    return fault_proxy


@pytest.fixture
def reader(proxy: FaultProxy, bucket: str) -> Iterator[Callable[[Beat], S3DesiredStates]]:
    clients: list[Any] = []

    def make(beat: Beat) -> S3DesiredStates:
        client = s3_client(proxy.endpoint)
        clients.append(client)
        store = S3Store(f"s3://{bucket}/{PREFIX}", client=client, backoff_max=0.005)
        return S3DesiredStates(store, listing_every=LISTING_EVERY, monotonic=beat)

    yield make
    for client in clients:
        client.close()


def by_hand(direct: Any, bucket: str, desired: DesiredModel) -> None:
    """A record written as a person (or an older member) would: no index raised."""
    key = f"{PREFIX}/_controlplane/desired/{desired.model}.json"
    direct.put_object(Bucket=bucket, Key=key, Body=encode_desired(desired))


def raw_index(direct: Any, bucket: str) -> bytes:
    body = direct.get_object(Bucket=bucket, Key=f"{PREFIX}/{INDEX_NAME}")["Body"]
    try:
        return bytes(body.read())
    finally:
        body.close()


def index_of(direct: Any, bucket: str) -> dict[str, str]:
    """The index as stored: each model's record's ETag."""
    models: dict[str, dict[str, Any]] = json.loads(raw_index(direct, bucket))["models"]
    return {model: entry["etag"] for model, entry in models.items()}


def etags(direct: Any, bucket: str) -> dict[str, str]:
    """Each model's record's ETag, as the store lists them."""
    listed = direct.list_objects_v2(Bucket=bucket, Prefix=f"{PREFIX}/_controlplane/desired/")
    return {
        entry["Key"].rpartition("/")[2].removesuffix(".json"): entry["ETag"]
        for entry in listed.get("Contents", [])
    }


def asked(proxy: FaultProxy, since: int) -> list[str]:
    """The requests made since ``since``, each as ``METHOD what`` (what: the index, a record,
    or the listing of the records)."""
    return [_kind(r) for r in proxy.requests[since:]]


def _kind(request: SeenRequest) -> str:
    if "list-type=2" in request.query:
        return f"{request.method} listing"
    if request.path.endswith(INDEX_NAME):
        return f"{request.method} index"
    return f"{request.method} {request.path.rpartition('/')[2]}"


def test_an_idle_reader_asks_one_conditional_get_per_read_whatever_the_number_of_models(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    beat = Beat()
    writer = reader(beat)
    for n in range(20):
        writer.swap(record(f"model{n}", 1, "r1"))
    assert set(index_of(direct, bucket)) == {f"model{n}" for n in range(20)}

    member = reader(Beat())
    assert len(member.read_all()) == 20  # its first read lists them (and reads each once)
    start = len(proxy.requests)
    for _ in range(5):
        assert len(member.read_all()) == 20
    assert asked(proxy, start) == ["GET index"] * 5  # each a 304


def test_a_swap_is_read_through_the_index_fetching_only_the_record_that_moved(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy
) -> None:
    writer, member = reader(Beat()), reader(Beat())
    for n in range(3):
        writer.swap(record(f"model{n}", 1, "r1"))
    member.read_all()
    writer.swap(next_of(record("model1", 1, "r1"), "r2"))

    start = len(proxy.requests)
    assert member.read_all()["model1"].release == "r2"
    assert asked(proxy, start) == ["GET index", "GET model1.json"]


def test_a_record_written_without_the_index_is_read_at_the_next_listing_which_repairs_it(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    first, second = Beat(), Beat()
    member, other = reader(first), reader(second)
    member.swap(record("kept", 1, "r1"))
    member.read_all()
    other.read_all()
    by_hand(direct, bucket, record("new", 1, "r7"))  # no index raised: the readers cannot know

    assert "new" not in member.read_all()
    first.now += LISTING_EVERY  # the listing's beat: the records themselves
    assert member.read_all()["new"].release == "r7"
    assert index_of(direct, bucket) == etags(direct, bucket)  # repaired by that reader

    start = len(proxy.requests)
    assert other.read_all()["new"].release == "r7"  # the other reads it through the index
    assert "GET listing" not in asked(proxy, start)


def test_a_fleet_without_an_index_lists_until_a_reader_writes_one(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    by_hand(direct, bucket, record("old", 4, "r4"))  # a fleet from before the index
    member = reader(Beat())
    assert member.read_all()["old"].generation == 4
    assert index_of(direct, bucket) == etags(direct, bucket)
    start = len(proxy.requests)
    member.read_all()
    assert asked(proxy, start) == ["GET index"]


def test_an_index_that_is_not_ours_is_said_once_listed_around_and_rewritten(
    reader: Callable[[Beat], S3DesiredStates],
    proxy: FaultProxy,
    direct: Any,
    bucket: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="controlplane.adapters.stores")
    beat = Beat()
    member = reader(beat)
    member.swap(record("kept", 1, "r1"))
    member.read_all()
    key = f"{PREFIX}/{INDEX_NAME}"
    for garbage in (
        b"{not json",
        b'{"schema": "x"}',
        b'{"schema": "controlplane-generations/v1", "models": {"kept": NaN}}',
    ):
        direct.put_object(Bucket=bucket, Key=key, Body=garbage)
        by_hand(direct, bucket, record("kept", 2, f"r-{len(garbage)}"))
        # The index cannot be read: the records are listed, and the change is seen at once.
        assert member.read_all()["kept"].release == f"r-{len(garbage)}"
        assert member.read_all()["kept"].release == f"r-{len(garbage)}"
    said = [r for r in caplog.records if "generations index" in r.getMessage()]
    assert len(said) == 3  # once per version of the index, not once per read
    assert index_of(direct, bucket) == etags(direct, bucket)  # rewritten by the reader
    start = len(proxy.requests)
    member.read_all()
    assert asked(proxy, start) == ["GET index"]


def test_an_event_names_a_record_the_index_does_not_show_yet(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    member = reader(Beat())
    member.swap(record("m", 1, "r1"))
    member.read_all()
    # The bucket's event of a record comes before its writer raised the index (or a writer
    # died between the two): the event's model is read whatever the index says.
    by_hand(direct, bucket, next_of(record("m", 1, "r1"), "r2"))
    start = len(proxy.requests)
    assert member.read_all(named={"m"})["m"].release == "r2"
    assert asked(proxy, start) == ["GET index", "GET m.json"]
    assert member.read_all()["m"].release == "r2"  # and kept, though the index is behind


def test_a_record_deleted_and_written_again_from_generation_one_is_read_through_the_index(
    reader: Callable[[Beat], S3DesiredStates], direct: Any, bucket: str
) -> None:
    """What the docs tell a person to do with a broken record: delete it, deploy again."""
    writer, member = reader(Beat()), reader(Beat())
    writer.swap(record("m", 1, "r1"))
    writer.swap(next_of(record("m", 1, "r1"), "r2"))
    assert member.read_all()["m"].generation == 2
    direct.delete_object(Bucket=bucket, Key=f"{PREFIX}/_controlplane/desired/m.json")
    writer.swap(record("m", 1, "r9"))
    assert member.read_all()["m"].release == "r9"


def test_a_late_index_write_of_an_older_swap_costs_a_read_not_a_change(
    reader: Callable[[Beat], S3DesiredStates], direct: Any, bucket: str
) -> None:
    beat = Beat()
    writer, member = reader(Beat()), reader(beat)
    writer.swap(one := record("m", 1, "r1"))
    stale = raw_index(direct, bucket)
    writer.swap(next_of(one, "r2"))
    assert member.read_all()["m"].release == "r2"
    key = f"{PREFIX}/{INDEX_NAME}"  # the first swap's index write, landing last
    direct.put_object(Bucket=bucket, Key=key, Body=stale)
    assert member.read_all()["m"].release == "r2"  # read again, still the newest
    beat.now += LISTING_EVERY
    assert member.read_all()["m"].release == "r2"
    assert index_of(direct, bucket) == etags(direct, bucket)  # set right by the listing


# --- found by attacking it -------------------------------------------------------------------


def test_a_record_fetch_that_fails_is_tried_again_at_the_next_read(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy
) -> None:
    writer, member = reader(Beat()), reader(Beat())
    writer.swap(one := record("m", 1, "r1"))
    member.read_all()
    writer.swap(next_of(one, "r2"))
    proxy.fail_always("503", key="/_controlplane/desired/m.json")
    with pytest.raises(StoreUnavailable):
        member.read_all()
    proxy.clear()
    assert member.read_all()["m"].release == "r2"  # not at the next listing, 300 s later


def test_a_repair_keeps_a_swap_that_lands_while_it_lists(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    beat = Beat()
    writer = S3DesiredStates(S3Store(f"s3://{bucket}/{PREFIX}", client=direct))
    member = reader(beat)
    writer.swap(one := record("m", 1, "r1"))
    member.read_all()
    by_hand(direct, bucket, record("other", 1, "r1"))  # the index is wrong: a repair is due
    # The repair reads the index again before it writes: a swap lands just before that read.
    proxy.on_get(INDEX_NAME, lambda _: writer.swap(next_of(one, "r2")), skip=1)
    beat.now += LISTING_EVERY
    assert member.read_all()["m"].release == "r1"  # listed before the swap
    assert index_of(direct, bucket) == etags(direct, bucket)  # the swap's entry kept
    assert member.read_all()["m"].release == "r2"  # and read through the index at once


def test_a_repair_drops_the_entries_of_records_that_are_not_there(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    beat = Beat()
    member = reader(beat)
    member.swap(record("kept", 1, "r1"))
    names = {f"ghost{n}": (f'"{n:032x}"', 1) for n in range(200)}
    entries = parse_index(raw_index(direct, bucket))
    assert isinstance(entries, dict)
    key = f"{PREFIX}/{INDEX_NAME}"
    direct.put_object(Bucket=bucket, Key=key, Body=encode_index({**entries, **names}))
    start = len(proxy.requests)
    assert set(member.read_all()) == {"kept"}  # 200 records to fetch: listed instead
    assert asked(proxy, start).count("GET listing") == 1
    assert len(asked(proxy, start)) < 10
    assert set(index_of(direct, bucket)) == {"kept"}  # the ghosts dropped by the repair
    start = len(proxy.requests)
    member.read_all()
    assert asked(proxy, start) == ["GET index"]


def test_an_index_that_is_not_ours_is_replaced_in_a_fleet_without_records(
    reader: Callable[[Beat], S3DesiredStates], proxy: FaultProxy, direct: Any, bucket: str
) -> None:
    direct.put_object(Bucket=bucket, Key=f"{PREFIX}/{INDEX_NAME}", Body=b"garbage")
    member = reader(Beat())
    assert member.read_all() == {}
    assert index_of(direct, bucket) == {}
    start = len(proxy.requests)
    member.read_all()
    assert asked(proxy, start) == ["GET index"]  # no listing at every read
