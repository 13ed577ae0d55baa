"""A real S3 API on loopback for tests: the moto server, clients, publishers and a fault proxy.

- :func:`moto_server` runs moto's S3 over real HTTP on a free port for as long as its block;
- :func:`s3_client` builds a boto3 client for an endpoint with dummy credentials; close it;
- :func:`upload_release` and :func:`upload_release_dir` publish a release the way a publisher
  must: every file first, ``SHA256SUMS`` (the commit marker) last;
- :class:`FaultProxy` sits between a client and moto, counts requests and breaks the ones a
  test scripts (dropped connections, bodies cut short, 5xx answers), so retries are tested
  against real sockets instead of patched functions. Every fault is decided per request, in
  order, so tests never depend on timing.
"""

from __future__ import annotations

import functools
import hashlib
import http.client
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import boto3  # type: ignore[import-untyped]
import botocore.config  # type: ignore[import-untyped]
from moto.server import ThreadedMotoServer

MANIFEST = "SHA256SUMS"
REGION = "us-east-1"

FaultKind = Literal["drop", "drop_mid_body", "500", "503", "403"]


@contextmanager
def moto_server() -> Iterator[str]:
    """Run moto's S3 on 127.0.0.1 (a port the OS picks); yield its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        # stop() shuts the loop down but leaves the listening socket open.
        inner = getattr(server, "_server", None)
        if inner is not None:
            inner.server_close()


@functools.cache
def _session() -> Any:
    # One session for every test client: a new session loads the S3 model again (~0.25 s).
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
    )


def aws_env(endpoint: str) -> dict[str, str]:
    """The environment a process needs to reach ``endpoint`` through boto3's own chain."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": endpoint,
    }


def s3_client(endpoint: str, *, max_pool_connections: int = 16, read_timeout: float = 10.0) -> Any:
    """A boto3 S3 client for ``endpoint`` with dummy credentials and botocore retries off.

    Build clients from the test's thread only: the shared session is not thread-safe.
    """
    config = botocore.config.Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        max_pool_connections=max_pool_connections,
        connect_timeout=5,
        read_timeout=read_timeout,
    )
    return _session().client("s3", endpoint_url=endpoint, config=config)


def sha256sums(files: Mapping[str, bytes]) -> bytes:
    """``sha256sum`` text for ``files`` (coreutils format, sorted paths)."""
    lines = [f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in sorted(files.items())]
    return "".join(lines).encode()


def _key(prefix: str, model: str, release: str, rel: str) -> str:
    return "/".join(part for part in (prefix.strip("/"), model, release, rel) if part)


def upload_release(
    client: Any,
    bucket: str,
    prefix: str,
    model: str,
    release: str,
    files: Mapping[str, bytes],
    *,
    checksums: bool = True,
) -> dict[str, str]:
    """Upload ``files`` under ``<prefix>/<model>/<release>/``, then ``SHA256SUMS`` last.

    Returns the ETag of every uploaded key (by relative path).
    """
    etags = {}
    for rel, data in sorted(files.items()):
        answer = client.put_object(Bucket=bucket, Key=_key(prefix, model, release, rel), Body=data)
        etags[rel] = answer["ETag"]
    if checksums:
        key = _key(prefix, model, release, MANIFEST)
        etags[MANIFEST] = client.put_object(Bucket=bucket, Key=key, Body=sha256sums(files))["ETag"]
    return etags


def upload_release_dir(client: Any, bucket: str, prefix: str, release_dir: Path) -> None:
    """Upload a release built on disk (``write_scale_release``), ``SHA256SUMS`` last.

    The model and release names are the last two components of ``release_dir``.
    """
    model, release = release_dir.parent.name, release_dir.name
    files = sorted(p for p in release_dir.rglob("*") if p.is_file() and not p.is_symlink())
    manifest = release_dir / MANIFEST
    for path in [p for p in files if p != manifest] + [p for p in files if p == manifest]:
        rel = path.relative_to(release_dir).as_posix()
        client.put_object(
            Bucket=bucket, Key=_key(prefix, model, release, rel), Body=path.read_bytes()
        )


