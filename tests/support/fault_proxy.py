"""A fault-injecting HTTP/1.1 proxy for tests, in front of an S3 endpoint (moto's server).

:class:`FaultProxy` sits between a client (a test's boto3 client, or the daemon's, through
``AWS_ENDPOINT_URL_S3``) and moto on real loopback sockets, counts requests and breaks the
ones a test scripts: dropped connections (before the request reaches moto, or after moto
answered it), bodies cut short, 5xx answers, a byte flipped in a body, added latency, the whole
endpoint down for a while. So retries are tested against real
sockets instead of patched functions. Scripted faults are decided per request, in order, so
tests never depend on timing; only latency and an outage are about time, by design.
"""

from __future__ import annotations

import http.client
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

# drop: close without an answer (moto never sees the request); lose_answer: forward it (it
# takes effect), then close without moto's answer, as a timeout after the server acted looks to
# a client; drop_mid_body: half the body, then hang up; cut_after_headers: moto's status and
# headers, then hang up before the first byte of the body; 500, 503 (SlowDown), 403: that answer
# instead of moto's; flip: moto's answer with one byte of its body changed (a random byte at a
# random offset, so two flips differ).
FaultKind = Literal[
    "drop", "lose_answer", "drop_mid_body", "cut_after_headers", "500", "503", "403", "flip"
]

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
}
_ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
    "403": (403, "AccessDenied", "Access Denied"),
}
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class SeenRequest:
    method: str
    path: str  # unquoted, without the query string: /<bucket>/<key>
    ranged: bool
    query: str = ""  # unquoted query string (ListObjectsV2 carries its prefix here)
    range: str = ""  # the Range header ("bytes=0-131071"), empty without one
    target: str = ""  # X-Amz-Target: the action of a JSON-protocol call (SQS), else empty


@dataclass
class _Rule:
    kind: FaultKind
    key: str | None  # None: any request; else requests of `method` whose path contains it
    remaining: int | None  # None: always
    ranged: bool | None = None  # None: any; else only GETs with (True) or without a Range
    method: str | None = None  # None: GET when a key is given, any method when not
    byte_range: str | None = None  # None: any; else only requests with this Range header
    skip: int = 0  # matching requests let through before the rule applies
    rate: float | None = None  # None: every matching request; else this fraction, at random

    def matches(self, seen: SeenRequest) -> bool:
        method = self.method or ("GET" if self.key is not None else None)
        if method is not None and seen.method != method:
            return False
        if self.key is not None and self.key not in seen.path:
            return False
        if self.byte_range is not None and seen.range != self.byte_range:
            return False
        return self.ranged is None or (seen.method == "GET" and seen.ranged == self.ranged)


