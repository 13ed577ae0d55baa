"""Records from the store cannot stop a member: one daemon on the real Triton, in a fleet on a
directory store (and on moto's S3 server), serving two models. For each kind of bad record
under ``_controlplane/`` that a person or a restored backup may leave (bad JSON, NaN, a time
without a zone in a desired state, a turn, a latch or a heartbeat, an unknown phase or state, a
generation that went back, a desired release the store does not hold or that is not signed
where a signature is required) the test writes it into the store, then checks what an operator
sees: the model keeps serving what it served, the other model still goes to a release deployed
now, the record is reported (``GET /v1/fleet``, ``/healthz``, ``controlplane status``,
``/metrics``, one log line), and no background job restarted.

One daemon per store serves every case in turn; each case puts the store back as it found it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pytest

from devtools.launcher import RunningTriton
from tests.integration.test_cli import cli
from tests.support.daemon import Daemon, start_daemon
from tests.support.inference import infer_once
from tests.support.models import write_scale_release
from tests.support.polling import eventually
from tests.support.s3 import aws_env, s3_client, upload_release_dir
from tests.support.s3_fixtures import moto_endpoint  # noqa: F401
from tests.support.signing import PublisherKey, make_key
from tests.support.stopping import stop_all
from tests.support.triton_pool import TritonPool, unique_model

pytestmark = pytest.mark.triton
PREFIX = "models"
MEMBER = "solo"
NAIVE = "2026-01-01T00:00:00"  # a time without a zone, as a hand edit writes it
KEPT_VALUE = 1.0  # what the kept model answers: its release r1 (k = 1)


class Store(Protocol):
    """The store's records and releases, as a person with access to it writes them."""

    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def delete(self, key: str) -> None: ...
    def publish(self, release_dir: Path) -> None: ...


@dataclass
class DirStore:
    root: Path

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        written = path.with_name(f".{path.name}.new")
        written.write_bytes(data)
        written.replace(path)  # whole, as a person's copy would land (not torn mid-read)

    def get(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def delete(self, key: str) -> None:
        (self.root / key).unlink(missing_ok=True)

    def publish(self, release_dir: Path) -> None:
        target = self.root / release_dir.parent.name / release_dir.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(release_dir, target)


@dataclass
class S3Store:
    client: Any
    bucket: str

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"{PREFIX}/{key}", Body=data)

    def get(self, key: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=f"{PREFIX}/{key}")["Body"]
        try:
            return bytes(body.read())
        finally:
            body.close()

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=f"{PREFIX}/{key}")

    def publish(self, release_dir: Path) -> None:
        upload_release_dir(self.client, self.bucket, PREFIX, release_dir)


@dataclass
class Rig:
    store: Store
    daemon: Daemon
    triton: RunningTriton
    kept: str  # the model whose records go bad: it must keep serving r1
    other: str  # a model that must go on converging
    backup: bytes  # the kept model's record as it was at generation 1 (it served r0)
    releases: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    generation: int = 2

    @property
    def desired_key(self) -> str:
        return f"_controlplane/desired/{self.kept}.json"

    def desired(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.store.get(self.desired_key))
        return found

    def beat(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.store.get(f"_controlplane/members/{MEMBER}.json"))
        return found

    def next_record(self, **changes: Any) -> dict[str, Any]:
        """The kept model's record one generation on, set now, with ``changes``."""
        self.generation += 1
        now = datetime.now(UTC).isoformat()
        return {**self.desired(), "generation": self.generation, "set_at": now, **changes}

    def put_json(self, key: str, record: dict[str, Any]) -> None:
        self.store.put(key, json.dumps(record).encode())  # Python writes NaN as it is: NaN


def _ready_store(store: Store, build: Path, kept: str, other: str, key: PublisherKey) -> None:
    """The kept model's releases, signed (r0, r1) and not (unsigned); the other model's, o1.."""
    for release, k, signed in (("r0", 3.0, True), ("r1", KEPT_VALUE, True), ("unsigned", 7, False)):
        release_dir = write_scale_release(build, kept, release, k=k)
        if signed:
            key.sign(release_dir / "SHA256SUMS", kept, release)
        store.publish(release_dir)
    for n in range(1, 16):
        store.publish(write_scale_release(build, other, f"o{n}", k=10.0 + n))


