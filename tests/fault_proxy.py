"""A small fault-injecting HTTP proxy on loopback, in front of the real S3 server.

Requests are forwarded unchanged (the Host header too, so SigV4 signatures stay valid) and every
request is recorded. Faults, each armed for a number of requests:
  * `slowdown`:  answer 503 SlowDown (S3's throttling reply) without forwarding;
  * `cut_body`:  forward a GET, send the headers and only the first `cut_fraction` of the body,
                 then drop the connection (a connection reset mid-shard);
  * `flip_put`:  forward a PUT with one byte of its body flipped (corruption in transit);
  * `on_get`:    a callback run before a GET is forwarded (e.g. replace the object meanwhile).
"""

from __future__ import annotations

import http.client
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b'<Message>Please reduce your request rate.</Message></Error>')


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
        self.faults = []  # what was injected, in order
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy._handle(self)

            do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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

    def _handle(self, handler):
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        with self.lock:
            self.requests.append((handler.command, handler.path, handler.headers.get("Range"),
                                  handler.headers.get("If-Match")))
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
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
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
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if handler.command != "HEAD":
            handler.wfile.write(data)

    def close(self):
        self.server.shutdown()
        self.server.server_close()