class _Body:
    """The request body as a file for http.client: exactly Content-Length bytes."""

    def __init__(self, stream: Any, length: int) -> None:
        self._stream = stream
        self._left = length

    def read(self, size: int = -1) -> bytes:
        size = self._left if size < 0 else min(size, self._left)
        data: bytes = self._stream.read(size) if size else b""
        self._left -= len(data)
        return data


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as boto3 expects
    disable_nagle_algorithm = True  # headers and body go out as separate small writes
    server: _ProxyServer
    timeout = 30  # an idle client cannot hold a thread forever

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def _forward(self) -> None:
        proxy = self.server.proxy
        parts = urlsplit(self.path)
        path = unquote(parts.path)
        seen = SeenRequest(
            self.command,
            path,
            "range" in self.headers,
            unquote(parts.query),
            self.headers.get("range", ""),
            self.headers.get("x-amz-target", ""),
        )
        fault = proxy._record(seen)
        if proxy.latency:
            time.sleep(proxy.latency)
        if proxy._silent.is_set():  # a partition that drops packets: no answer, no close
            proxy._answering.wait(timeout=300)
            self.close_connection = True
            return
        if fault == "drop" or proxy.is_down:
            self.close_connection = True
            return
        if fault in _ERRORS:
            self._discard_body()
            self._send_error_xml(*_ERRORS[fault], path)
            return
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=30)
        try:
            self._relay(
                upstream,
                cut_body=fault == "drop_mid_body",
                cut_headers=fault == "cut_after_headers",
                flip=fault == "flip",
                lose_answer=fault == "lose_answer",
            )
        finally:
            upstream.close()

    def _relay(
        self,
        upstream: http.client.HTTPConnection,
        *,
        cut_body: bool,
        flip: bool,
        lose_answer: bool = False,
        cut_headers: bool = False,
    ) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = _Body(self.rfile, length) if length else None
        upstream.request(self.command, self.path, body=body, headers=headers)
        answer = upstream.getresponse()
        if lose_answer:  # moto acted on it; the client never hears so
            answer.read()
            self.close_connection = True
            return
        out_headers = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP_BY_HOP]
        declared = answer.getheader("Content-Length")
        has_body = self.command != "HEAD" and answer.status not in (204, 304)
        if declared is None and has_body:  # not expected from moto; buffer to frame it
            data = answer.read()
            out_headers.append(("Content-Length", str(len(data))))
            chunks: Iterator[bytes] = iter([data])
        else:
            chunks = iter(lambda: answer.read(_CHUNK), b"") if has_body else iter([])
        self.send_response_only(answer.status, answer.reason)
        for name, value in out_headers:
            self.send_header(name, value)
        self.end_headers()
        if cut_headers:  # what a connection cut between the headers and the body looks like
            self.wfile.flush()
            self.close_connection = True
            return
        if cut_body:  # half the body (at least one byte when there is one), then hang up
            total = int(declared or 0)
            data = answer.read(max(1, total // 2)) if total else b""
            self.wfile.write(data)
            self.wfile.flush()
            self.close_connection = True
            return
        if flip and has_body and declared:
            chunks = _flip_one_byte(chunks, int(declared))
        for chunk in chunks:
            self.wfile.write(chunk)
        self.wfile.flush()

    def _discard_body(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = _Body(self.rfile, length)
        while body.read(_CHUNK):
            pass

    def _send_error_xml(self, status: int, code: str, message: str, resource: str) -> None:
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{resource}</Resource><RequestId>fault-proxy</RequestId></Error>"
        ).encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(xml)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(xml)
        self.wfile.flush()


def _flip_one_byte(chunks: Iterator[bytes], total: int) -> Iterator[bytes]:
    """``chunks`` with the byte at a random offset XOR-ed with a random non-zero mask."""
    target = random.randrange(total)
    mask = random.randrange(1, 256)
    position = 0
    for chunk in chunks:
        if position <= target < position + len(chunk):
            changed = bytearray(chunk)
            changed[target - position] ^= mask
            chunk = bytes(changed)
        position += len(chunk)
        yield chunk


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    block_on_close = True
    request_queue_size = 128  # socketserver's 5 drops connections a burst of clients opens

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(("127.0.0.1", 0), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A connection this proxy cut (go_down, a client that gave up) is not news.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


RequestHook = Callable[[SeenRequest], None]


class FaultProxy:
    """An HTTP/1.1 proxy in front of an S3 endpoint that counts requests and injects faults.

    Scripted faults apply in the order they were added; ``fail_next(n, kind, key)`` breaks the
    next ``n`` matching requests (after ``skip`` of them), ``fail_always(kind, key)`` every one
    until :meth:`clear`, ``fail_randomly(rate, kind, key)`` that fraction of them, drawn from
    a seeded generator; a key matches GETs unless ``method`` says another; ``ranged`` narrows
    each to GETs with (or without) a Range header, ``byte_range`` to one Range header.
    ``on_get(key, hook)`` runs ``hook`` once, before the first GET of a matching key is
    forwarded (after ``skip`` such GETs; to change the object under a download, say);
    ``on_put`` the same before a PUT (to land another writer's object between a read and a
    conditional write, say). ``latency`` delays every request; :meth:`go_down` drops every
    connection, open or new, until :meth:`come_back` (:meth:`down_for` schedules that);
    :meth:`go_silent` answers nothing and closes nothing until then.
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream {upstream!r} needs a host and a port")
        self.upstream_host: str = parts.hostname
        self.upstream_port: int = parts.port
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._random = random.Random(0)  # fail_randomly's draws; reseeded by each call
        self._hooks: list[tuple[str, str, RequestHook, int]] = []  # method, key, hook, skip
        self._seen: list[SeenRequest] = []
        self.latency = 0.0  # seconds added before every request is answered
        self._down = threading.Event()
        self._silent = threading.Event()  # requests are read and never answered
        self._answering = threading.Event()  # set: silent requests may end (come_back, stop)
        self._timers: list[threading.Timer] = []
        self._connections: set[socket.socket] = set()
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._server = _ProxyServer(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.01},  # so stop() does not wait half a second
            name="fault-proxy",
            daemon=True,
        )
        self._thread.start()
        return self

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self._answering.set()  # silent requests end
        for timer in self._timers:
            timer.cancel()
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()  # serve_forever returns
        with self._lock:  # wake handlers blocked on idle keep-alive connections
            for conn in self._connections:
                with suppress(OSError):  # already closed by its client
                    conn.shutdown(socket.SHUT_RDWR)
        server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # --- scripting and counting -----------------------------------------------------------

    def fail_next(
        self,
        n: int,
        kind: FaultKind,
        key: str | None = None,
        *,
        ranged: bool | None = None,
        method: str | None = None,
        byte_range: str | None = None,
        skip: int = 0,
    ) -> None:
        with self._lock:
            self._rules.append(_Rule(kind, key, n, ranged, method, byte_range, skip))

    def fail_randomly(
        self,
        rate: float,
        kind: FaultKind,
        key: str | None = None,
        *,
        ranged: bool | None = None,
        method: str | None = None,
        seed: int = 0,
    ) -> None:
        """Break each matching request with probability ``rate``, until :meth:`clear`."""
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate {rate} is not a fraction")
        with self._lock:
            self._random.seed(seed)
            self._rules.append(_Rule(kind, key, None, ranged, method, rate=rate))

    def fail_always(
        self,
        kind: FaultKind,
        key: str | None = None,
        *,
        ranged: bool | None = None,
        method: str | None = None,
        byte_range: str | None = None,
    ) -> None:
        with self._lock:
            self._rules.append(_Rule(kind, key, None, ranged, method, byte_range))

    def on_get(self, key: str, hook: RequestHook, *, skip: int = 0) -> None:
        with self._lock:
            self._hooks.append(("GET", key, hook, skip))

    def on_put(self, key: str, hook: RequestHook, *, skip: int = 0) -> None:
        with self._lock:
            self._hooks.append(("PUT", key, hook, skip))

    @property
    def is_down(self) -> bool:
        return self._down.is_set()

    def go_down(self) -> None:
        """Drop every open connection, and every new request, until :meth:`come_back`."""
        self._down.set()
        with self._lock:
            for conn in self._connections:
                with suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def go_silent(self) -> None:
        """Take every new request and never answer it (nor close it) until :meth:`come_back`:
        a partition that drops packets, which a client notices only by its own timeouts."""
        self._answering.clear()
        self._silent.set()

    def come_back(self) -> None:
        self._down.clear()
        self._silent.clear()
        self._answering.set()

    def down_for(self, seconds: float) -> None:
        """:meth:`go_down` now and :meth:`come_back` after ``seconds`` (cancelled by stop)."""
        self.go_down()
        timer = threading.Timer(seconds, self.come_back)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def clear(self) -> None:
        """Drop every scripted fault and hook (the counts stay)."""
        with self._lock:
            self._rules.clear()
            self._hooks.clear()

    @property
    def requests(self) -> list[SeenRequest]:
        with self._lock:
            return list(self._seen)

    def puts(self, key: str) -> int:
        """PUTs whose path contains ``key``."""
        return sum(1 for seen in self.requests if seen.method == "PUT" and key in seen.path)

    def gets(self, key: str, *, ranged: bool | None = None) -> int:
        """GETs whose path contains ``key``; ``ranged`` filters on a Range header."""
        return sum(
            1
            for seen in self.requests
            if seen.method == "GET" and key in seen.path and ranged in (None, seen.ranged)
        )

    def _record(self, seen: SeenRequest) -> FaultKind | None:
        """Count ``seen``, run its hook, and pick the fault it gets, if any."""
        hook: RequestHook | None = None
        fault: FaultKind | None = None
        with self._lock:
            self._seen.append(seen)
            for rule in self._rules:
                if not rule.matches(seen):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                if rule.rate is not None and self._random.random() >= rule.rate:
                    continue
                if rule.remaining is not None:
                    if rule.remaining <= 0:
                        continue
                    rule.remaining -= 1
                fault = rule.kind
                break
            if fault is None and not self._down.is_set():
                for index, (method, key, candidate, skip) in enumerate(self._hooks):
                    if method != seen.method or key not in seen.path:
                        continue
                    if skip > 0:
                        self._hooks[index] = (method, key, candidate, skip - 1)
                    else:
                        hook = candidate
                        del self._hooks[index]
                    break
        if hook is not None:
            hook(seen)
        return fault

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
