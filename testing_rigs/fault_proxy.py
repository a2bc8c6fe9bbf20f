"""A small fault-injecting HTTP proxy on loopback, in front of the real S3 server.

Requests are forwarded unchanged (the Host header too, so SigV4 signatures stay valid) and every
request is recorded. Faults, each armed for a number of requests:
  * `slowdown`:  answer 503 SlowDown (S3's throttling reply) without forwarding;
  * `cut_body`:  forward a GET, send the headers and only the first `cut_fraction` of the body,
                 then drop the connection (a connection reset mid-shard);
  * `flip_put`:  forward a PUT with one byte of its body flipped (corruption in transit);
  * `on_get`:    a callback run before a GET is forwarded (e.g. replace the object meanwhile);
  * `stall`:     hold a GET `stall_seconds` before answering (`stall_mid_body`: after the headers and
                 half the body), longer than the client's read timeout: a store that stops answering;
  * `outage(seconds)` / `outage(requests=N)` / `restore()`: every request meanwhile (or the next N, whenever
    they come: a schedule that does not depend on how fast the client starts) has its connection dropped
                 (a store that is down), until the time is up or `restore()`.
The tests (tests/test_s3_faults.py, test_shard_cache.py) and benchmarks/soak.py use it.
"""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b'<Message>Please reduce your request rate.</Message></Error>')


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client that dropped its connection (it gave up on a stall, a killed job's worker) is not an
        error of the proxy: no traceback on stderr for it; anything else still prints one."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FaultProxy:
    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.lock = threading.Lock()
        self.requests = []  # (method, path, Range header, If-Match header)
        self.slowdown = 0
        self.cut_body = 0
        self.cut_fraction = 0.5
        self.cut_path = ""  # only GETs whose path contains this are cut
        self.flip_put = 0
        self.on_get = None
        self.stall = 0
        self.stall_seconds = 5.0
        self.stall_mid_body = False
        self.stall_path = ""  # only GETs whose path contains this are stalled
        self.down_until = 0.0  # time.monotonic() until which the store is down
        self.down_requests = 0  # the next requests dropped, counted
        self.closing = threading.Event()
        self.faults = []  # what was injected, in order
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy.handle(self)

            do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def gets(self, key_part: str = "") -> list:
        return [r for r in self.requests if r[0] == "GET" and key_part in r[1]]

    def _take(self, name: str) -> bool:
        with self.lock:
            if getattr(self, name) > 0:
                setattr(self, name, getattr(self, name) - 1)
                return True
        return False

    def outage(self, seconds: float = 0.0, requests: int = 0) -> None:
        """The store is down for `seconds` from now, or for its next `requests` requests: connections are
        dropped unanswered."""
        self.down_until = time.monotonic() + seconds
        self.down_requests = requests

    def restore(self) -> None:
        self.down_until, self.down_requests = 0.0, 0

    def _down(self) -> bool:
        """Whether this request meets the outage (one of the counted requests is used up)."""
        if self.down_requests > 0:
            self.down_requests -= 1
            return True
        return time.monotonic() < self.down_until

    def _wait(self, seconds: float) -> None:
        self.closing.wait(seconds)  # close() ends a stall at once

    @staticmethod
    def _drop(handler) -> None:
        handler.close_connection = True
        try:
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def handle(self, handler):
        try:
            self._answer(handler)
        except OSError:  # the client gave up first (a stall past its read timeout): nothing to tell it
            self._drop(handler)

    def _answer(self, handler):
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self.lock:
            self.requests.append((handler.command, handler.path, handler.headers.get("Range"),
                                  handler.headers.get("If-Match")))
        with self.lock:
            down = self._down()
        if down:
            self.faults.append(("outage", handler.path))
            self._drop(handler)
            return
        stall = handler.command == "GET" and self.stall_path in handler.path and self._take("stall")
        if stall and not self.stall_mid_body:
            self.faults.append(("stall", handler.path))
            self._wait(self.stall_seconds)
        if self._take("slowdown"):
            self.faults.append(("slowdown", handler.path))
            handler.send_response(503)
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(SLOWDOWN)))
            handler.end_headers()
            handler.wfile.write(SLOWDOWN)
            return
        if handler.command == "PUT" and body and self._take("flip_put"):
            self.faults.append(("flip_put", handler.path))
            body = bytearray(body)
            body[len(body) // 2] ^= 0x01
            body = bytes(body)
        if handler.command == "GET" and self.on_get is not None:
            self.on_get(handler.path)
        upstream = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            upstream.request(handler.command, handler.path, body=body or None, headers=dict(handler.headers.items()))
            response = upstream.getresponse()
            data = response.read()
        except OSError:
            self._drop(handler)
            return
        finally:
            upstream.close()
        cut = handler.command == "GET" and response.status in (200, 206) and len(data) > 1024 \
            and self.cut_path in handler.path and self._take("cut_body")
        handler.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in ("transfer-encoding", "connection"):
                handler.send_header(name, value)
        handler.end_headers()
        if cut:
            self.faults.append(("cut_body", handler.path))
            handler.wfile.write(data[:int(len(data) * self.cut_fraction)])
            handler.wfile.flush()
            self._drop(handler)
            return
        if stall and self.stall_mid_body and handler.command == "GET":
            self.faults.append(("stall_mid_body", handler.path))
            handler.wfile.write(data[:len(data) // 2])
            handler.wfile.flush()
            self._wait(self.stall_seconds)
            self._drop(handler)
            return
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def close(self):
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()
