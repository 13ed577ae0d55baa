"""The fleet's records in an S3 store: ``s3://bucket/prefix/_controlplane/...``.

The compare-and-swap of a desired state is S3's conditional write: the record is read with its
ETag, its generation checked, and the new one put with ``If-Match: <that ETag>`` (or
``If-None-Match: *`` when there was none). S3 answers 412 PreconditionFailed when another
writer got there first (409 ConditionalRequestConflict while two such writes race, and 404
NoSuchKey to ``If-Match`` when the record was deleted since it was read), so two members cannot
both win.

What the stores do (2026): AWS S3 enforces ``If-None-Match: *`` (since August 2024) and
``If-Match`` (since November 2024) on PutObject, answering 412, 409 ConditionalRequestConflict
while two conditional writes race, and 404 NoSuchKey for ``If-Match`` on a key that is gone;
MinIO enforces both (releases since 2024; an ``If-Match`` on a missing key was let through
until a 2025 fix); Ceph RGW enforces both and answers 412 for a missing key; moto's server
enforces both with 412. A store that ignores the headers (an old gateway) would let the last
writer win without telling the other, and no read-back can make that safe. So before its first
write this adapter *probes* the store: it creates a probe object with ``If-None-Match: *``
twice; a store that lets the second one through is refused with ``store_error`` naming the
problem (run such a fleet on a directory store, or set ``fleet.enabled: false``), rather than
risking two members that both think they won.

A write retried after a timeout may have landed the first time: its retry then fails the
precondition against itself. A lost race is therefore checked against the record now there:
when it is the very record this write carried, the write succeeded.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple

import botocore.exceptions  # type: ignore[import-untyped]

from controlplane.adapters.stores.fleet_records import (
    DESIRED_DIR,
    MEMBERS_DIR,
    SUFFIX,
    conflict,
    decode_beat,
    decode_desired,
    encode_beat,
    encode_desired,
    read_desired,
    require_named,
    same_write,
    utc_now,
)
from controlplane.adapters.stores.s3 import S3Store
from controlplane.adapters.stores.s3_generations import Entry, GenerationsIndex
from controlplane.domain.errors import ControlPlaneError, InvalidName, ReleaseNotFound, StoreError
from controlplane.domain.fleet import RESERVED_PREFIX, DesiredModel, MemberBeat
from controlplane.domain.names import validate_member_name, validate_model_name
from controlplane.domain.refusals import Refusal

log = logging.getLogger(__name__)
LISTING_EVERY = 300.0  # s between listings of the records (store.full_scan_seconds)
MOST_FETCHES = 32  # records one read fetches through the index; more: a listing instead
# A lost race: the precondition failed, or two conditional writes raced. (An If-Match on a key
# deleted since it was read, NoSuchKey, is one too: see _put.)
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict")


class _LostRace(Exception):
    """The conditional write's precondition did not hold."""