def _started(
    store: Store,
    triton: RunningTriton,
    workdir: Path,
    *,
    local: Path,
    store_uri: str | None = None,
    env: dict[str, str] | None = None,
) -> Rig:
    kept, other = unique_model("kept"), unique_model("other")
    key = make_key(workdir / "keys", "publisher")
    keyring = workdir / "ring"
    key.public_pem(keyring / "publisher.pem")
    _ready_store(store, workdir / "build", kept, other, key)
    daemon = start_daemon(
        triton=triton,
        store=local,
        store_uri=store_uri,
        workdir=workdir,
        config=f"store:\n  keyring: {keyring}\nmodels:\n  {kept}:\n    require_signature: true\n",
        extra_env={
            "CONTROLPLANE_FLEET__MEMBER": MEMBER,
            "CONTROLPLANE_FLEET__HEARTBEAT_SECONDS": "1",
            "CONTROLPLANE_STORE__POLL_INTERVAL_SECONDS": "1",
            # A record written by hand raises no generations index on S3: it is read at the
            # next listing of the records, every full_scan_seconds.
            "CONTROLPLANE_STORE__FULL_SCAN_SECONDS": "2",
            **(env or {}),
        },
    )
    try:
        answer = daemon.deploy(kept, "r0")
        assert answer.status_code == 200, answer.text
        rig = Rig(store, daemon, triton, kept, other, backup=b"")
        rig.backup = store.get(rig.desired_key)  # generation 1: it served r0
        for model, release in ((kept, "r1"), (other, f"o{next(rig.releases)}")):
            answer = daemon.deploy(model, release)
            assert answer.status_code == 200, answer.text
        assert rig.desired()["generation"] == 2
    except BaseException:
        daemon.stop()  # not the fixture's yet: it would outlive the session
        raise
    return rig


@pytest.fixture(scope="module")
def rigs(
    triton_pool: TritonPool,
    tmp_path_factory: pytest.TempPathFactory,
    moto_endpoint: str,  # noqa: F811
) -> Iterator[Callable[[str], Rig]]:
    """One daemon per store, each beside a Triton of its own (lent by the session's pool),
    started when a case first needs it, stopped at the end."""
    started: dict[str, Rig] = {}
    clients: list[Any] = []
    lent: list[RunningTriton] = []

    def rig(kind: str) -> Rig:
        if kind in started:
            return started[kind]
        lent.append(triton_pool.lend())
        triton = lent[-1]
        workdir = tmp_path_factory.mktemp(f"bad-records-{kind}")
        if kind == "dir":
            root = workdir / "store"
            started[kind] = _started(DirStore(root), triton, workdir, local=root)
        else:
            client = s3_client(moto_endpoint)
            clients.append(client)
            bucket = f"bad-records-{workdir.name.lower()}"
            client.create_bucket(Bucket=bucket)
            started[kind] = _started(
                S3Store(client, bucket),
                triton,
                workdir,
                local=workdir / "unused-local-store",
                store_uri=f"s3://{bucket}/{PREFIX}",
                env=aws_env(moto_endpoint),
            )
        return started[kind]

    yield rig
    stop_all([each.daemon for each in started.values()], Daemon.stop)
    for client in clients:
        client.close()
    triton_pool.give_back(lent)


# --- the bad records ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Bad:
    """A bad record: how it is written, and how the member must report it."""

    write: Callable[[Rig], None]
    kind: str  # desired or member
    reason: str
    field: str | None
    retried: bool = True  # False: a release refused once per record, never tried again


def _desired(**changes: Any) -> Callable[[Rig], None]:
    return lambda rig: rig.put_json(rig.desired_key, rig.next_record(**changes))


def _rollout(rig: Rig, **changes: Any) -> None:
    rollout = {**rig.desired()["rollout"], **changes}
    rig.put_json(rig.desired_key, rig.next_record(rollout=rollout))


