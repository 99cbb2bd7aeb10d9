"""A seeded, fault-injecting HTTP proxy on loopback, for tests against an object store.

It sits between an S3 client (s3fs) and a local S3 server (moto) and does two jobs a test
needs and the server cannot give: it records every request with the bytes it answered (so a
test can count ranged reads), and on a chosen fraction of requests it breaks the exchange the
way real networks do: a connection reset, a 500 or 503 answer, or a body cut short after a
correct ``Content-Length``; and, asked for by name, a *torn* body (the right length, wrong
bytes: only a checksum notices) or a *stall* (no answer for ``stall_s`` seconds, then the
connection closes: a client read timeout). The fault draw is seeded and keyed by the request,
so a run is reproducible even with concurrent clients.

It can also shape the traffic as a distant object store would (``set_shaping``): a latency
before each answer and a bandwidth cap on each connection's bodies, so a benchmark on loopback
pays what a real network charges for each request and each byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULT_KINDS = ("reset", "500", "503", "short")
"""The faults ``set_faults`` draws from by default: any client retries them."""
EXTRA_FAULT_KINDS = ("torn", "stall")
"""Faults drawn only when named: a torn body passes every layer but a checksum, and a stall
costs the client its read timeout."""
ALL_FAULT_KINDS = FAULT_KINDS + EXTRA_FAULT_KINDS

# Headers that describe one hop of a connection; the proxy sets its own.
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "server",  # send_response writes its own Server and Date
    "date",
}

_CHUNK = 64 * 1024  # bytes written at a time under a bandwidth cap

_ERROR_BODY = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "SlowDown", "Please reduce your request rate."),
}


@dataclass(frozen=True)
class Request:
    """One request the proxy saw, and what it did with it."""

    method: str
    path: str
    range: str | None
    status: int | None
    body_bytes: int
    fault: str | None


class FaultProxy:
    """Forward HTTP/1.1 requests to ``upstream`` and record them; inject faults on demand.

    Use as a context manager or call ``start()``/``stop()``. ``endpoint_url`` is what a client
    points at. Faults are off until ``set_faults`` turns them on.
    """

    def __init__(self, upstream: str, *, host: str = "127.0.0.1", port: int = 0) -> None:
        scheme, _, hostport = upstream.partition("://")
        if scheme != "http" or not hostport:
            raise ValueError(f"FaultProxy forwards to a plain http:// upstream, got {upstream!r}")
        up_host, _, up_port = hostport.rstrip("/").partition(":")
        self.upstream = (up_host, int(up_port or 80))
        self._lock = threading.Lock()
        self._log: list[Request] = []
        self._rate = 0.0
        self._kinds: tuple[str, ...] = FAULT_KINDS
        self._methods: frozenset[str] | None = None
        self._path_contains = ""
        self._seed = 0
        self.stall_s = 2.0
        """How long a ``stall`` fault holds the request before closing the connection."""
        self.latency_s = 0.0
        """Seconds added before each answer (``set_shaping``)."""
        self.bandwidth_bytes_per_s: float | None = None
        """Each connection's body rate cap in bytes/s, None for none (``set_shaping``)."""
        self._attempts: dict[tuple[str, str, str | None], int] = {}
        self._clients: set[socket.socket] = set()
        self._server = _Server((host, port), _handler_for(self))
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close every client connection, so no handler thread lingers."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_faults(
        self,
        rate: float,
        *,
        seed: int = 0,
        kinds: Iterable[str] = FAULT_KINDS,
        methods: Iterable[str] | None = None,
        path_contains: str = "",
    ) -> None:
        """Fail ``rate`` of the requests (of ``methods``, all if None, whose path contains
        ``path_contains``) with one of ``kinds``."""
        kinds = tuple(kinds)
        unknown = set(kinds) - set(ALL_FAULT_KINDS)
        if unknown or not kinds:
            raise ValueError(
                f"fault kinds must be a non-empty subset of {ALL_FAULT_KINDS}: {kinds}"
            )
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], got {rate}")
        with self._lock:
            self._rate = rate
            self._kinds = kinds
            self._methods = None if methods is None else frozenset(m.upper() for m in methods)
            self._path_contains = path_contains
            self._seed = seed
            self._attempts.clear()

    def set_shaping(self, *, latency_s: float = 0.0, bandwidth: float | None = None) -> None:
        """Wait ``latency_s`` before each answer and send bodies at most ``bandwidth`` bytes/s
        per connection (None: as fast as they come). Called with no arguments: off."""
        if latency_s < 0 or (bandwidth is not None and bandwidth <= 0):
            raise ValueError(
                f"shaping needs latency >= 0 and bandwidth > 0: {latency_s}, {bandwidth}"
            )
        self.latency_s = float(latency_s)
        self.bandwidth_bytes_per_s = None if bandwidth is None else float(bandwidth)

    def clear(self) -> None:
        """Forget the recorded requests (faults stay as set)."""
        with self._lock:
            self._log.clear()

    @property
    def log(self) -> list[Request]:
        """A copy of every request recorded since the last ``clear``."""
        with self._lock:
            return list(self._log)

    def requests(self, method: str | None = None, *, path_contains: str = "") -> list[Request]:
        """The recorded requests with this method whose path contains ``path_contains``."""
        return [
            r
            for r in self.log
            if (method is None or r.method == method.upper()) and path_contains in r.path
        ]

    def body_bytes(self, method: str | None = None, *, path_contains: str = "") -> int:
        """Total body bytes answered to the matching requests."""
        return sum(r.body_bytes for r in self.requests(method, path_contains=path_contains))

    def _draw_fault(
        self, method: str, path: str, byte_range: str | None
    ) -> tuple[str, bytes] | None:
        """Whether (and how) to break this request.

        The draw hashes the seed, the request (method, path, range) and how many times the
        same request came before, so it does not depend on the order in which concurrent
        clients (threads, DataLoader workers) happen to arrive: a seeded run breaks the same
        attempts of the same reads every time. Returns the kind and the draw (a torn body is
        garbled from it, so each torn attempt differs).
        """
        with self._lock:
            if self._rate == 0.0 or (self._methods is not None and method not in self._methods):
                return None
            if self._path_contains not in path:
                return None
            request = (method, path, byte_range)
            attempt = self._attempts.get(request, 0)
            self._attempts[request] = attempt + 1
            seed = self._seed
        digest = hashlib.blake2b(repr((seed, *request, attempt)).encode(), digest_size=16)
        draw = digest.digest()
        if int.from_bytes(draw[:8], "big") / 2**64 >= self._rate:
            return None
        return self._kinds[draw[8] % len(self._kinds)], draw

    def _record(self, request: Request) -> None:
        with self._lock:
            self._log.append(request)

    def _track(self, sock: socket.socket, alive: bool) -> None:
        with self._lock:
            if alive:
                self._clients.add(sock)
            else:
                self._clients.discard(sock)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away (killed, timed out, reset) is normal here, not an error."""
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(_ProxyHandler):
        owner = proxy

    return Handler


class _ProxyHandler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"
    timeout = 30  # an idle keep-alive connection ends after this many seconds

    def setup(self) -> None:
        super().setup()
        self.owner._track(self.connection, True)
        self._upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self._upstream is not None:
                self._upstream.close()
            self.owner._track(self.connection, False)

    def log_message(self, format: str, *args: object) -> None:
        """Stay quiet: the request log is the record."""

    def _read_request_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if body or self.command in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        for attempt in (0, 1):
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(*self.owner.upstream, timeout=30)
            try:
                self._upstream.request(self.command, self.path, body=body, headers=headers)
                resp = self._upstream.getresponse()
                data = resp.read()
                return resp.status, resp.reason, resp.getheaders(), data
            except (ConnectionError, http.client.HTTPException):
                # A stale keep-alive connection to the server: reconnect once.
                self._upstream.close()
                self._upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _send_body(self, body: bytes) -> None:
        """Write ``body``, each chunk no sooner than the bandwidth cap allows since the first."""
        rate = self.owner.bandwidth_bytes_per_s
        if rate is None:
            self.wfile.write(body)
            return
        started, sent = time.monotonic(), 0
        for start in range(0, len(body), _CHUNK):
            chunk = body[start : start + _CHUNK]
            sent += len(chunk)
            time.sleep(max(0.0, started + sent / rate - time.monotonic()))
            self.wfile.write(chunk)

    def _reset(self) -> None:
        # SO_LINGER with a zero timeout makes close() send an RST instead of a FIN.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True

    def _handle(self) -> None:
        method = self.command
        body = self._read_request_body()
        rng = self.headers.get("Range")
        drawn = self.owner._draw_fault(method, self.path, rng)
        fault, draw = drawn if drawn is not None else (None, b"")
        if self.owner.latency_s:
            time.sleep(self.owner.latency_s)
        if fault == "stall":
            # Hold the request without a byte of answer, then close (FIN): the client's read
            # timeout fires first if it is shorter.
            self.owner._record(Request(method, self.path, rng, None, 0, fault))
            time.sleep(self.owner.stall_s)
            self.close_connection = True
            return
        if fault == "reset":
            self.owner._record(Request(method, self.path, rng, None, 0, fault))
            self._reset()
            return
        if fault in _ERROR_BODY:
            status, code, message = _ERROR_BODY[fault]
            payload = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message></Error>"
            ).encode()
            # Recorded before answering, so a client that has its answer sees it in the log.
            self.owner._record(Request(method, self.path, rng, status, len(payload), fault))
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self._send_body(payload)
            return
        status, reason, headers, data = self._forward(body)
        if fault in ("short", "torn") and len(data) < 2:
            fault = "reset"  # nothing to cut: break the exchange another way
            self.owner._record(Request(method, self.path, rng, None, 0, fault))
            self._reset()
            return
        if method == "HEAD":
            sent = b""
        elif fault == "short":
            sent = data[: len(data) // 2]
        elif fault == "torn":
            sent = _garble(data, draw)
        else:
            sent = data
        self.owner._record(Request(method, self.path, rng, status, len(sent), fault))
        self.send_response(status, reason)
        for name, value in headers:
            if name.lower() in _HOP_BY_HOP:
                continue
            if fault == "torn" and name.lower().startswith("x-amz-checksum-"):
                # moto sends the object's checksum even for a ranged GET, where S3 sends none,
                # and botocore would check it; a torn body carries none (only a checksum of
                # the reader's own can notice).
                continue
            self.send_header(name, value)
        if method == "HEAD":
            length = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
            self.send_header("Content-Length", length)
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._send_body(sent)
        if fault == "short":
            self.wfile.flush()
            self.close_connection = True

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _handle


def _garble(data: bytes, draw: bytes) -> bytes:
    """``data`` with every byte of its second half changed, by a mask derived from ``draw``:
    the same length, and different bytes for each draw (two torn reads of one range differ,
    as reads torn by whatever happens to be in flight do)."""
    half = len(data) // 2
    mask = bytes(b | 1 for b in hashlib.shake_256(draw).digest(len(data) - half))  # no zero
    tail = int.from_bytes(data[half:], "big") ^ int.from_bytes(mask, "big")
    return data[:half] + tail.to_bytes(len(data) - half, "big")