class S3DesiredStates:
    """``clock``: the reader's time (the daemon's clock), on which heartbeats are said to
    have landed (:attr:`MemberBeat.landed`: an object's LastModified, moved by how far the
    Date of the answer that gave it is from this reader's clock)."""

    def __init__(
        self,
        store: S3Store,
        *,
        clock: Callable[[], datetime] = utc_now,
        listing_every: float = LISTING_EVERY,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._clock = clock
        self._client = store.client
        self._bucket = store.bucket
        self._desired = f"{store.base}{DESIRED_DIR}/"
        self._members = f"{store.base}{MEMBERS_DIR}/"
        self._probe = f"{store.base}{RESERVED_PREFIX}/probe/{uuid.uuid4().hex}"
        self._enforced = False  # the store was seen to enforce conditional writes
        # key -> (ETag, the record there or why it is refused)
        self._seen: dict[str, tuple[str, DesiredModel | Refusal | None]] = {}
        self._bad_beats: dict[str, Refusal] = {}  # member records the last listing refused
        self._beats_seen: dict[str, tuple[str, MemberBeat | Refusal | None]] = {}  # ETag, beat
        self._index = GenerationsIndex(store)
        self._known_index: dict[str, Entry] = {}  # what the index said when last read whole
        self._acted: dict[str, str] = {}  # key -> the index's version of it last looked at
        self._listing_every = listing_every
        self._monotonic = monotonic
        self._next_listing = -math.inf  # monotonic time of the next listing of the records
        self._reading = threading.Lock()

    @property
    def where(self) -> str:
        return f"s3://{self._bucket}/{self._store.base}{RESERVED_PREFIX}"

    def read(self, model: str, *, patient: bool = False) -> DesiredModel | None:
        key = f"{self._desired}{validate_model_name(model)}{SUFFIX}"
        found = self._get(key, patient=patient)
        if found is None:
            return None
        require_named(found[0], model, self._url(key))
        return found[0]

    def read_all(self, named: Collection[str] = ()) -> dict[str, DesiredModel]:
        """Every model's record. Every member reads every poll interval, so what an idle
        fleet pays here is what an idle reader asks: one GET of the generations index with
        ``If-None-Match`` (answered 304 while nothing changed), and a GET of a record only
        when the index names a version of it this reader does not hold, or when an event
        ``named`` its model (the event of a record may come before its writer set the
        index). Every ``listing_every`` s, on every read while the fleet has no index this
        reader can use, and when the index names more than :data:`MOST_FETCHES` records to
        fetch, the records are listed instead (a GET only of those whose ETag changed), and
        the index is repaired (:mod:`.s3_generations`). One read at a time (the fleet sync's
        and the fleet view's come from two threads)."""
        with self._reading:
            if self._monotonic() >= self._next_listing:
                return self._read_by_listing()
            try:
                return self._read_by_index(named)
            except BaseException:
                self._index.forget()  # what moved is read again next time, not taken as read
                raise

    def _read_by_index(self, named: Collection[str]) -> dict[str, DesiredModel]:
        entries = self._index.changed()
        if entries is None:
            return self._read_by_listing()
        seen = dict(self._seen)
        acted = dict(self._acted)
        wanted = {self._key(model) for model in named if _is_model_name(model)}
        if isinstance(entries, dict):
            self._known_index = entries
            for model, (version, _) in entries.items():
                key = self._key(model)
                held = seen.get(key)
                if version != acted.get(key) and (held is None or held[0] != version):
                    wanted.add(key)
                acted[key] = version
        if len(wanted) > MOST_FETCHES:  # a listing reads them cheaper (1,000 ETags a page)
            return self._read_by_listing()
        for key in sorted(wanted):
            fetched = self._fetch(key)
            if fetched is None:
                seen.pop(key, None)
                continue
            seen[key] = (fetched.etag, read_desired(fetched.data, self._url(key), _name(key)))
        self._seen, self._acted = seen, acted  # a concurrent reader sees the old or the new
        return _records_of(seen)

    def _read_by_listing(self) -> dict[str, DesiredModel]:
        """One listing, and a GET only of the records whose ETag changed since they were read;
        then the index repaired, where it names other versions than those listed."""
        known = self._index.changed()  # first: a swap from now on shows in the listing
        if isinstance(known, dict):
            self._known_index = known
        before = dict(self._known_index) if known is not None else {}
        seen: dict[str, tuple[str, DesiredModel | Refusal | None]] = {}
        for key, etag in self._listed(self._desired).items():
            cached = self._seen.get(key)
            if cached is not None and cached[0] == etag:
                record = cached[1]
            else:
                record = self._read_record(key)
            seen[key] = (etag, record)
        self._seen = seen  # one assignment: a concurrent reader sees the old or the new
        self._acted = {key: etag for key, (etag, _) in seen.items()}
        listed = {
            record.model: (etag, record.generation)
            for etag, record in seen.values()
            if isinstance(record, DesiredModel)
        }
        if known is None or listed != before:
            self._write_index(lambda: self._index.repair(listed, before))
        self._next_listing = self._monotonic() + self._listing_every
        return _records_of(seen)

    def _write_index(self, write: Callable[[], bool]) -> None:
        """``write`` the index; a store that refuses leaves it to the next listing (the
        records are what members follow; the index only makes reading them cheap)."""
        try:
            write()
        except ControlPlaneError as exc:
            log.info(
                "could not write the fleet's generations index %s (%s); members list the "
                "desired state until it is",
                self._index.where,
                exc,
            )
        self._index.forget()  # read it whole next time: it may hold more than was written

    def unreadable(self) -> dict[str, Refusal]:
        desired = {
            self._url(k): why for k, (_, why) in self._seen.items() if isinstance(why, Refusal)
        }
        return {**desired, **self._bad_beats}

    def _read_record(self, key: str) -> DesiredModel | Refusal | None:
        """The record at ``key``, or why it is not a readable record of its name; None when it
        is gone."""
        fetched = self._fetch(key)
        return None if fetched is None else read_desired(fetched.data, self._url(key), _name(key))

    def swap(self, desired: DesiredModel) -> None:
        key = f"{self._desired}{validate_model_name(desired.model)}{SUFFIX}"
        self._check_conditional_writes()
        found = self._get(key, patient=True)
        current, etag = found if found is not None else (None, None)
        if current is not None:
            require_named(current, desired.model, self._url(key))
        if (current.generation if current else 0) != desired.generation - 1:
            raise conflict(desired, current, self._url(key))
        condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
        body = encode_desired(desired)
        # Checked below on a lost race: a retry of a write that had landed loses to itself.
        with contextlib.suppress(_LostRace):
            self._store.request(lambda: self._put(key, body, condition), key, patient=True)
        after = self._get(key, patient=True)
        if after is None or not same_write(after[0], desired):
            raise conflict(desired, after[0] if after else None, self._url(key))
        entry = {desired.model: (after[1], desired.generation)}
        self._write_index(lambda: self._index.record(entry))

    def beat(self, beat: MemberBeat) -> None:
        key = f"{self._members}{validate_member_name(beat.member)}{SUFFIX}"
        body = encode_beat(beat)
        self._store.request(lambda: self._put(key, body, {}), key)

    def beats(self) -> dict[str, MemberBeat]:
        """One listing (which dates each record), and a GET only of the records whose ETag
        changed since the last call."""
        found: dict[str, MemberBeat] = {}
        bad: dict[str, Refusal] = {}
        seen: dict[str, tuple[str, MemberBeat | Refusal | None]] = {}
        for key, (etag, landed) in self._dated(self._members).items():
            cached = self._beats_seen.get(key)
            if cached is not None and cached[0] == etag:
                beat = cached[1]
            else:
                fetched = self._fetch(key)
                beat = (
                    None
                    if fetched is None
                    else decode_beat(fetched.data, self._url(key), _name(key))
                )
            seen[key] = (etag, beat)
            if isinstance(beat, MemberBeat):
                found[beat.member] = replace(beat, landed=landed)
            elif beat is not None:
                bad[self._url(key)] = beat
        self._beats_seen = seen
        self._bad_beats = bad  # one assignment, as for the desired states
        return found

    def beat_of(self, member: str) -> MemberBeat | None:
        key = f"{self._members}{validate_member_name(member)}{SUFFIX}"
        fetched = self._fetch(key)
        if fetched is None:
            return None
        beat = decode_beat(fetched.data, self._url(key), _name(key))
        return replace(beat, landed=fetched.landed) if isinstance(beat, MemberBeat) else None

    def forget(self, member: str) -> None:
        key = f"{self._members}{validate_member_name(member)}{SUFFIX}"
        self._store.request(lambda: self._client.delete_object(Bucket=self._bucket, Key=key), key)

    # --- plumbing -------------------------------------------------------------------------

    def _check_conditional_writes(self) -> None:
        """Refuse a store that does not enforce ``If-None-Match: *`` (once, then trusted)."""
        if self._enforced:
            return
        key = self._probe
        self._store.request(lambda: self._put(key, b"probe\n", {"IfNoneMatch": "*"}), key)
        try:
            self._store.request(lambda: self._put(key, b"probe\n", {"IfNoneMatch": "*"}), key)
        except _LostRace:
            self._enforced = True
        finally:
            with contextlib.suppress(ControlPlaneError):
                self._store.request(
                    lambda: self._client.delete_object(Bucket=self._bucket, Key=key), key
                )
        if not self._enforced:
            raise StoreError(
                f"the store at {self.where} does not enforce conditional writes (a PutObject "
                "with If-None-Match: * overwrote an object), so members could not tell which "
                "of two changes to the desired state won. Use a store that does (AWS S3, "
                "MinIO, Ceph RGW), a directory store, or set fleet.enabled: false",
                details={"store": self.where},
            )

    def _put(self, key: str, body: bytes, condition: dict[str, str]) -> None:
        try:
            self._client.put_object(
                Bucket=self._bucket,
                Key=key,
                Body=body,
                ContentType="application/json",
                **condition,
            )
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in _LOST_RACE or (code == "NoSuchKey" and "IfMatch" in condition):
                raise _LostRace() from None
            raise

    def _get(self, key: str, *, patient: bool = False) -> tuple[DesiredModel, str] | None:
        found = self._fetch(key, patient=patient)
        if found is None:
            return None
        return decode_desired(found.data, self._url(key)), found.etag

    def _fetch(self, key: str, *, patient: bool = False) -> _Fetched | None:
        """The object; None when there is no such object."""

        def get() -> _Fetched | None:
            try:
                response = self._client.get_object(Bucket=self._bucket, Key=key)
            except botocore.exceptions.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise
            body = response["Body"]
            try:
                data = bytes(body.read())
            finally:
                body.close()
            landed = self._on_my_clock(response.get("LastModified"), response)
            return _Fetched(data, str(response["ETag"]), landed)

        try:
            found: _Fetched | None = self._store.request(get, key, patient=patient)
        except ReleaseNotFound:
            return None
        return found

    def _dated(self, prefix: str) -> dict[str, tuple[str, datetime | None]]:
        """The records directly under ``prefix``: key -> (ETag, when it landed)."""
        listed: dict[str, tuple[str, datetime | None]] = {}
        for page in self._store.pages(prefix):
            for entry in page.get("Contents", []):
                key = entry["Key"]
                if key.endswith(SUFFIX) and "/" not in key[len(prefix) :]:
                    landed = self._on_my_clock(entry.get("LastModified"), page)
                    listed[key] = (str(entry.get("ETag", "")), landed)
        return dict(sorted(listed.items()))

    def _on_my_clock(self, stamp: object, response: dict[str, Any]) -> datetime | None:
        """The store's timestamp ``stamp`` on this reader's clock: as long before now as it
        was before the answer's Date (both the store's clock, whatever the writer's and this
        reader's say). None when the answer has neither."""
        headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        if not isinstance(stamp, datetime) or "date" not in headers:
            return None
        try:
            answered = email.utils.parsedate_to_datetime(headers["date"])
        except (TypeError, ValueError):
            return None
        if answered.tzinfo is None or stamp.tzinfo is None:
            return None
        return self._clock() - (answered - stamp)

    def _listed(self, prefix: str) -> dict[str, str]:
        """The records directly under ``prefix``: key -> ETag."""
        return {key: etag for key, (etag, _) in self._dated(prefix).items()}

    def _url(self, key: str) -> str:
        return f"s3://{self._bucket}/{key}"

    def _key(self, model: str) -> str:
        return f"{self._desired}{model}{SUFFIX}"


class _Fetched(NamedTuple):
    data: bytes
    etag: str
    landed: datetime | None  # when it was written, on the reader's clock


def _name(key: str) -> str:
    return key.rpartition("/")[2]


def _records_of(
    seen: dict[str, tuple[str, DesiredModel | Refusal | None]],
) -> dict[str, DesiredModel]:
    return {record.model: record for _, record in seen.values() if isinstance(record, DesiredModel)}


def _is_model_name(name: str) -> bool:
    try:
        validate_model_name(name)
    except InvalidName:
        return False
    return True
