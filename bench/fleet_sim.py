"""Simulated fleet members: the store side of a member, its Triton replaced by a recorder.

A simulated member is the daemon's real store adapters (:class:`S3Store`,
:class:`S3DesiredStates`, and with the fan-out :class:`SqsStoreEvents` on a
:class:`MemberQueue` of its own) driven by a small loop with the daemon's cadences, given
explicitly (:class:`Cadences`): its heartbeat, the look at who writes under its name, the
desired-state read, the release discovery and the fleet's upkeep (the service's own
``forget_departed``). Its Triton is a :class:`Recorder`: it serves whatever the desired state
it read tells it to, and notes when it was told. There is no daemon process, no operation, no
deploy: what this measures is what the members ask of the store, and how soon they hear.

Many members share one process (:func:`worker_main`, an asyncio loop; boto3 clients are
shared, their calls run in a thread pool, each SQS long poll in a thread of its own as the
adapter does it). Periodic actions keep an absolute schedule, ``t_ref + phase + k * period``,
whose phases the bench spreads evenly over the fleet (as pods started at different times), so
any window of whole periods holds each action exactly once per member and period. A worker
obeys commands on a pipe: ``go``, ``pause`` / ``resume`` (of the periodic actions; event-driven
reads never pause), ``swap`` (a change of the desired state through its first member),
``collect`` (when each member read a generation), ``stats`` and ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing.connection import Connection
from typing import Any

from controlplane.adapters.stores.daemon_thread import in_daemon_thread
from controlplane.adapters.stores.s3 import S3Store
from controlplane.adapters.stores.s3_client import READ_TIMEOUT
from controlplane.adapters.stores.s3_fleet import S3DesiredStates
from controlplane.adapters.stores.sqs_events import SqsStoreEvents
from controlplane.adapters.stores.sqs_member_queue import MemberQueue
from controlplane.domain.errors import ControlPlaneError
from controlplane.domain.fleet import MemberBeat, MemberModel, MemberState
from controlplane.services.fleet_sync import FORGET_EVERY
from controlplane.services.fleet_upkeep import forget_departed
from controlplane.services.heartbeat import NAME_CHECK_BEATS
from controlplane.services.supervisor import Supervisor
from controlplane.timing import SystemClock
from tests.support.s3 import s3_client, sns_client, sqs_client


@dataclass(frozen=True)
class Cadences:
    """The daemon's defaults: ``fleet.keepalive_seconds``, ``store.poll_interval_seconds``,
    ``store.full_scan_seconds``, the heartbeat writer's name check and the sync's upkeep."""

    keepalive: float = 60.0
    poll: float = 10.0
    full_scan: float = 300.0
    name_check: float = 60.0 * NAME_CHECK_BEATS
    upkeep: float = FORGET_EVERY

    def periods(self, fanout: bool) -> dict[str, float]:
        """Each periodic action's period. Without the fan-out the desired state and the
        releases are read every poll; with it, on events and every full scan."""
        reads = self.full_scan if fanout else self.poll
        return {
            "beat": self.keepalive,
            "name check": self.name_check,
            "desired": reads,
            "releases": reads,
            "upkeep": self.upkeep,
        }


@dataclass(frozen=True)
class MemberSpec:
    name: str
    phases: dict[str, float]  # action -> phase in s, in [0, its period)
    upkeep: bool  # runs the fleet's upkeep (its requests go to the upkeep endpoint)


@dataclass(frozen=True)
class WorkerSpec:
    endpoint: str  # S3, SQS and SNS: the counting proxy in front of moto
    upkeep_endpoint: str  # the upkeep's S3 requests: a counting proxy of their own
    uri: str  # s3://bucket/prefix
    topic_arn: str | None  # the fan-out's topic; None: no notifications
    members: list[MemberSpec]
    cadences: Cadences
    threads: int = 32
    start_timeout: float = 600.0  # s for every member to start
    starting: int = 8  # members starting at once


@dataclass
class Told:
    """When a member's Triton stand-in was told to serve a generation of a model."""

    release: str | None
    heard_at: float | None  # perf_counter when its queue said the desired state changed
    read_at: float  # perf_counter when its read_all() returned the generation


class Recorder:
    """The member's Triton, simulated: it serves whatever it is told and notes when."""

    def __init__(self) -> None:
        self.serving: dict[str, tuple[str | None, int]] = {}  # model -> release, generation
        self.told: dict[tuple[str, int], Told] = {}

    def tell(self, model: str, release: str | None, generation: int, told: Told) -> bool:
        """Whether this is news: a newer generation than it serves."""
        if generation <= self.serving.get(model, (None, 0))[1]:
            return False
        self.serving[model] = (release, generation)
        self.told[(model, generation)] = told
        return True


