"""After this member moves the desired state, it wakes the other live members over HTTP
(``POST <url>/v1/fleet/wake``, no body, no token), at the addresses their heartbeats give, in
the background: a member that cannot be reached is only followed at its poll.

Real HTTP on loopback: the members are small servers that record what they were sent.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from controlplane.adapters.fleet_peers import HttpPeers
from controlplane.adapters.persistence import SqliteRepos
from controlplane.domain.operations import Operation, OperationKind, OperationStatus, Trigger
from controlplane.domain.rollout import RolloutPolicy
from controlplane.services.fleet_ledger import FleetLedger, Member, Publication
from controlplane.services.runner import Run
from controlplane.services.tracker import OperationTracker
from devtools.launcher import free_port
from tests.support.fakes import FakeClock, FakeDesiredStates
from tests.support.polling import until
from tests.unit.test_fleet_ledger import beat


class Peer:
    """A member's API that records each request: (method, path, Authorization header)."""

    def __init__(self, status: int = 202, *, answer_after: float = 0.0) -> None:
        self.seen: list[tuple[str, str, str | None]] = []
        self.answered = threading.Event()
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                peer.seen.append(("POST", self.path, self.headers.get("Authorization")))
                peer.answered.wait(answer_after)  # a member too slow to answer: set to release
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @contextmanager
    def running(self) -> Iterator[Peer]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()
            thread.join(5)


async def publish_and_settle(
    tmp_path: Path, records: FakeDesiredStates, clock: FakeClock, me: Member
) -> None:
    """Publish r1 of model ``m`` as this member's deploy would, then wait for the wakes."""
    repos = SqliteRepos.open(tmp_path / "state.db")
    try:
        ledger = FleetLedger(
            records=records,
            member=me,
            clock=clock,
            rollout_for=lambda _model: RolloutPolicy(),
            peers=HttpPeers(),
        )
        operation = Operation(
            id="op-1",
            kind=OperationKind.DEPLOY,
            model="m",
            release="r1",
            trigger=Trigger.API,
            status=OperationStatus.RUNNING,
            created_at=clock.now(),
        )
        await ledger.publish(
            Run(OperationTracker(operation, repos.operations, clock)),
            Publication(base=None, release="r1"),
        )
        # The wakes run in tasks of their own: wait until this task is the loop's last one.
        await until(lambda: len(asyncio.all_tasks()) == 1, "the wakes ended", 10)
    finally:
        repos.close()


def test_the_live_members_that_say_where_are_woken_without_a_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock, records = FakeClock(), FakeDesiredStates()
    alive, dead, refusing, itself = Peer(), Peer(), Peer(status=404), Peer()
    slow = Peer(answer_after=30.0)
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    me = Member("a", "a-inc", "1.0", url=itself.url)
    with alive.running(), dead.running(), refusing.running(), itself.running(), slow.running():
        records.heartbeats.update(
            {
                "a": replace(beat("a", clock), url=me.url),  # this member itself
                "a-old": replace(beat("a-old", clock), url=me.url),  # its address, another name
                "s": replace(beat("s", clock), url=slow.url),
                "b": replace(beat("b", clock), url=alive.url),
                "c": replace(beat("c", clock), url=gone),
                "d": replace(beat("d", clock), url=refusing.url),
                "e": beat("e", clock),  # says nowhere: it follows at its poll
                "f": replace(beat("f", clock), url=dead.url, at=clock.now() - timedelta(hours=1)),
            }
        )
        with caplog.at_level(logging.WARNING):
            started = time.monotonic()
            asyncio.run(publish_and_settle(tmp_path, records, clock, me))
            took = time.monotonic() - started
        slow.answered.set()

    assert records.read("m") is not None
    assert alive.seen == [("POST", "/v1/fleet/wake", None)]
    assert refusing.seen == [("POST", "/v1/fleet/wake", None)]
    assert dead.seen == []
    assert itself.seen == []  # never its own address, under whatever name
    assert slow.seen == [("POST", "/v1/fleet/wake", None)]
    assert took < 10  # the slow one was given up on (1 s), not waited for
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"could not wake c at {gone}" in w and "next poll" in w for w in warnings), warnings
    assert any(refusing.url in w and "HTTP 404" in w for w in warnings), warnings
    assert any(slow.url in w and "no answer within 1 s" in w for w in warnings), warnings
    assert not any(alive.url in w for w in warnings), warnings
