"""A static file server on loopback that answers byte ranges, as static servers, CDNs and the
Hub's file endpoints do (``Range: bytes=a-b`` -> 206 with ``Content-Range``), or, with
``honour_range=False``, one that ignores ``Range`` and answers 200 with the whole file.

The standard library's ``SimpleHTTPRequestHandler`` serves files but no ranges, so the handler
adds them; everything else (paths, HEAD, 404s) is the standard library's.
"""

from __future__ import annotations

import os
import re
import threading
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class RangeRequestHandler(SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` plus single byte ranges (what fsspec's HTTP client asks)."""

    honour_range = True
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        wanted = RANGE.match(self.headers.get("Range", ""))
        path = self.translate_path(self.path)
        if not self.honour_range or wanted is None or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        first, last = wanted.groups()
        if first == "":  # the last N bytes
            start, stop = max(0, size - int(last)), size
        else:
            start, stop = int(first), min(size, int(last) + 1 if last else size)
        if start >= size or stop <= start:
            self.send_error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            return None
        body = open(path, "rb")  # noqa: SIM115 (the base class's copyfile reads and closes it)
        body.seek(start)
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self._remaining = stop - start
        return body

    def copyfile(self, source, outputfile) -> None:  # type: ignore[no-untyped-def]
        remaining = getattr(self, "_remaining", None)
        if remaining is None:
            return super().copyfile(source, outputfile)
        self._remaining = None
        outputfile.write(source.read(remaining))


class StaticServer:
    """``root`` served on 127.0.0.1 (a free port) from a thread; ``url`` is its base URL."""

    def __init__(self, root: str | os.PathLike, *, honour_range: bool = True) -> None:
        handler = type("Handler", (RangeRequestHandler,), {"honour_range": honour_range})
        self._server = ThreadingHTTPServer(
            ("127.0.0.1", 0), partial(handler, directory=str(Path(root)))
        )
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> StaticServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
