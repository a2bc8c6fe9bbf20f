"""An HTTP proxy on loopback that makes a local server look like one across a network: every request
waits `--latency-ms` before it is forwarded, and response bodies are streamed at no more than
`--mbps` megabytes per second in all (one token bucket shared by every connection, as one link is).
Requests go through unchanged (the Host header too: S3 signatures stay valid). It counts GETs and the
body bytes it sent, per path, and writes them to `--stats FILE` (JSON) on every request.

    python benchmarks/latency_proxy.py --upstream http://127.0.0.1:8000 --latency-ms 2 --mbps 200 --stats s.json
    (prints its port, serves until killed)

A separate process, so that its CPU is not counted in the loader's (it still shares the cores).
Like testing_rigs/fault_proxy.py, but streaming (a whole shard is never held) and with the network's costs.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

CHUNK = 64 << 10


class Link:
    """The shared bandwidth: `take(n)` sleeps until n more bytes may go out."""

    def __init__(self, bytes_per_s: float):
        self.rate = bytes_per_s
        self.lock = threading.Lock()
        self.free_at = time.monotonic()

    def take(self, count: int) -> None:
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            self.free_at = max(self.free_at, now) + count / self.rate
            wait = self.free_at - now
        if wait > 0:
            time.sleep(wait)


def make_proxy(upstream: str, latency_s: float, link: Link, stats_path: str | None):
    host, port = urlsplit(upstream).hostname, urlsplit(upstream).port
    stats = {"gets": 0, "requests": 0, "body_bytes": 0}
    lock = threading.Lock()

    def note(method: str, sent: int) -> None:
        with lock:
            stats["requests"] += 1
            stats["gets"] += method == "GET"
            stats["body_bytes"] += sent
            if stats_path:
                temporary = f"{stats_path}.{os.getpid()}"
                with open(temporary, "w") as handle:
                    json.dump(stats, handle)
                os.replace(temporary, stats_path)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if latency_s:
                time.sleep(latency_s)
            upstream_connection = http.client.HTTPConnection(host, port, timeout=120)
            try:
                upstream_connection.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                response = upstream_connection.getresponse()
                self.send_response(response.status, response.reason)
                for name, value in response.getheaders():
                    if name.lower() not in ("connection", "transfer-encoding"):
                        self.send_header(name, value)
                self.end_headers()
                sent = 0
                if self.command != "HEAD":
                    while chunk := response.read(CHUNK):
                        link.take(len(chunk))
                        self.wfile.write(chunk)
                        sent += len(chunk)
                note(self.command, sent)
            except OSError:  # the client went away mid-body (a reader that stopped early)
                self.close_connection = True
                with_socket = getattr(self, "connection", None)
                if with_socket is not None:
                    try:
                        with_socket.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            finally:
                upstream_connection.close()

        do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--mbps", type=float, default=0.0, help="MB/s for every connection together (0: no cap)")
    parser.add_argument("--stats", default=None)
    args = parser.parse_args()
    server = make_proxy(args.upstream, args.latency_ms / 1000, Link(args.mbps * 1e6), args.stats)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
