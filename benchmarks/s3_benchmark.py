"""The same converted dataset read locally, over http and over s3 (a real SeaweedFS on loopback), and uploaded.

    python benchmarks/s3_benchmark.py [--out benchmark-output/s3] [--val-per-class 50] [--seconds 2] [--rounds 3]

Builds (once, reused if present) the sample dataset (10 classes, real photos) converted to `img`,
starts `weed mini` (testing_rigs/s3_server.py) and a Range-honouring http file server
(tests/http_range_server.py, another process), and measures:

  upload        upload_dataset with 1 and 4 workers against a single-stream PUT of one 64 MB object
                (boto3 put_object with ChecksumSHA256, the same path): MB/s, the best of --rounds;
  transports    `host_benchmark.py --compare OUT --formats img --split validation --compare-transport
                HTTP S3` (imagenet_shards/hostbench/transports.py: the one implementation): the img device row
                over local files, http and s3 (images/s, images per CPU-second, MB/s, GETs per epoch,
                time to first byte p50/p99) and the transport ceilings (raw ranged GETs, no decode).

Writes OUT/s3_benchmark.json (OUT/compare.json: host_benchmark's report) and prints the tables and
the goals. The server runs on this machine: loopback hides network latency, and the server's own
CPU competes with the loader for the same cores. Timings on a shared machine are noisy: compare
the ratios of one run.
"""

import argparse
import base64
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from imagenet_shards import storage  # noqa: E402
from imagenet_shards.dataset_folder import METADATA_FILE  # noqa: E402
from testing_rigs.s3_server import SeaweedServer  # noqa: E402

