"""Counting proxies in front of moto's server, in a process of their own, requests by kind.

Two of the fleet bench's :class:`~bench.fleet_store.CountingProxy` (the tests' fault proxy with
no fault scripted, noting when each request came): one for everything the members ask (S3,
SQS and SNS share moto's endpoint), one for the fleet's upkeep alone, so that its requests can
be counted per member that ran it when only some members do. In a process of their own so
that relaying a thousand members' long polls takes neither the members' CPU nor their GIL;
their CPU time is reported apart.

A request's kind is (API, what, method): for S3, what its key or listing prefix is about
(:func:`bench.fleet_store.s3_purpose`, with listings told apart: the models, one model's
releases, the whole store); for SQS, the action its ``X-Amz-Target`` names; SNS (query
protocol, the action in the body) is one kind.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from urllib.parse import parse_qs

from bench.fleet_store import PREFIX, CountingProxy, s3_purpose
from tests.support.fault_proxy import SeenRequest

Kind = tuple[str, str, str]  # API, what, method
PROBE_KEY = "_bench/probe"  # the bench's own object, for timing moto's answers: counted apart
ROLES = ("fleet", "upkeep")


def kind(seen: SeenRequest) -> Kind:
    if seen.path.endswith(f"/{PROBE_KEY}"):
        return "bench", "probe", seen.method
    if seen.target:
        return "SQS", "member queue", seen.target.rpartition(".")[2]
    if seen.method == "POST" and seen.path in ("", "/"):
        return "SNS", "topic", "POST"
    purpose, method = s3_purpose(seen)
    if method == "LIST" and purpose == "releases":
        query = parse_qs(seen.query)
        prefix = (query.get("prefix") or [""])[0]
        if prefix == f"{PREFIX}/":
            purpose = "models" if query.get("delimiter") else "whole store"
    elif purpose == "other":  # under _controlplane/ but neither desired/ nor members/
        purpose = seen.path.split("/_controlplane/", 1)[-1].split("/", 1)[0]
    elif purpose == "heartbeats" and method in ("PUT", "DELETE"):
        purpose = "heartbeat"
    return "S3", purpose, method


def _serve(upstream: str, conn: Connection) -> None:
    """The proxies' process: their endpoints, then counts on demand until ``stop``."""
    proxies = {role: CountingProxy(upstream) for role in ROLES}
    with contextlib.ExitStack() as stack:
        for proxy in proxies.values():
            stack.enter_context(proxy)
        conn.send({role: proxy.endpoint for role, proxy in proxies.items()})
        with contextlib.suppress(EOFError):
            while (command := conn.recv())[0] != "stop":
                _, begin, end = command
                conn.send(
                    {
                        role: Counter(
                            kind(seen) for at, seen in list(proxy.arrivals) if begin <= at < end
                        )
                        for role, proxy in proxies.items()
                    }
                )


@dataclass
class Counters:
    endpoints: dict[str, str]  # role -> endpoint
    pid: int
    _conn: Connection

    def counts(self, begin: float, end: float) -> dict[str, Counter[Kind]]:
        """Requests that arrived in ``[begin, end)`` (perf_counter), by role and kind."""
        self._conn.send(("counts", begin, end))
        found: dict[str, Counter[Kind]] = self._conn.recv()
        return found


@contextlib.contextmanager
def counting_proxies(upstream: str) -> Iterator[Counters]:
    """The two proxies in front of ``upstream``, in a child process, for as long as the block."""
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    process = context.Process(target=_serve, args=(upstream, theirs), name="store-counter")
    process.start()
    try:
        if not mine.poll(60):
            raise RuntimeError("the counting proxies did not start")
        assert process.pid is not None
        yield Counters(mine.recv(), process.pid, mine)
    finally:
        with contextlib.suppress(OSError):
            mine.send(("stop",))
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join()
        mine.close()