def _ghost(**changes: Any) -> Callable[[Rig], None]:
    """A heartbeat of another member, copied from this one's and edited."""

    def write(rig: Rig) -> None:
        ghost = {**rig.beat(), "member": "ghost", "incarnation": "ghost-1", **changes}
        rig.put_json("_controlplane/members/ghost.json", ghost)

    return write


def _turn(rig: Rig) -> None:
    turn = {"member": MEMBER, "incarnation": "x", "at": NAIVE, "release": "r1"}
    rig.put_json(rig.desired_key, rig.next_record(turns=[turn]))


def _latch(rig: Rig) -> None:
    latch = {"release": "r0", "at": NAIVE, "reason": "rolled back from by hand"}
    rig.put_json(rig.desired_key, rig.next_record(degraded=[latch]))


def _put_back(rig: Rig) -> None:
    rig.store.put(rig.desired_key, rig.backup)  # generation 1, r0: a backup restored


def _torn(rig: Rig) -> None:
    rig.store.put(rig.desired_key, b'{"model": "' + rig.kept.encode() + b'", "generation": ')


BAD = {
    "desired-bad-json": Bad(_torn, "desired", "not_json", None),
    "desired-nan": Bad(
        lambda rig: _rollout(rig, phase="baking", canaries=[MEMBER], bake_seconds=math.nan),
        "desired",
        "not_json",
        None,
    ),
    "desired-time-without-zone": Bad(
        _desired(set_at=NAIVE), "desired", "time_without_zone", "set_at"
    ),
    "turn-time-without-zone": Bad(_turn, "desired", "time_without_zone", "turns[0].at"),
    "latch-time-without-zone": Bad(_latch, "desired", "time_without_zone", "degraded[0].at"),
    "desired-unknown-phase": Bad(
        lambda rig: _rollout(rig, phase="halfway"), "desired", "unknown_value", "rollout.phase"
    ),
    "heartbeat-time-without-zone": Bad(_ghost(at=NAIVE), "member", "time_without_zone", "at"),
    "heartbeat-nan": Bad(_ghost(interval=math.nan), "member", "not_json", None),
    "heartbeat-unknown-state": Bad(
        lambda rig: _ghost(models={rig.kept: {"release": "r1", "state": "dancing"}})(rig),
        "member",
        "unknown_value",
        None,  # the model's name is in the field: checked by the reason alone
    ),
    "generation-went-back": Bad(_put_back, "desired", "generation_went_back", "generation"),
    "release-not-in-store": Bad(
        _desired(release="r404", previous="r1"),
        "desired",
        "release_not_found",
        "release",
        retried=False,
    ),
    "release-not-signed": Bad(
        _desired(release="unsigned", previous="r1"),
        "desired",
        "signature_missing",
        "release",
        False,
    ),
}
ON_S3 = ("desired-bad-json", "heartbeat-time-without-zone", "generation-went-back")
CASES = [("dir", name) for name in BAD] + [("s3", name) for name in ON_S3]


# --- what an operator sees ---------------------------------------------------------------------


def _refused(rig: Rig, bad: Bad) -> list[dict[str, Any]]:
    """The member's refusals of this kind of record, as GET /v1/fleet lists them."""
    view = rig.daemon.get("/v1/fleet")
    assert view.status_code == 200, view.text
    return [
        r
        for r in view.json()["unreadable_records"]
        if (r["kind"], r["reason"]) == (bad.kind, bad.reason)
    ]


def _in_health(rig: Rig, bad: Bad) -> bool:
    fleet = rig.daemon.get("/healthz").json()["fleet"]
    return any((r["kind"], r["reason"]) == (bad.kind, bad.reason) for r in fleet["refused_records"])


def _metric(rig: Rig, metric: str, **labels: str) -> float | None:
    text = rig.daemon.get("/metrics").text
    spelled = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{metric}\{{{re.escape(spelled)}\}} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _passes(rig: Rig, count: int = 2) -> None:
    """Until the fleet sync has read the store ``count`` times since now."""
    seen: set[object] = set()

    def read_again() -> bool:
        seen.add(rig.daemon.get(f"/v1/models/{rig.kept}").json()["fleet"]["last_read"])
        return len(seen) > count

    eventually(read_again, 30, f"{count} passes of the fleet sync", every=0.1)


