"""The same converted dataset read locally, over http and over s3 (a real SeaweedFS on loopback), and uploaded.

    python benchmarks/s3_benchmark.py [--out benchmark-output/s3] [--val-per-class 50] [--repeats 2]

Builds (once, reused if present) the sample dataset (10 classes, real photos) converted to `img`,
starts `weed mini` (tests/s3_server.py), and measures, each the best of --repeats epochs:

  loader rows   get_data(validation, batch 64, workers 0, device normalisation) over local files,
                http (a Range-honouring file server in another process) and s3: images/s, images per
                CPU-second of the loading process, shard MB/s, GETs per epoch, time to first byte
                p50/p99 (s3: from the request to the response headers);
  transport     raw ranged GETs of every shard (datasets.storage, 1 MiB reads, no decode): MB/s,
                beside reading the local files;
  upload        upload_dataset with 1 and 4 workers against a single-stream PUT of one 64 MB object
                (boto3 put_object with ChecksumSHA256, the same path): MB/s.

Writes OUT/s3_benchmark.json and prints a table. The server runs on this machine: loopback hides
network latency (TTFB here is ~ms; on a real network multiply GETs per epoch by the RTT), and the
server's own CPU competes with the loader for the same cores. Timings on a shared machine are
noisy: compare the ratios of one run.
"""

import argparse
import base64
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the test server (tests/s3_server.py): one way to start weed mini

from datasets import storage  # noqa: E402
from datasets.index import METADATA_FILE  # noqa: E402
from s3_server import SeaweedServer  # noqa: E402