class SimMember:
    def __init__(self, spec: MemberSpec, work: WorkerSpec, clients: Clients) -> None:
        self.spec = spec
        self.name = spec.name
        self.store = S3Store(work.uri, client=clients.s3)
        # The daemon lists the records at the first read once a full scan's period has passed
        # since the last listing ended: with the fan-out, at every read (its reads are that
        # period apart, counted from the end of the last); polling, every 30th or 31st. On this
        # absolute schedule a read comes exactly a period after the last one began, before the
        # listing is due again: half a poll interval of slack keeps it due at each read (and
        # polling, every 30th), as the daemon's is. ``since``: its clock, moved on a full
        # scan's period at "go", as if the member had started that long ago (else the idle
        # window would begin with reads that find the start's listing too recent).
        self.since = 0.0
        self.records = S3DesiredStates(
            self.store,
            listing_every=work.cadences.full_scan - work.cadences.poll / 2,
            monotonic=lambda: time.monotonic() + self.since,
        )
        self.upkeep_records = (
            S3DesiredStates(S3Store(work.uri, client=clients.upkeep)) if spec.upkeep else None
        )
        self.incarnation = uuid.uuid4().hex
        self.keepalive = work.cadences.keepalive
        self.recorder = Recorder()
        self.beat_on_change = False  # from "go" on: the start's beat says what it read
        self.desired_changed = asyncio.Event()
        self.named: set[str] = set()  # models the queue said changed since the last read
        self.released = asyncio.Event()
        self.heard_at: float | None = None
        self.events: SqsStoreEvents | None = None
        if work.topic_arn is not None:
            queue = MemberQueue(work.topic_arn, f"bench-{spec.name}", sns=clients.sns)
            self.events = SqsStoreEvents(
                queue,
                bucket=self.store.bucket,
                base=self.store.base,
                wake=self.released.set,
                clock=SystemClock(),
                poll_interval=work.cadences.poll,
                desired_changed=self._heard,
                client=clients.sqs,
            )

    def _heard(self, models: frozenset[str]) -> None:
        """The fleet sync's ``poke``: the models the event named are fetched at the read."""
        self.heard_at = time.perf_counter()
        self.named.update(models)
        self.desired_changed.set()

    # --- what a member asks of the store ------------------------------------------------

    async def beat(self) -> None:
        models = {
            model: MemberModel(release, MemberState.SERVING, target=release, generation=gen)
            for model, (release, gen) in self.recorder.serving.items()
        }
        beat = MemberBeat(
            self.name, self.incarnation, datetime.now(UTC), self.keepalive, "bench", models
        )
        await asyncio.to_thread(self.records.beat, beat)

    async def name_check(self) -> None:
        await asyncio.to_thread(self.records.beat_of, self.name)

    async def read_desired(self, heard_at: float | None = None) -> None:
        """``read_all`` with what events named since the last read; a heartbeat at once when
        what this member serves changed (the daemon's writer beats when what it says
        changes: here once, since the recorder serves at once)."""
        named, self.named = frozenset(self.named), set()
        try:
            desired = await asyncio.to_thread(self.records.read_all, named)
        except BaseException:
            self.named.update(named)
            raise
        read_at = time.perf_counter()
        changed = False
        for model, record in desired.items():
            target = record.target_for(self.name)
            told = Told(target, heard_at, read_at)
            changed |= self.recorder.tell(model, target, record.generation, told)
        if changed and self.beat_on_change:
            await self.beat()

    async def scan_releases(self) -> None:
        await asyncio.to_thread(self.store.list_store)  # the watcher's full scan

    async def upkeep(self) -> None:
        if self.upkeep_records is not None:
            await forget_departed(self.upkeep_records, self.name, datetime.now(UTC))

    # --- event-driven -------------------------------------------------------------------

    async def follow_desired_events(self) -> None:
        while True:
            await self.desired_changed.wait()
            self.desired_changed.clear()
            await self.read_desired(self.heard_at)

    async def follow_release_events(self) -> None:
        assert self.events is not None
        while True:
            await self.released.wait()
            self.released.clear()
            changes = self.events.take()
            if changes.complete:
                for model in sorted(changes.models):
                    await asyncio.to_thread(self.store.list_releases, model)
            else:
                await self.scan_releases()
            self.events.handled(changes.models)

    async def start(self, tasks: list[asyncio.Task[None]]) -> None:
        """What a daemon does at start: its queue made and heard, the desired state read,
        a heartbeat, the whole store listed."""
        if self.events is not None:
            # Under the daemon's supervisor, as in the daemon: a job that raises is started
            # again after a backoff.
            jobs = Supervisor(SystemClock())
            jobs.add("store-events", self.events.run)
            tasks.append(asyncio.create_task(jobs.run()))
            while not self.events.health().up:  # noqa: ASYNC110 (no event to wait on)
                await asyncio.sleep(0.1)
            tasks.append(asyncio.create_task(self.follow_desired_events()))
            tasks.append(asyncio.create_task(self.follow_release_events()))
        for step in (self.read_desired, self.beat, self.scan_releases):
            await _patiently(step)