def _operations(rig: Rig) -> int:
    answer = rig.daemon.get(f"/v1/operations?model={rig.kept}&limit=100")
    return len(answer.json()["operations"])


def _put_right(rig: Rig) -> None:
    """The store as before the case: the kept model's record set anew (r1), no ghost."""
    rig.store.delete("_controlplane/members/ghost.json")
    record = json.loads(rig.backup)
    rig.generation += 1
    now = datetime.now(UTC) + timedelta(seconds=1)  # after any record the case wrote
    fixed = {**record, "generation": rig.generation, "release": "r1", "previous": "r0"}
    rig.put_json(rig.desired_key, {**fixed, "set_at": now.isoformat(), "rollout": {}})

    def clean() -> bool:
        health = rig.daemon.get("/healthz").json()["fleet"]["refused_records"]
        return bool(health == [] and rig.daemon.get("/v1/fleet").json()["unreadable_records"] == [])

    eventually(clean, 30, "no record refused any more")


@pytest.mark.parametrize(("store", "case"), CASES, ids=[f"{s}-{c}" for s, c in CASES])
def test_a_bad_record_is_refused_and_reported_while_the_member_serves_and_converges(
    rigs: Callable[[str], Rig], store: str, case: str
) -> None:
    rig, bad = rigs(store), BAD[case]
    log_before = len(rig.daemon.log())
    operations_before = _operations(rig)

    bad.write(rig)

    # The other model still goes where a deploy sends it, through the fleet's wait.
    release = f"o{next(rig.releases)}"
    answer = rig.daemon.post(
        f"/v1/models/{rig.other}/deploy", {"release": release, "wait": True, "fleet": True}
    )
    assert answer.status_code == 200, answer.text
    assert infer_once(rig.triton.grpc_url, rig.other) == 10.0 + int(release[1:])

    # Reported: the fleet's view (which record, why, which field), status, /metrics.
    eventually(lambda: bool(_refused(rig, bad)), 30, f"{case} listed in GET /v1/fleet")
    [shown] = _refused(rig, bad)
    expected_name = "ghost" if bad.kind == "member" else rig.kept
    assert shown["name"] == expected_name
    if bad.field is not None:
        assert shown["field"] == bad.field, shown
    eventually(lambda: _in_health(rig, bad), 30, f"{case} in /healthz")
    labels = {"kind": bad.kind, "reason": bad.reason}
    assert _metric(rig, "controlplane_fleet_records_refused", **labels) == 1.0
    status = cli(rig.daemon.url, "status")
    assert status.returncode == 0, status.stderr
    assert f"REFUSED RECORD ({bad.reason}): " in status.stderr
    _passes(rig)

    # The kept model serves what it served, as Triton answers and as the member says.
    assert infer_once(rig.triton.grpc_url, rig.kept) == KEPT_VALUE
    view = rig.daemon.get(f"/v1/models/{rig.kept}").json()
    assert view["active_release"] == "r1"
    if bad.kind == "desired":
        assert [r["reason"] for r in view["fleet"]["refused"]] == [bad.reason]
    if not bad.retried:  # tried once for this record, and not again at each pass
        tried = _operations(rig)
        assert tried - operations_before <= 1
        _passes(rig, 3)
        assert _operations(rig) == tried

    # Said once in the log, not at every pass; no job restarted or backs off.
    said = rig.daemon.log()[log_before:]
    assert len(re.findall(r"refusing the fleet's record .*\(" + bad.reason, said)) == 1, said
    assert "Traceback" not in said
    assert f"{rig.kept}: cannot serve" not in said  # refused, not retried on a backoff
    jobs = rig.daemon.get("/healthz").json()["jobs"]
    assert {(j["name"], j["state"], j["restarts"]) for j in jobs} == {
        (j["name"], "running", 0) for j in jobs
    }
    for job in ("fleet-sync", "reconcile"):
        assert _metric(rig, "controlplane_job_restarts_total", name=job) == 0.0

    _put_right(rig)
    assert infer_once(rig.triton.grpc_url, rig.kept) == KEPT_VALUE
