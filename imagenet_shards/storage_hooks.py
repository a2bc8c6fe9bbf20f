"""Who watches the remote requests imagenet_shards.storage makes: observers a caller installs (the host
benchmark's request log, imagenet_shards.hostbench.transports.RequestLog); none by default, so a plain
read pays one empty loop per request.

storage calls `record_request(kind)` as each request is sent (S3 operation names, e.g. "get_object";
"http_get", "http_head": a process killed while it waits for the answer has still made it),
`record_ttfb(seconds)` when a GET's response headers arrive, and `record_body_bytes(length)` with a
GET answer's Content-Length when known. Each observer is called as `observer(kind, value)`: (kind,
None), (TTFB_KIND, seconds), (BYTES_KIND, bytes). An installed observer is inherited by the DataLoader
workers forked after it: each process calls its own copy.
"""

from __future__ import annotations

GET_KINDS = ("get_object", "http_get")  # the requests that fetch bytes
TTFB_KIND = "ttfb"
BYTES_KIND = "bytes"
_observers = []


def install(observer) -> None:
    _observers.append(observer)


def uninstall(observer) -> None:
    if observer in _observers:
        _observers.remove(observer)


def record_request(kind: str) -> None:
    for observer in _observers:
        observer(kind, None)


def record_ttfb(seconds: float) -> None:
    for observer in _observers:
        observer(TTFB_KIND, seconds)


def record_body_bytes(length) -> None:
    if length is not None:
        for observer in _observers:
            observer(BYTES_KIND, int(length))