async def _patiently(step: Callable[[], Awaitable[None]]) -> None:
    """A start-up step tried again after a failure until it succeeds, as the daemon's loops
    go on (the worker's ``start_timeout`` bounds it): many members starting at once can keep
    moto's server from answering within the daemon's read timeout."""
    attempt = 0
    while True:
        try:
            await step()
            return
        except ControlPlaneError:
            attempt += 1
            await asyncio.sleep(min(10.0, 2.0 * attempt))


@dataclass
class Clients:
    """One boto3 client of each kind per worker process, shared by its members."""

    s3: Any
    upkeep: Any
    sqs: Any
    sns: Any

    def close(self) -> None:
        for client in (self.s3, self.upkeep, self.sqs, self.sns):
            client.close()


@dataclass
class Schedule:
    """The periodic actions of a worker's members: when each ran against when it was due."""

    t_ref: float
    running: asyncio.Event
    late: dict[str, list[float]] = field(default_factory=dict)  # action -> done - due
    due: dict[str, list[float]] = field(default_factory=dict)  # action -> when each run was due
    errors: Counter[str] = field(default_factory=Counter)

    async def every(
        self, action: str, period: float, phase: float, run: Callable[[], Awaitable[None]]
    ) -> None:
        k = 0
        while True:
            due = self.t_ref + phase + k * period
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if not self.running.is_set():
                await self.running.wait()
                k = max(k, math.ceil((time.perf_counter() - self.t_ref - phase) / period))
                continue  # what fell in the pause is skipped, not caught up
            try:
                await run()
            except Exception as exc:  # counted and reported; the schedule goes on
                self.errors[f"{action}: {type(exc).__name__}: {exc}"[:160]] += 1
            # How long after it was due it was done: waits for a thread or for moto show here.
            self.late.setdefault(action, []).append(time.perf_counter() - due)
            self.due.setdefault(action, []).append(due)
            k += 1