# --- the fault proxy ----------------------------------------------------------------------

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


@dataclass
class _Rule:
    kind: FaultKind
    key: str | None  # None: any request; else GETs whose path contains it
    remaining: int | None  # None: always


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
        seen = SeenRequest(self.command, path, "range" in self.headers, unquote(parts.query))
        fault = proxy._record(seen)
        if fault == "drop":
            self.close_connection = True
            return
        if fault in _ERRORS:
            self._discard_body()
            self._send_error_xml(*_ERRORS[fault], path)
            return
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=30)
        try:
            self._relay(upstream, cut_body=fault == "drop_mid_body")
        finally:
            upstream.close()

    def _relay(self, upstream: http.client.HTTPConnection, *, cut_body: bool) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = _Body(self.rfile, length) if length else None
        upstream.request(self.command, self.path, body=body, headers=headers)
        answer = upstream.getresponse()
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
        if cut_body:  # half the body (at least one byte when there is one), then hang up
            total = int(declared or 0)
            data = answer.read(max(1, total // 2)) if total else b""
            self.wfile.write(data)
            self.wfile.flush()
            self.close_connection = True
            return
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


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins every handler thread
    block_on_close = True

    def __init__(self, proxy: FaultProxy) -> None:
        self.proxy = proxy
        super().__init__(("127.0.0.1", 0), _Handler)


GetHook = Callable[[SeenRequest], None]


class FaultProxy:
    """An HTTP/1.1 proxy in front of an S3 endpoint that counts requests and injects faults.

    Scripted faults apply in the order they were added; ``fail_next(n, kind, key)`` breaks the
    next ``n`` matching requests, ``fail_always(kind, key)`` every one until :meth:`clear`.
    ``on_get(key, hook)`` runs ``hook`` once, before the first GET of a matching key is
    forwarded (to change the object under a download, say).
    """

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream {upstream!r} needs a host and a port")
        self.upstream_host: str = parts.hostname
        self.upstream_port: int = parts.port
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._hooks: list[tuple[str, GetHook]] = []
        self._seen: list[SeenRequest] = []
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

    def fail_next(self, n: int, kind: FaultKind, key: str | None = None) -> None:
        with self._lock:
            self._rules.append(_Rule(kind, key, n))

    def fail_always(self, kind: FaultKind, key: str | None = None) -> None:
        with self._lock:
            self._rules.append(_Rule(kind, key, None))

    def on_get(self, key: str, hook: GetHook) -> None:
        with self._lock:
            self._hooks.append((key, hook))

    def clear(self) -> None:
        """Drop every scripted fault and hook (the counts stay)."""
        with self._lock:
            self._rules.clear()
            self._hooks.clear()

    @property
    def requests(self) -> list[SeenRequest]:
        with self._lock:
            return list(self._seen)

    def gets(self, key: str, *, ranged: bool | None = None) -> int:
        """GETs whose path contains ``key``; ``ranged`` filters on a Range header."""
        return sum(
            1
            for seen in self.requests
            if seen.method == "GET" and key in seen.path and ranged in (None, seen.ranged)
        )

    def _record(self, seen: SeenRequest) -> FaultKind | None:
        """Count ``seen``, run its hook, and pick the fault it gets, if any."""
        hook: GetHook | None = None
        fault: FaultKind | None = None
        with self._lock:
            self._seen.append(seen)
            for rule in self._rules:
                if rule.key is not None and not (seen.method == "GET" and rule.key in seen.path):
                    continue
                if rule.remaining is not None:
                    if rule.remaining <= 0:
                        continue
                    rule.remaining -= 1
                fault = rule.kind
                break
            if seen.method == "GET" and fault is None:
                for index, (key, candidate) in enumerate(self._hooks):
                    if key in seen.path:
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