RANGE_SERVER = r"""
import http.server, io, sys
from pathlib import Path

class Handler(http.server.SimpleHTTPRequestHandler):
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
        return io.BytesIO(data)

import functools
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=sys.argv[1]))
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def percentile(values, q):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def build_dataset(out: Path, val_per_class: int) -> Path:
    converted = out / "img"
    if (converted / METADATA_FILE).is_file():
        return converted
    from datasets.sample import build_sample_dataset

    build_sample_dataset(out / "source", classes=10, train_per_class=1, val_per_class=val_per_class, seed=0,
                         layouts=("folder",))
    result = subprocess.run([sys.executable, str(REPO / "create_webdataset.py"), "--source", str(out / "source"),
                             "--target", str(converted), "--format", "img", "--samples-per-shard", "64",
                             "--seed", "0", "--no-progress"], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(result.stdout + result.stderr)
    return converted


def shard_bytes(local: Path) -> int:
    metadata = json.loads((local / METADATA_FILE).read_text())
    return sum(s["bytes"] for s in metadata["splits"]["validation"]["shards"])


def loader_row(name, source, local, repeats, gets=None):
    from datasets.launcher import Instance
    from datasets.loader import get_data

    best = None
    for _ in range(repeats):
        storage.STATS.ttfb.clear()
        storage.STATS.requests.clear()
        before = gets() if gets else 0
        wall, cpu = time.perf_counter(), time.process_time()
        images = 0
        for batch, _ in get_data(source, "validation", 64, 0, normalization="device", instance=Instance(0, 1, "bench")):
            images += batch.shape[0]
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        row = {"row": name, "images": images, "seconds": wall, "images_per_s": images / wall,
               "images_per_cpu_s": images / cpu, "mb_per_s": shard_bytes(local) / 1e6 / wall,
               "gets_per_epoch": (gets() - before) if gets else storage.STATS.requests.get("get_object"),
               "ttfb_ms_p50": None, "ttfb_ms_p99": None}
        if storage.STATS.ttfb:
            row["ttfb_ms_p50"] = percentile(storage.STATS.ttfb, 50) * 1e3
            row["ttfb_ms_p99"] = percentile(storage.STATS.ttfb, 99) * 1e3
        if best is None or row["images_per_s"] > best["images_per_s"]:
            best = row
    return best


def transport_rows(local: Path, remote: str, repeats):
    metadata = json.loads((local / METADATA_FILE).read_text())
    names = [s["name"] for s in metadata["splits"]["validation"]["shards"]]
    total = sum(s["bytes"] for s in metadata["splits"]["validation"]["shards"])
    rows = []
    for label, open_shard in (("transport: local read", lambda n: open(local / n, "rb")),
                              ("transport: s3 ranged GET", lambda n: storage.open_byte_range(f"{remote}/{n}", 0, None))):
        best = None
        for _ in range(repeats):
            began = time.perf_counter()
            for name in names:
                with open_shard(name) as stream:
                    while stream.read(1 << 20):
                        pass
            seconds = time.perf_counter() - began
            best = seconds if best is None else min(best, seconds)
        rows.append({"row": label, "seconds": best, "mb_per_s": total / 1e6 / best})
    return rows


def upload_rows(server: SeaweedServer, local: Path, bucket: str, repeats):
    from datasets.upload import upload_dataset

    client = storage.s3_client().client
    blob = os.urandom(64 << 20)
    checksum = base64.b64encode(hashlib.sha256(blob).digest()).decode()
    single = None
    for n in range(repeats):
        began = time.perf_counter()
        client.put_object(Bucket=bucket, Key=f"single/{n}", Body=blob, ChecksumSHA256=checksum)
        seconds = time.perf_counter() - began
        single = seconds if single is None else min(single, seconds)
    rows = [{"row": "upload: single-stream PUT 64 MB", "seconds": single, "mb_per_s": len(blob) / 1e6 / single}]
    for workers in (1, 4):
        best = None
        for n in range(repeats):
            report = upload_dataset(local, f"s3://{bucket}/upload-w{workers}-{n}", workers=workers, progress=False)
            assert report.ok, report.failed
            best = report if best is None or report.seconds < best.seconds else best
        rows.append({"row": f"upload_dataset --workers {workers}", "seconds": best.seconds,
                     "mb_per_s": best.mb_per_second})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmark-output" / "s3")
    parser.add_argument("--val-per-class", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    local = build_dataset(args.out, args.val_per_class)
    server = SeaweedServer(args.out / f"seaweedfs-{os.getpid()}").start()
    http_server = subprocess.Popen([sys.executable, "-c", RANGE_SERVER, str(local)], stdout=subprocess.PIPE, text=True)
    try:
        os.environ.update(server.env())
        storage.configure_s3(endpoint=server.endpoint)
        server.create_bucket("bench")
        remote = "s3://bench/img"
        rows = upload_rows(server, local, "bench", args.repeats)
        from datasets.upload import upload_dataset

        assert upload_dataset(local, remote, progress=False).ok
        http_base = f"http://127.0.0.1:{http_server.stdout.readline().strip()}/"
        rows += [loader_row("loader: local", str(local), local, args.repeats),
                 loader_row("loader: http", http_base, local, args.repeats),
                 loader_row("loader: s3", remote, local, args.repeats)]
        rows += transport_rows(local, remote, args.repeats)
    finally:
        http_server.terminate()
        http_server.wait()
        server.stop()
    result = {"dataset": str(local), "validation_images": rows[3]["images"], "shard_mb": shard_bytes(local) / 1e6,
              "cpus": len(os.sched_getaffinity(0)), "note": "loopback hides network latency; the server shares "
              "the cores", "rows": rows}
    (args.out / "s3_benchmark.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['validation_images']} validation images, {result['shard_mb']:.1f} MB of shards; "
          f"SeaweedFS on loopback (hides network latency; it shares the {result['cpus']} cores)")
    print(f"{'row':<36}{'img/s':>9}{'img/CPU-s':>11}{'MB/s':>9}{'GETs':>6}{'TTFB p50':>10}{'p99 ms':>8}")
    for row in rows:
        def cell(key, width, fmt):
            value = row.get(key)
            return f"{'' if value is None else format(value, fmt):>{width}}"

        print(f"{row['row']:<36}{cell('images_per_s', 9, ',.0f')}{cell('images_per_cpu_s', 11, ',.0f')}"
              f"{cell('mb_per_s', 9, ',.1f')}{cell('gets_per_epoch', 6, 'd')}{cell('ttfb_ms_p50', 10, '.1f')}"
              f"{cell('ttfb_ms_p99', 8, '.1f')}")
    local_row, s3_row = rows[3], rows[5]
    print(f"s3 / local images per CPU-second: {s3_row['images_per_cpu_s'] / local_row['images_per_cpu_s']:.2f} "
          f"(goal >= 0.9); upload w4 / single-stream PUT: {rows[2]['mb_per_s'] / rows[0]['mb_per_s']:.2f} (goal >= 0.8); "
          f"transport ceiling {rows[-1]['mb_per_s']:,.0f} MB/s (goal >= 500)")


if __name__ == "__main__":
    main()
