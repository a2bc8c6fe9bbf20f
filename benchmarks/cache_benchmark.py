"""The node-local shard cache (issue 24): cold and warm epochs against local disk and uncached reads.

    python benchmarks/cache_benchmark.py [--out benchmark-output/cache] [--val-per-class 100] [--workers 2]
        [--latency-ms 2] [--mbps 100] [--prefetch 0] [--rounds 3]

Builds (once, reused if present) the sample dataset (10 classes, real photos) converted to `img`,
starts `weed mini` (testing_rigs/s3_server.py) and uploads it, and serves the same folder over http
(tests/http_range_server.py) behind benchmarks/latency_proxy.py (--latency-ms before every request,
--mbps for all bodies together), so that loopback does not hide the network. Then runs

    host_benchmark.py --compare OUT --formats img --split validation --compare-transport HTTP S3
        --cache-dir OUT/cache ...

whose cache rows (imagenet_shards/hostbench/cache_epochs.py) read two whole epochs per loader: local
files, each copy uncached, and each copy through a fresh cache (cold, then warm): seconds, images/s,
images per CPU-second, GETs and store bytes per epoch, and the cache's fills/hits. Writes
OUT/cache_benchmark.json and prints the table and the goals (warm >= 0.95x local per CPU-second; warm
store bytes 0; cold >= 0.9x uncached per CPU-second). Timings on a shared 2-core machine are noisy:
compare the ratios of one run.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from imagenet_shards import storage  # noqa: E402
from s3_benchmark import build_dataset  # noqa: E402
from testing_rigs.s3_server import SeaweedServer  # noqa: E402


def start(command) -> tuple:
    """(process, the port it prints on its first line)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    return process, int(process.stdout.readline().strip())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmark-output" / "cache")
    parser.add_argument("--val-per-class", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of every loader")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=2.0, help="added before every http request")
    parser.add_argument("--mbps", type=float, default=100.0, help="http bodies, MB/s in all")
    parser.add_argument("--prefetch", type=int, default=0, help="--cache-prefetch")
    parser.add_argument("--seconds", type=float, default=1.0, help="the other --compare rows, per row")
    parser.add_argument("--rounds", type=int, default=3, help="every row measured this many times, interleaved; "
                        "the median round (by images per CPU-second) is reported")
    args = parser.parse_args()
    load_before = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    local = build_dataset(args.out, args.val_per_class)
    server = SeaweedServer(args.out / f"seaweedfs-{os.getpid()}").start()
    processes = []
    try:
        http_server, http_port = start([sys.executable, str(REPO / "tests" / "http_range_server.py"), str(args.out)])
        processes.append(http_server)
        stats = args.out / "proxy-stats.json"
        proxy, proxy_port = start([sys.executable, str(REPO / "benchmarks" / "latency_proxy.py"), "--upstream",
                                   f"http://127.0.0.1:{http_port}", "--latency-ms", str(args.latency_ms), "--mbps",
                                   str(args.mbps), "--stats", str(stats)])
        processes.append(proxy)
        os.environ.update(server.env())
        storage.configure_s3(endpoint=server.endpoint)
        server.create_bucket("cachebench")
        from imagenet_shards.tools.upload import upload_dataset

        remote = "s3://cachebench/img"
        assert upload_dataset(local, remote, progress=False).ok
        from imagenet_shards.cli import host_benchmark

        report = args.out / "compare.json"
        code = host_benchmark.main([
            "--compare", str(args.out), "--formats", "img", "--split", "validation", "--batch-size",
            str(args.batch_size), "--dataloader-worker", str(args.workers), "--normalization-location", "device",
            "--seconds", str(args.seconds), "--rounds", str(args.rounds),
            "--compare-transport", f"http://127.0.0.1:{proxy_port}/img", remote,
            "--s3-endpoint", server.endpoint, "--cache-dir", str(args.out / "cache"), "--cache-prefetch",
            str(args.prefetch), "--json", str(report)])
        if code != 0:
            sys.exit(f"host_benchmark --compare failed (exit {code})")
    finally:
        for process in processes:
            process.terminate()
            process.wait()
        server.stop()
    compared = json.loads(report.read_text())
    rows = [r for r in compared["rows"] if r.get("kind") == "cache_epoch"]
    goals = [g for g in compared["goals"] if g["goal"].startswith("cache_")]
    result = {"dataset": str(local), "cpus": len(os.sched_getaffinity(0)), "load_before": load_before,
              "http": {"latency_ms": args.latency_ms, "mb_per_s": args.mbps}, "workers": args.workers,
              "batch_size": args.batch_size, "prefetch": args.prefetch, "rounds": args.rounds, "rows": rows,
              "goals": goals,
              "command": " ".join(sys.argv)}
    (args.out / "cache_benchmark.json").write_text(json.dumps(result, indent=1) + "\n")
    from imagenet_shards.hostbench.cache_epochs import format_cache_table
    from imagenet_shards.hostbench.report import format_goals

    print(f"\nShard cache: {local} validation split, {args.workers} workers, batch {args.batch_size}; http behind "
          f"{args.latency_ms:g} ms per request and {args.mbps:g} MB/s; s3: SeaweedFS on loopback")
    print(format_cache_table(rows, f"{local}, validation split"))
    print(format_goals(goals))
    print(f"wrote {args.out / 'cache_benchmark.json'}")


if __name__ == "__main__":
    main()