def build_dataset(out: Path, val_per_class: int) -> Path:
    converted = out / "img"
    if (converted / METADATA_FILE).is_file():
        return converted
    from imagenet_shards.sample import build_sample_dataset

    build_sample_dataset(out / "source", classes=10, train_per_class=1, val_per_class=val_per_class, seed=0,
                         layouts=("folder",))
    result = subprocess.run([sys.executable, str(REPO / "create_webdataset.py"), "--source", str(out / "source"),
                             "--target", str(converted), "--format", "img", "--samples-per-shard", "64",
                             "--seed", "0", "--no-progress"], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(result.stdout + result.stderr)
    return converted


def upload_rows(server: SeaweedServer, local: Path, bucket: str, repeats):
    from imagenet_shards.tools.upload import upload_dataset

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


def floor_rows(bucket: str, local: Path, repeats) -> list:
    """What the server gives one stream, to hold the transport ceiling against: the 64 MB object of the
    PUT row read by imagenet_shards.storage (one ranged GET, no decode) and by curl on a presigned URL, and
    every validation shard by curl (one process, one connection). Best of `repeats`; MB/s over each
    transfer's own time (curl's start-up excluded); TTFB: curl's time_starttransfer."""
    from imagenet_shards.hostbench.transports import read_ceiling

    client = storage.s3_client().client
    size = client.head_object(Bucket=bucket, Key="single/0")["ContentLength"]
    shards = json.loads((local / METADATA_FILE).read_text())["splits"]["validation"]["shards"]
    remote_shards = [f"img/{s['name']}" for s in shards]
    best = {}

    def keep(name, figures):
        if name not in best or figures["mb_per_s"] > best[name]["mb_per_s"]:
            best[name] = {"row": name, **figures}

    for _ in range(repeats):
        figures = read_ceiling([f"s3://{bucket}/single/0"], [size])
        keep("GET 64 MB object: imagenet_shards.storage", {k: figures[k] for k in ("seconds", "mb_per_s", "ttfb_ms_p50")})
        if not shutil.which("curl"):
            continue
        for name, keys, sizes in (("GET 64 MB object: curl, presigned URL", ["single/0"], [size]),
                                  ("GET every shard: curl, presigned URLs", remote_shards, [s["bytes"] for s in shards])):
            command = ["curl", "--silent", "--show-error", "--fail"]
            for key in keys:
                url = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
                command += ["--output", "/dev/null", "--header", "Range: bytes=0-", "--write-out",
                            "%{time_starttransfer} %{time_total}\n", url]
            timed = [tuple(map(float, line.split())) for line in
                     subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()]
            seconds = sum(total for _, total in timed)
            keep(name, {"seconds": seconds, "mb_per_s": sum(sizes) / 1e6 / seconds,
                        "ttfb_ms_p50": statistics.median(first for first, _ in timed) * 1e3})
    return list(best.values())


def transport_rows(out: Path, http_base: str, remote: str, endpoint: str, args) -> dict:
    """host_benchmark --compare with the http and s3 copies: its JSON report."""
    from imagenet_shards.cli import host_benchmark

    report = out / "compare.json"
    code = host_benchmark.main(["--compare", str(out), "--formats", "img", "--split", "validation",
                                "--batch-size", "64", "--dataloader-worker", str(args.workers),
                                "--normalization-location", "device", "--seconds", str(args.seconds),
                                "--rounds", str(args.rounds), "--compare-transport", http_base, remote,
                                "--s3-endpoint", endpoint, "--json", str(report)])
    if code != 0:
        sys.exit(f"host_benchmark --compare failed (exit {code})")
    return json.loads(report.read_text())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmark-output" / "s3")
    parser.add_argument("--val-per-class", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="upload: best of; loader rows: median of")
    parser.add_argument("--seconds", type=float, default=2.0, help="measured per loader row and round")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers of the loader rows")
    args = parser.parse_args()
    load_before = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    local = build_dataset(args.out, args.val_per_class)
    server = SeaweedServer(args.out / f"seaweedfs-{os.getpid()}").start()
    http_server = subprocess.Popen([sys.executable, str(REPO / "tests" / "http_range_server.py"), str(local)],
                                   stdout=subprocess.PIPE, text=True)
    try:
        os.environ.update(server.env())
        storage.configure_s3(endpoint=server.endpoint)
        server.create_bucket("bench")
        remote = "s3://bench/img"
        uploads = upload_rows(server, local, "bench", args.rounds)
        from imagenet_shards.tools.upload import upload_dataset

        assert upload_dataset(local, remote, progress=False).ok
        http_base = f"http://127.0.0.1:{http_server.stdout.readline().strip()}/"
        compared = transport_rows(args.out, http_base, remote, server.endpoint, args)
        floors = floor_rows("bench", local, args.rounds)
    finally:
        http_server.terminate()
        http_server.wait()
        server.stop()
    ceiling = next(r for r in compared["rows"] if r["id"] == "transport_ceiling/img@s3")
    result = {"dataset": str(local), "cpus": len(os.sched_getaffinity(0)), "load_before": load_before,
              "note": "loopback hides network latency; the server shares the cores", "upload": uploads, "floor": floors,
              "transports": compared["rows"], "goals": compared["goals"]}
    (args.out / "s3_benchmark.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{'upload':<36}{'MB/s':>9}")
    for row in uploads:
        print(f"{row['row']:<36}{row['mb_per_s']:>9,.1f}")
    print(f"\n{'the server, one stream (floor)':<44}{'MB/s':>9}{'TTFB p50 ms':>13}")
    for row in floors + [{"row": "GET every shard: imagenet_shards.storage (ceiling)", **ceiling}]:
        print(f"{row['row']:<44}{row['mb_per_s']:>9,.1f}{row['ttfb_ms_p50']:>13.1f}")
    s3_goal = next(g for g in compared["goals"] if g["goal"] == "s3_vs_local@s3")
    print(f"s3 / local images per CPU-second: {s3_goal.get('ratio', float('nan')):.2f} (goal >= 0.9); "
          f"upload w4 / single-stream PUT: {uploads[2]['mb_per_s'] / uploads[0]['mb_per_s']:.2f} (goal >= 0.8); "
          f"transport ceiling {ceiling.get('mb_per_s', float('nan')):,.0f} MB/s (goal >= 500)")


if __name__ == "__main__":
    main()