class _Logged(logging.Handler):
    """Warnings and errors the adapters log, counted by message template, each with the
    first message of its kind as it was logged."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: Counter[str] = Counter()
        self.example: dict[str, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        kind = f"{record.name}: {record.msg}"[:100]
        self.seen[kind] += 1
        if kind not in self.example:
            self.example[kind] = record.getMessage()[:300]


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """A worker process: its members, then commands from ``conn`` until ``stop``."""
    logged = _Logged()
    logging.getLogger().addHandler(logged)
    asyncio.run(_worker(spec, conn, logged))


async def _worker(spec: WorkerSpec, conn: Connection, logged: _Logged) -> None:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(spec.threads, thread_name_prefix="store"))
    pool = spec.threads + 8
    clients = Clients(
        # The daemon's S3 read timeout (build_client's), not the tests' longer one.
        s3=s3_client(spec.endpoint, max_pool_connections=pool, read_timeout=READ_TIMEOUT),
        upkeep=s3_client(spec.upkeep_endpoint, max_pool_connections=8, read_timeout=READ_TIMEOUT),
        sqs=sqs_client(spec.endpoint, max_pool_connections=len(spec.members) + pool),
        sns=sns_client(spec.endpoint),
    )
    members = [SimMember(m, spec, clients) for m in spec.members]
    tasks: list[asyncio.Task[None]] = []
    began = time.perf_counter()
    gate = asyncio.Semaphore(spec.starting)

    async def start(member: SimMember) -> None:
        async with gate:
            await member.start(tasks)

    starting = [asyncio.create_task(start(m)) for m in members]
    done, late = await asyncio.wait(starting, timeout=spec.start_timeout)
    failed = [
        f"{m.name}: {t.exception()!r}" if t in done else f"{m.name}: {_stuck(m)}"
        for m, t in zip(members, starting, strict=True)
        if t in late or t.exception() is not None
    ]
    conn.send(("ready", time.perf_counter() - began, failed))
    commands: asyncio.Queue[Any] = asyncio.Queue()
    threading.Thread(target=_read_commands, args=(conn, loop, commands), daemon=True).start()
    schedule = Schedule(0.0, asyncio.Event())
    try:
        while True:
            command, *args = await commands.get()
            if command == "stop":
                break
            try:
                answer = await _obey(command, args, members, spec, schedule, tasks, logged)
            except Exception as exc:  # the bench says what failed; the members go on
                answer = ("failed", f"{command}: {type(exc).__name__}: {exc}")
            conn.send(answer)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        clients.close()
        conn.send("stopped")


def _stuck(member: SimMember) -> str:
    if member.events is None:
        return "still starting"
    health = member.events.health()
    return f"still starting, its queue {health.state.value}: {health.problem}"


def _read_commands(
    conn: Connection, loop: asyncio.AbstractEventLoop, out: asyncio.Queue[Any]
) -> None:
    with contextlib.suppress(EOFError, OSError):
        while True:
            loop.call_soon_threadsafe(out.put_nowait, conn.recv())
    loop.call_soon_threadsafe(out.put_nowait, ("stop",))


async def _obey(
    command: str,
    args: list[Any],
    members: list[SimMember],
    spec: WorkerSpec,
    schedule: Schedule,
    tasks: list[asyncio.Task[None]],
    logged: _Logged,
) -> Any:
    fanout = spec.topic_arn is not None
    if command == "go":
        schedule.t_ref = args[0]
        schedule.running.set()
        periods = spec.cadences.periods(fanout)
        for member in members:
            member.beat_on_change = True
            member.since = spec.cadences.full_scan
            actions: dict[str, Callable[[], Awaitable[None]]] = {
                "beat": member.beat,
                "name check": member.name_check,
                "desired": member.read_desired,
                "releases": member.scan_releases,
            }
            if member.upkeep_records is not None:
                actions["upkeep"] = member.upkeep
            for action, run in actions.items():
                every = schedule.every(action, periods[action], member.spec.phases[action], run)
                tasks.append(asyncio.create_task(every))
        return "going"
    if command == "pause":
        schedule.running.clear()
        return "paused"
    if command == "resume":
        schedule.running.set()
        return "resumed"
    if command == "swap":
        return await _swap(members[0], *args)
    if command == "collect":
        return await _collect(members, *args)
    if command == "stats":  # begin, end: the runs due in that window, by action
        begin, end = args
        return {
            "late": schedule.late,
            "runs": {
                action: sum(1 for due in dues if begin <= due < end)
                for action, dues in schedule.due.items()
            },
            "errors": dict(schedule.errors),
            "logged": {logged.example[kind]: n for kind, n in logged.seen.items()},
        }
    raise ValueError(f"unknown command {command!r}")


async def _swap(writer: SimMember, model: str, release: str) -> tuple[float, float, int]:
    """A change of ``model``'s desired state to ``release`` through ``writer``, as an API
    call on that member makes it: read, then compare-and-swap. (start, end, generation)."""
    current = await in_daemon_thread(lambda: writer.records.read(model), name="swap")
    assert current is not None  # the bench seeded every model's record
    wanted = current.changed(
        by=writer.name,
        at=datetime.now(UTC),
        trigger="api",
        reason="bench: a change of the desired state, timed",
        release=release,
        previous=current.release,
    )
    began = time.perf_counter()
    # A thread of its own: the writer is one daemon, not behind its worker's other members.
    await in_daemon_thread(lambda: writer.records.swap(wanted), name="swap")
    return began, time.perf_counter(), wanted.generation


async def _collect(
    members: Iterable[SimMember], model: str, generation: int, deadline: float
) -> list[tuple[float | None, float] | None]:
    """(heard_at, read_at) of each member (perf_counter), None where it had not read
    ``generation`` of ``model`` by ``deadline``."""
    members = list(members)
    while time.perf_counter() < deadline:
        if all((model, generation) in m.recorder.told for m in members):
            break
        await asyncio.sleep(0.02)
    found = [m.recorder.told.get((model, generation)) for m in members]
    return [None if t is None else (t.heard_at, t.read_at) for t in found]
