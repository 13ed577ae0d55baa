"""The generations index of an S3 fleet: ``_controlplane/generations.json``, one small object
that says which version (the ETag) of each model's desired-state record was written last.

Every member reads the desired state every poll interval. Listing ``_controlplane/desired/``
for it costs a LIST per member per poll; reading this object with ``If-None-Match: <the ETag
read last>`` costs a GET answered ``304 Not Modified`` while nothing changed (a twelfth of a
LIST's price on AWS), and a record is fetched only when its ETag in the index is not the one
this reader holds.

The index is a hint, never the truth: the records are. Hence:

* It is written *after* a record (:meth:`GenerationsIndex.record`, by the member whose swap
  won, with the ETag the store gave the record and its generation): a reader may see a record
  newer than the index says, never an index naming a version that was not written.
* A write reads the index, sets the entries it brings, and puts it back with ``If-Match`` (or
  ``If-None-Match: *``); a lost race reads and merges again, a few times, then gives up and
  leaves it to the next repair. A record deleted and written again from generation 1 (what the
  docs tell a person to do with a broken one) gets a new ETag like any other write.
* A member that dies between its record and the index, a record written by hand, an index
  deleted or garbled by hand, the index write of an older swap landing after a newer one's:
  the reader's safety net, a listing of every record every ``store.full_scan_seconds``,
  finds the difference and repairs the index (:meth:`GenerationsIndex.repair`). A repair
  only changes an entry that is still what the reader saw before it listed, or that names an
  older generation than the one listed, so a swap that lands while it lists is never undone;
  and it drops the entries of records the listing did not find, under the same rule.

Nothing read here can stop a member: an index that is not ours is reported once per version of
it (logged), and the reader lists the records instead, as before there was an index.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import botocore.exceptions  # type: ignore[import-untyped]

from controlplane.adapters.stores.s3 import S3Store
from controlplane.domain.errors import InvalidName, ReleaseNotFound
from controlplane.domain.fleet import RESERVED_PREFIX
from controlplane.domain.names import validate_model_name

log = logging.getLogger(__name__)
INDEX_NAME = f"{RESERVED_PREFIX}/generations.json"
SCHEMA = "controlplane-generations/v1"
MAX_INDEX_BYTES = 8 * 1024 * 1024  # ~80 bytes a model: room for 100,000 models
MAX_ETAG = 200  # characters: an S3 ETag is 34 to 50
WRITE_TRIES = 5  # merges tried against other writers before the next repair is left to do it
_LOST_RACE = ("PreconditionFailed", "ConditionalRequestConflict")


class Unchanged:
    """What :meth:`GenerationsIndex.changed` returns for a 304: as read last time."""


UNCHANGED = Unchanged()


Entry = tuple[str, int]  # a record's ETag and its generation


class GenerationsIndex:
    """The index of the store ``store`` (``<base>_controlplane/generations.json``)."""

    def __init__(self, store: S3Store) -> None:
        self._store = store
        self._client = store.client
        self._bucket = store.bucket
        self.key = f"{store.base}{INDEX_NAME}"
        self._etag: str | None = None  # of the version read last, for If-None-Match
        self._refused: str | None = None  # the ETag of a version said to be refused

    @property
    def where(self) -> str:
        return f"s3://{self._bucket}/{self.key}"

    def forget(self) -> None:
        """Read it whole at the next :meth:`changed` (after a listing replaced what it said)."""
        self._etag = None

    def changed(self) -> dict[str, Entry] | Unchanged | None:
        """The records' entries by model when the index changed since the last call (or at
        the first), :data:`UNCHANGED` when it did not (a 304 to a conditional GET), None when
        there is no index this reader can use (absent, or not ours: then listed instead)."""
        etag = self._etag

        def get() -> tuple[bytes, str] | Unchanged | None:
            condition = {"IfNoneMatch": etag} if etag is not None else {}
            try:
                response = self._client.get_object(Bucket=self._bucket, Key=self.key, **condition)
            except botocore.exceptions.ClientError as exc:
                if _not_modified(exc) and etag is not None:
                    return UNCHANGED
                if _code(exc) in ("NoSuchKey", "404"):
                    return None
                raise
            body = response["Body"]
            try:
                data = bytes(body.read(MAX_INDEX_BYTES + 1))
            finally:
                body.close()
            return data, str(response["ETag"])

        try:
            found = self._store.request(get, self.key)
        except ReleaseNotFound:
            found = None
        if found is None or isinstance(found, Unchanged):
            if found is None:
                self._etag = None
            return found
        data, self._etag = found
        versions = parse_index(data)
        if isinstance(versions, str):
            if self._refused != self._etag:
                log.warning(
                    "the fleet's generations index %s is not one this version reads (%s); "
                    "reading the desired state by listing it until a member rewrites it",
                    self.where,
                    versions,
                )
                self._refused = self._etag
            return None
        return versions

    def record(self, entries: Mapping[str, Entry]) -> bool:
        """Set each model's entry (a swap that won: what it wrote is the newest record);
        True when the index holds them now. Best effort: a store that keeps refusing leaves
        it to the next repair, and an index that is not ours is replaced."""
        return self._merge(lambda current: {**current, **entries})

    def repair(self, listed: Mapping[str, Entry], seen: Mapping[str, Entry]) -> bool:
        """Make the index say what a listing found (``listed``), where the index still says
        what this reader saw of it before listing (``seen``) or an older generation: an
        entry a swap set meanwhile is kept, and so is one whose record the listing missed
        because it was written after."""

        def repaired(current: dict[str, Entry]) -> dict[str, Entry]:
            merged = dict(current)
            for model, entry in listed.items():
                now = current.get(model)
                if now is None or now == seen.get(model) or now[1] < entry[1]:
                    merged[model] = entry
            for model, entry in current.items():
                if model not in listed and seen.get(model) == entry:
                    del merged[model]  # its record is gone (deleted, or never there)
            return merged

        return self._merge(repaired)

    def _merge(self, change: Callable[[dict[str, Entry]], dict[str, Entry]]) -> bool:
        for _ in range(WRITE_TRIES):
            current, etag, ours = self._read_for_write()
            merged = change(current)
            if etag is not None and ours and merged == current:
                return True
            condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
            if self._put(encode_index(merged), condition):
                return True
        log.info(
            "the fleet's generations index %s changed under %d tries to write it; the next "
            "listing of the desired state repairs it",
            self.where,
            WRITE_TRIES,
        )
        return False

    def _read_for_write(self) -> tuple[dict[str, Entry], str | None, bool]:
        """The index as it is (empty when absent or not ours), its ETag, and whether it is
        ours (one that is not is written over even when nothing else changes)."""

        def get() -> tuple[bytes, str] | None:
            try:
                response = self._client.get_object(Bucket=self._bucket, Key=self.key)
            except botocore.exceptions.ClientError as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    return None
                raise
            body = response["Body"]
            try:
                return bytes(body.read(MAX_INDEX_BYTES + 1)), str(response["ETag"])
            finally:
                body.close()

        try:
            found = self._store.request(get, self.key, patient=True)
        except ReleaseNotFound:
            found = None
        if found is None:
            return {}, None, True
        data, etag = found
        parsed = parse_index(data)
        if isinstance(parsed, str):
            return {}, etag, False
        return parsed, etag, True

    def _put(self, body: bytes, condition: dict[str, str]) -> bool:
        """Whether the conditional write landed (False: another writer's came first)."""

        def put() -> bool:
            try:
                self._client.put_object(
                    Bucket=self._bucket,
                    Key=self.key,
                    Body=body,
                    ContentType="application/json",
                    **condition,
                )
            except botocore.exceptions.ClientError as exc:
                code = _code(exc)
                if code in _LOST_RACE or (code == "NoSuchKey" and "IfMatch" in condition):
                    return False
                raise
            return True

        landed: bool = self._store.request(put, self.key, patient=True)
        return landed


def encode_index(entries: Mapping[str, Entry]) -> bytes:
    models = {m: {"etag": etag, "generation": g} for m, (etag, g) in sorted(entries.items())}
    document = {"schema": SCHEMA, "models": models}
    return (json.dumps(document, indent=1) + "\n").encode()


def parse_index(data: bytes) -> dict[str, Entry] | str:
    """The records' entries by model, or why the bytes are no index this version reads."""
    if len(data) > MAX_INDEX_BYTES:
        return f"more than {MAX_INDEX_BYTES} bytes"
    try:
        document: Any = json.loads(data, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        return f"not JSON: {type(exc).__name__}"
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return f"no schema {SCHEMA!r}"
    models = document.get("models")
    if not isinstance(models, dict):
        return "no 'models' object"
    entries: dict[str, Entry] = {}
    for model, entry in models.items():
        try:
            validate_model_name(model)
        except InvalidName:
            return f"{str(model)[:80]!r} is no model's name"
        etag = entry.get("etag") if isinstance(entry, dict) else None
        generation = entry.get("generation") if isinstance(entry, dict) else None
        if not isinstance(etag, str) or not 0 < len(etag) <= MAX_ETAG:
            return f"the entry of {model!r} has no ETag"
        if type(generation) is not int or not 0 < generation < 2**63:
            return f"the entry of {model!r} has no positive generation"
        entries[model] = (etag, generation)
    return entries


def _refuse_constant(constant: str) -> float:
    raise ValueError(f"{constant} is no JSON number")


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _not_modified(exc: botocore.exceptions.ClientError) -> bool:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return _code(exc) in ("304", "NotModified") or status == 304
