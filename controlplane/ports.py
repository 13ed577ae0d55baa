"""The seams between the use cases and the world, as Protocols.

Services depend on these and nothing else; ``wiring`` hands them concrete adapters. Tests
hand them fakes that implement the same Protocols (no patching). Blocking ports (store,
staging, state) are called from worker threads by the services; the Triton port is async.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Protocol

from controlplane.domain.alerts import Alert, AlertRecord, Receipt
from controlplane.domain.checksums import FileDigest
from controlplane.domain.fleet import DesiredModel, MemberBeat
from controlplane.domain.ignored import IgnoredName
from controlplane.domain.memory import LeakTrend, MemorySample, ResidueReport
from controlplane.domain.operations import Operation, OperationKind
from controlplane.domain.releases import ReleaseInfo
from controlplane.domain.rollback import DegradedRelease, RollbackRecord
from controlplane.domain.slots import Slot
from controlplane.domain.smoke import SmokeSample
from controlplane.domain.stress import Load
from controlplane.domain.traffic import Signature
from controlplane.domain.transfer import RetryCause
from controlplane.domain.triton import TritonState

# --- model store -------------------------------------------------------------------------


@dataclass(frozen=True)
class FetchProgress:
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int


@dataclass(frozen=True)
class StoredFile:
    """One file of a release as the store lists it, before anything is fetched."""

    size: int  # the listed size (apparent size for a sparse file): what a fetch writes
    # The store's version of it: an S3 ETag, a directory store's device, inode, size and
    # mtime. A fetch insists on it, and the content cache gives a file only for a version it
    # has seen hold the entry's bytes (or that the store confirms: ModelStore.confirm).
    version: str | None = None


@dataclass(frozen=True)
class ReleaseListing:
    """A release's files (path below the release dir -> :class:`StoredFile`), paths checked,
    ``SHA256SUMS`` included when the release has one. What a fetch may write, and no more."""

    model: str
    release: str
    files: Mapping[str, StoredFile]

    @property
    def sizes(self) -> dict[str, int]:
        return {rel: stored.size for rel, stored in self.files.items()}

    def only(self, rels: Collection[str]) -> ReleaseListing:
        """The same listing restricted to ``rels``."""
        return replace(self, files={r: f for r, f in self.files.items() if r in rels})


@dataclass(frozen=True)
class FetchedRelease:
    """What a store wrote into a staging dir, hashed while it was written."""

    manifest: Mapping[str, str] | None  # the SHA256SUMS it wrote, parsed; None without one
    files: Mapping[str, FileDigest]
    bytes_total: int  # bytes of the whole release
    bytes_fetched: int = 0  # bytes actually transferred (the rest came from the cache)
    refetched: int = 0  # fetches repeated because a file's digest did not match SHA256SUMS
    retries: int = 0  # requests tried again after a transient fault (throttling, 5xx, ...)


@dataclass(frozen=True)
class MarkerFiles:
    """The raw bytes of a release's ``SHA256SUMS`` and ``SHA256SUMS.sig``, each None when the
    release has none. A signature is checked over exactly these bytes, and the manifest a
    deploy fetches by is parsed from them: what was verified is what is used."""

    manifest: bytes | None
    signature: bytes | None


class ModelStore(Protocol):
    """Where releases come from: ``<store>/<model>/<release>/``."""

    @property
    def uri(self) -> str: ...

    def close(self) -> None:
        """Release connections and stop retries in flight (a no-op for stores without)."""
        ...

    def list_models(self, *, ignored: Callable[[IgnoredName], None] | None = None) -> list[str]:
        """The models in the store, in natural order. Each entry left out because its name is
        no model's (and may be a misnamed one: :mod:`controlplane.domain.ignored`) is passed to
        ``ignored``, when given, as the listing meets it."""
        ...

    def list_releases(
        self, model: str, *, ignored: Callable[[IgnoredName], None] | None = None
    ) -> list[ReleaseInfo]:
        """Every release of ``model``, complete or not, in natural order; each dir (or key
        prefix) left out because its name is no release's is passed to ``ignored``."""
        ...

    def describe(self, model: str, release: str, *, patient: bool = False) -> ReleaseInfo:
        """The release, or :class:`ReleaseNotFound`. A store that does not answer is tried
        again for a few seconds, then :class:`StoreUnavailable`; ``patient`` (a caller that
        waits for the operation anyway) tries as long as a fetch does (``retry_seconds``)."""
        ...

    def read_manifest(self, model: str, release: str) -> dict[str, str] | None:
        """The parsed ``SHA256SUMS``, or None when the release has none (yet)."""
        ...

    def read_marker_files(self, model: str, release: str) -> MarkerFiles:
        """The bytes of ``SHA256SUMS`` (at most its bound: a larger one is
        :class:`UnsafeRelease`) and of ``SHA256SUMS.sig`` (at most one byte past its bound, so
        a verifier can tell it is too long), each read once."""
        ...

    def list_files(self, model: str, release: str) -> ReleaseListing:
        """Every file of the release with its size, nothing fetched: :class:`ReleaseNotFound`
        when it is gone, :class:`UnsafeRelease` for symlinks, special files or unsafe paths."""
        ...

    def confirm(
        self,
        listing: ReleaseListing,
        rel: str,
        sha256: str,
        cancel: threading.Event | None = None,
    ) -> bool:
        """Whether the store's file ``rel`` of ``listing``, at its listed version, holds bytes
        that hash to ``sha256``, when the store can tell without a fetch: a directory store
        reads the file; an S3 store cannot (a read is a download) and says False. Once
        ``cancel`` is set, :class:`Interrupted`."""
        ...

    def fetch(
        self,
        listing: ReleaseListing,
        dest: Path,
        *,
        manifest: Mapping[str, str] | None,
        have: Mapping[str, FileDigest] | None = None,
        progress: Callable[[FetchProgress], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> FetchedRelease:
        """Write the files of ``listing`` (and nothing else) under the existing dir ``dest``.

        Each file is hashed while it is written. One whose digest differs from ``manifest`` is
        fetched again; the same wrong digest twice is returned as it is (verification then
        calls it ``checksum_mismatch``), a different one every time is :class:`StoreUnavailable`.
        A file fetched in parts is judged part by part: only the parts whose fetches disagree
        are fetched again, until two fetches of each agree, for as long as a transient fault
        is retried; then it holds the store's bytes, right or wrong.
        Files named in ``have`` are already there (linked from the content cache with the
        digest the manifest lists): they are not fetched again, and are returned as they are.
        Once ``cancel`` is set, the fetch stops at its next chunk or backoff, deletes what it
        was writing and raises :class:`Interrupted`.
        """
        ...


@dataclass(frozen=True)
class StoreChanges:
    """What a store's change events said since the watcher last asked.

    ``models``: the models whose dirs had an event. ``complete``: events were watched the whole
    time since the last ask, so no other model changed, as far as events can tell (a kernel
    may still drop some, hence the full scans on a slower beat). Not complete: list them all.
    ``others``: an entry at the store's top that is no model's changed (a misnamed model dir
    may have appeared or gone): list the models once to see it.
    """

    models: frozenset[str] = frozenset()
    complete: bool = False
    others: bool = False


class SignatureVerifier(Protocol):
    """The keyring of publisher keys (:mod:`controlplane.adapters.keyring`)."""

    def verify(self, data: bytes, signature: bytes, where: str) -> str:
        """The name of the trusted key that signed ``data``, or :class:`SignatureInvalid` /
        :class:`UnknownSigner` saying why there is none (``where`` names the release)."""
        ...


class ChangeEvents(Protocol):
    """A store's change notifications (a local store's inotify, an S3 bucket's events through
    SQS), read by the release watcher."""

    def take(self) -> StoreChanges:
        """What changed since the last call; forgotten once returned. Called in the event
        loop."""
        ...

    def handled(self, models: frozenset[str]) -> None:
        """The watcher has listed ``models`` (and acted on what it found: recorded new
        releases, claimed or started their auto-deploys) since the last :meth:`take`: what
        named them is done with. A source whose events can be redelivered (SQS) drops them
        only now, so a daemon that dies before this hears them again. Called in the event
        loop, after each scan that did not fail as a whole."""
        ...


# --- staging and the model repository -----------------------------------------------------


@dataclass(frozen=True)
class ReleaseMarker:
    """Written into every dir the daemon places, so the repository says what it holds."""

    model: str
    release: str
    operation_id: str
    revision: str | None = None  # the store's revision of the release (SHA256SUMS digest, ETag)


@dataclass(frozen=True)
class CachedFiles:
    """What the content cache gave a release before its fetch."""

    linked: Mapping[str, FileDigest]  # path -> digest: hardlinked, the fetch skips them
    # Paths whose hash the cache held but did not give: the entry's size is not the one the
    # store lists, its bytes do not match its name (it was deleted), or the store does not
    # vouch that the file holds those bytes (a version the cache has not seen, unconfirmed).
    # They are fetched.
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """The result of placing a staged dir: where the replaced dir went, if there was one."""

    model: str
    target: Path
    replaced: Path | None


class Staging(Protocol):
    """Temp dirs beside the repository, verification, and atomic placement into it."""

    def create(self, operation_id: str) -> Path:
        """A fresh, empty staging dir for one operation; the release goes in ``<it>/model``."""
        ...

    def free_bytes(self) -> int:
        """Bytes this process may still write on the staging filesystem."""
        ...

    def link_cached(
        self,
        dest: Path,
        manifest: Mapping[str, str] | None,
        listing: ReleaseListing,
        *,
        confirm: Callable[[str, str, threading.Event], bool] | None = None,
        cancel: threading.Event | None = None,
    ) -> CachedFiles:
        """Create ``dest`` and hardlink into it every manifest file the content cache holds
        with the size ``listing`` gives it, and for which the store vouches: the file's listed
        version is one the cache has seen hold the entry's bytes (:meth:`remember`), or
        ``confirm(path, sha256, cancel)`` says it holds them (:meth:`ModelStore.confirm`). An
        entry this process has not hashed as it is now (inode, size, mtime) is hashed first;
        one that does not match its name is deleted. Once ``cancel`` is set,
        :class:`Interrupted`."""
        ...

    def remember(
        self, root: Path, files: Mapping[str, FileDigest], listing: ReleaseListing
    ) -> None:
        """Add verified files to the content cache (hardlinks), with the store versions of
        ``listing`` they were fetched at, then evict to the bound."""
        ...

    def verify(
        self, root: Path, manifest: Mapping[str, str] | None, files: Mapping[str, FileDigest]
    ) -> None:
        """Refuse symlinks, special files and anything the manifest does not match."""
        ...

    def finalize(self, root: Path, marker: ReleaseMarker) -> None:
        """Byte-compile Python sources, write the marker, fsync everything."""
        ...

    def place(self, staged: Path, name: str, *, owner: str) -> Placement:
        """Make ``staged`` the repository's ``name`` dir in one atomic step.

        A dir already there must have been placed for model ``owner`` (its marker says so);
        anything else is :class:`NameConflict` and nothing moves."""
        ...

    def restore(self, placement: Placement) -> None:
        """Undo :meth:`place`: the repository holds exactly what it held before."""
        ...

    def discard(self, placement: Placement) -> None:
        """Delete the dir that :meth:`place` replaced, once the new one serves."""
        ...

    def remove(self, model: str) -> bool:
        """Take ``model``'s dir out of the repository atomically, then delete it."""
        ...

    def read_marker(self, name: str) -> ReleaseMarker | None: ...

    def placed(self) -> dict[str, ReleaseMarker]:
        """Every dir in the repository that holds a placed release, by name."""
        ...

    def ensure_alias_dir(self, model: str) -> None:
        """Make ``<repository>/<model>/1/``, the home of the alias ensemble, if missing."""
        ...

    def is_alias_dir(self, model: str) -> bool: ...

    def release_dir(self, operation_dir: Path) -> Path: ...

    def cleanup(self, operation_id: str) -> None: ...

    def clean_all(self) -> list[str]:
        """Delete every leftover staging dir (start-up); return what was removed."""
        ...


class ModelConfigEditor(Protocol):
    """Reads and rewrites ``config.pbtxt`` with Triton's own schema."""

    def prepare(self, config_path: Path, name: str) -> ModelSummary: ...


@dataclass(frozen=True)
class ModelSummary:
    name: str
    backend: str
    decoupled: bool = False
    sequence_batching: bool = False
    instance_kinds: tuple[str, ...] = ()
    memory_hint: int | None = None  # bytes the release says its load needs
    instances: int = 1  # instances the config asks for (a lower bound: KIND_GPU is per GPU)

    @property
    def may_use_gpu(self) -> bool:
        """KIND_GPU, or KIND_AUTO (Triton's default: a GPU when there is one)."""
        return not self.instance_kinds or any(k != "KIND_CPU" for k in self.instance_kinds)


# --- Triton -------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexEntry:
    """One row of Triton's repository index."""

    name: str
    version: str
    state: TritonState
    reason: str = ""


class Triton(Protocol):
    """Triton's model control, in the daemon's intents; the adapter owns Triton's JSON."""

    async def is_live(self) -> bool: ...

    async def liveness(self) -> str | None:
        """None when Triton answers that it is live; else why not: the address tried, the
        likely cause and what to check, in words for the user."""
        ...

    async def connection_lost(self) -> None:
        """Wait until a connection to Triton that was up goes down (Triton stopped or
        restarted), without calling Triton; while none is up, connect first."""
        ...

    async def load(self, model: str) -> None:
        """Load or reload ``model`` from its files; READY when this returns.

        :class:`TritonLoadFailed` with Triton's reason, or :class:`TritonTimeout` when the
        load did not end within the load timeout (Triton may go on loading: see
        :meth:`abandon`)."""
        ...

    async def unload(self, model: str) -> None: ...

    async def abandon(self, model: str, wait: float) -> bool:
        """After a load timed out: ask for the unload without waiting on it (Triton serves
        it once the load ends), then watch the index up to ``wait`` s. True when ``model``
        left LOADING; False when Triton still holds it (a load that never ends keeps its name
        until Triton restarts)."""
        ...

    async def index(self) -> list[IndexEntry]: ...

    async def wait_unavailable(self, model: str, timeout: float) -> None:
        """Poll the index until ``model`` is UNAVAILABLE (or gone), or raise TritonTimeout."""
        ...

    async def signature(self, model: str) -> Signature:
        """The inputs and outputs ``model`` is served with (after Triton's auto-complete)."""
        ...

    async def point_alias(self, alias: str, slot: str, signature: Signature) -> None:
        """(Re)load ``alias`` as a one-step ensemble that forwards ``signature`` to ``slot``."""
        ...

    async def alias_target(self, alias: str) -> str | None:
        """The slot ``alias`` points at; None when it is not loaded or not an alias."""
        ...

    async def reload_cpu_only(self, model: str) -> list[dict[str, object]]:
        """Reload ``model`` with every instance on CPU (Triton applies it in place: the model
        keeps answering); return the instance groups it now has."""
        ...

    async def smoke(self, model: str, sample: SmokeSample | None) -> dict[str, list[float]]:
        """One checked inference; :class:`PreflightFailed` when it fails or answers wrong."""
        ...

    async def close(self) -> None: ...


class MetricsSource(Protocol):
    async def pending_requests(self, model: str) -> int | None:
        """Requests queued for ``model`` now, or None when the metrics cannot be read."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class GpuMemory:
    total: int
    used: int

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)


class MemoryFigures(Protocol):
    """Free memory where a load would put the model, for the headroom check."""

    async def gpu_memory(self) -> dict[str, GpuMemory] | None:
        """Per GPU (``gpu_uuid``); ``{}`` when Triton reports none, None when unreadable."""
        ...

    def host_available(self) -> int | None:
        """Bytes the host can still give (MemAvailable); None when unreadable."""
        ...

    def shm(self) -> ShmSpace | None:
        """The shared-memory filesystem Triton's backends map (``/dev/shm``); None when it
        cannot be read."""
        ...


@dataclass(frozen=True)
class ShmSpace:
    total: int
    free: int  # what an unprivileged process can still write
    path: str = "/dev/shm"  # noqa: S108 - the mount read (memory.shm_path), for messages

    @property
    def used(self) -> int:
        return max(0, self.total - self.free)


class InferenceLoad(Protocol):
    """Inference traffic on purpose: the stress preflight's load."""

    async def drive(
        self, model: str, sample: SmokeSample | None, *, concurrency: int, seconds: float
    ) -> Load:
        """Send ``model`` the sample's inputs (or inputs generated from its config) from
        ``concurrency`` clients at once, each sending its next request as soon as the last
        answered, for ``seconds``; every latency and failure, none retried."""
        ...


@dataclass(frozen=True)
class TritonMemory:
    """Triton's process as the leak trend sees it."""

    pid: int
    resident_bytes: int | None
    shm_bytes: int | None  # in use under /dev/shm
    host_total_bytes: int | None

    @property
    def host_bytes(self) -> int | None:
        if self.resident_bytes is None:
            return None
        return self.resident_bytes + (self.shm_bytes or 0)


class ResidueProbe(Protocol):
    def finish(self) -> ResidueReport:
        """Audit what the slot left behind; call once its dir is removed."""
        ...


class TritonProcesses(Protocol):
    """Triton's processes, when this daemon can see them (same host, or same pod with
    shareProcessNamespace)."""

    def probe(self, slot: str) -> ResidueProbe:
        """Snapshot a loaded slot before its unload."""
        ...

    def memory(self) -> TritonMemory | None:
        """None when Triton's process is not visible."""
        ...

    def skipped(self) -> str | None:
        """Why the processes cannot be seen; None when they can."""
        ...


class UtilizationSource(Protocol):
    """GPU utilisation for the overload watcher: Triton's /metrics or a Prometheus query."""

    async def gpu_utilization(self) -> dict[str, float] | None:
        """Utilisation per GPU (or per series); ``{}`` when there is none, None when the
        source could not be read (the watcher then holds: unknown)."""
        ...

    async def close(self) -> None: ...


# --- persistence: one repository per aggregate ---------------------------------------------


@dataclass(frozen=True)
class ModelRecord:
    """What should serve (desired state) for one model, and its slots as last recorded."""

    name: str
    active_release: str | None
    previous_release: str | None
    updated_at: datetime
    slots: Sequence[Slot] = field(default_factory=tuple)


@dataclass(frozen=True)
class Serving:
    """What serves and what served before: the desired state of one model."""

    active: str | None
    previous: str | None


class ServingRepo(Protocol):
    @property
    def writes(self) -> int:
        """Writes this process submitted so far. A read submitted after the count was taken
        sees them all (one database thread takes jobs in order), and the daemon is its
        database's only writer (the instance lock): a read is current while the count holds."""
        ...

    async def get(self, model: str) -> ModelRecord | None: ...

    async def all(self) -> list[ModelRecord]: ...

    async def commit(
        self,
        model: str,
        at: datetime,
        *,
        serving: Serving | None = None,
        slots: Sequence[Slot] = (),
    ) -> None:
        """Write a change of ``model`` (what serves, any of its slots) in one transaction."""
        ...

    async def forget_slots(self, model: str, names: Sequence[str]) -> None: ...


class OperationLog(Protocol):
    @property
    def writes(self) -> int:
        """Operations saved by this process so far (see :attr:`ServingRepo.writes`). Also: an
        answer made from what Triton said before the count moved may be out of date, since
        every change the daemon makes to Triton is an operation, saved as it goes."""
        ...

    def save(self, operation: Operation) -> None:
        """Queue the operation's record; returns at once, records land in order. Any thread."""
        ...

    async def get(self, operation_id: str) -> Operation | None: ...

    async def recent(self, model: str | None = None, limit: int = 20) -> list[Operation]: ...

    async def unfinished(self) -> list[Operation]: ...

    async def latest(
        self, models: Sequence[str], kind: OperationKind | None = None
    ) -> dict[str, Operation]:
        """The newest operation (of ``kind``, when given) of each of ``models`` that has one,
        in one read: for answers about many models at once."""
        ...

    async def last_deploys(self, releases: Mapping[str, str]) -> dict[str, Operation]:
        """For each model of ``releases`` (model -> release), the newest deploy of that release
        that succeeded, if any, in one read: what status says of how a release came to serve."""
        ...

    async def flush(self) -> None:
        """Return once every record queued so far is written."""
        ...


class ReleaseBook(Protocol):
    async def record(self, releases: Sequence[ReleaseInfo], at: datetime) -> None: ...

    async def seen(self, model: str) -> list[ReleaseInfo]:
        """The releases of ``model`` as last recorded (what the watcher saw before)."""
        ...


class RollbackBook(Protocol):
    @property
    def writes(self) -> int:
        """Writes this process submitted so far (see :attr:`ServingRepo.writes`)."""
        ...

    async def save(self, record: RollbackRecord) -> None: ...

    async def last(self, model: str) -> RollbackRecord | None: ...

    async def count_suppressed(self, rollback_id: str) -> None:
        """One more trigger was held back by the cooldown after this rollback."""
        ...

    async def latch(self, latch: DegradedRelease) -> None: ...

    async def unlatch(self, model: str, release: str) -> bool: ...

    async def latched(self, model: str) -> list[DegradedRelease]: ...

    async def last_of(self, models: Sequence[str]) -> dict[str, RollbackRecord]:
        """:meth:`last` of each of ``models`` that has one, in one read."""
        ...

    async def latched_of(self, models: Sequence[str]) -> dict[str, list[DegradedRelease]]:
        """:meth:`latched` of each of ``models`` that has any, in one read."""
        ...

    async def since(self, at: datetime, limit: int = 500) -> list[RollbackRecord]:
        """Every model's rollbacks recorded at or after ``at``, oldest first; the newest
        ``limit`` of them when there are more."""
        ...


class AlertBook(Protocol):
    async def record(self, alert: Alert, at: datetime) -> Receipt:
        """Store one receipt of an alert, deduped on (fingerprint, startsAt)."""
        ...

    async def recent(self, limit: int = 50) -> list[AlertRecord]: ...


class MemoryBook(Protocol):
    async def record(self, sample: MemorySample) -> None: ...

    async def recent(self, limit: int) -> list[MemorySample]:
        """The newest ``limit`` samples, oldest first."""
        ...


# --- telemetry ----------------------------------------------------------------------------


class Telemetry(Protocol):
    """What the use cases report as it happens, for ``/metrics``. Every method is cheap and
    never raises: telemetry must not fail an operation."""

    def operation_finished(self, operation: Operation) -> None:
        """Its outcome, its duration and each of its steps'."""
        ...

    def rollback_recorded(self, record: RollbackRecord) -> None: ...

    def rollback_suppressed(self, model: str) -> None: ...

    def alert_received(self, receipt: Receipt) -> None: ...

    def overload_evaluated(self, verdict: str, value: float | None) -> None: ...

    def residue_found(self, report: ResidueReport) -> None: ...

    def memory_observed(self, memory: TritonMemory, trends: Sequence[LeakTrend]) -> None: ...

    def repair_started(self, action: str) -> None:
        """The reconcile loop started a repair (load, repoint, redeploy, remove)."""
        ...

    def job_restarted(self, job: str) -> None:
        """A supervised background job failed (or ended) and is started again."""
        ...

    def store_retried(self, cause: RetryCause) -> None:
        """A store request is being tried again, for ``cause``."""
        ...

    def signature_refused(self, model: str, code: str) -> None:
        """A release of ``model`` was refused for its signature (``code``: signature_missing,
        signature_invalid, unknown_signer)."""
        ...


# --- the fleet ----------------------------------------------------------------------------


class DesiredStates(Protocol):
    """The fleet's desired state and its members' heartbeats, in the store the fleet shares
    (under ``_controlplane/``). Blocking: services call it from worker threads.

    Errors: :class:`StoreUnavailable` (retry later), :class:`StoreError` (refused, or a record
    that is not readable), :class:`DesiredStateConflict` from :meth:`swap`."""

    @property
    def where(self) -> str:
        """Where the records are, for messages (``s3://bucket/prefix/_controlplane``)."""
        ...

    def read(self, model: str, *, patient: bool = False) -> DesiredModel | None:
        """The model's record; None when the fleet has none. A store that does not answer is
        tried again for a few seconds; ``patient``, for as long as a fetch is (as for
        :meth:`ModelStore.describe`)."""
        ...

    def read_all(self) -> dict[str, DesiredModel]:
        """Every model's record, by model. A record that cannot be read is left out (and
        logged): a model the fleet cannot read is not acted on."""
        ...

    def unreadable(self) -> dict[str, str]:
        """The records the last :meth:`read_all` left out (where each is, and why): shown to
        operators, since no member acts on a model whose record cannot be read."""
        ...

    def swap(self, desired: DesiredModel) -> None:
        """Write ``desired`` if the stored record is still generation
        ``desired.generation - 1`` (absent, for generation 1); else
        :class:`DesiredStateConflict`, naming the record that won."""
        ...

    def beat(self, beat: MemberBeat) -> None:
        """Write this member's heartbeat (replacing its last one)."""
        ...

    def beats(self) -> dict[str, MemberBeat]:
        """Every member's last heartbeat, alive or not, by member."""
        ...

    def beat_of(self, member: str) -> MemberBeat | None:
        """One member's last heartbeat; None when it has none (or not one that can be read)."""
        ...

    def forget(self, member: str) -> None:
        """Delete a member's heartbeat (it left the fleet for good)."""
        ...


class FleetPeers(Protocol):
    """The other members' APIs, to wake them after this member changed the desired state. A
    wake carries nothing: a woken member reads the store, as at its next poll."""

    async def wake(self, urls: Sequence[str]) -> dict[str, str | None]:
        """Wake each member at ``urls`` (at once, each bounded by a short timeout); by URL,
        None when it answered, else why not."""
        ...


# --- time ---------------------------------------------------------------------------------


class Clock(Protocol):
    """Time, for every use case and loop: what time it is, and waiting for time to pass
    (:mod:`controlplane.timing` builds every wait on :meth:`sleep`)."""

    def now(self) -> datetime:
        """Wall-clock time, timezone-aware UTC."""
        ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock (at once for 0 or less, after
        letting other tasks run)."""
        ...
