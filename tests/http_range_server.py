"""A file server that honours single byte ranges (206 + Content-Range), as nginx, S3 and most CDNs do
(`python -m http.server` ignores Range and answers 200). For the tests and benchmarks/s3_benchmark.py.

In a thread:       server, base_url = serve(directory)   ...   server.shutdown(); server.server_close()
As a process:      python tests/http_range_server.py DIRECTORY   (prints its port, serves until killed)
"""

from __future__ import annotations

import functools
import http.server
import io
import sys
import threading
from pathlib import Path


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files; a `Range: bytes=a-b` request gets those bytes with 206. Counts ranges served."""

    ranges_served = 0

    def log_message(self, *args):
        pass

    def send_head(self):
        header = self.headers.get("Range")
        path = Path(self.translate_path(self.path))
        if not header or not path.is_file():
            return super().send_head()
        start, _, stop = header.removeprefix("bytes=").partition("-")
        size = path.stat().st_size
        start, stop = int(start), min(int(stop) + 1 if stop else size, size)
        with open(path, "rb") as handle:
            handle.seek(start)
            data = handle.read(stop - start)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{size}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        type(self).ranges_served += 1
        return io.BytesIO(data)


def make_server(directory) -> http.server.ThreadingHTTPServer:
    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeHandler, directory=str(directory)))


def serve(directory) -> tuple:
    """(server, "http://127.0.0.1:PORT/") serving `directory` from a daemon thread of this process."""
    server = make_server(directory)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


if __name__ == "__main__":
    server = make_server(sys.argv[1])
    print(server.server_address[1], flush=True)
    server.serve_forever()
