"""The cost of releasing shard-map pages per payload (imagenet_shards/formats/mapped_shards.py, issue 35).

    python benchmarks/mapped_pages_benchmark.py DIR [DIR ...] [--rounds 5] [--epochs 2] [--json OUT]

DIR: converted datasets (img, tensor). One process, get_data with 0 workers (the reading, CRC32C,
decode and batching of a worker, in this process), the train split with its shuffle; per round,
in alternating order, for each DIR:
  keep      DATASETS_KEEP_SHARD_PAGES behaviour: every touched page stays (as before issue 35)
  release   the default: a payload's pages go once it is decoded, unless its map pays
Every epoch starts from fresh maps (a train split larger than the map limits: never found again
while kept, the case the release is for). Prints per-sample microseconds (median round), the paired
ratio release/keep (median of the rounds' ratios), and the RSS of shard maps after an epoch.
Timings on a shared host are noisy: compare the paired ratio of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import imagenet_shards.formats.mapped_shards as mapped_shards  # noqa: E402
from imagenet_shards.loader import get_data  # noqa: E402

MODES = ("keep", "release")


def shard_map_rss() -> int:
    """Bytes of this process's RSS in maps of shard files (*.tar), from /proc/self/smaps."""
    total, shard = 0, False
    with open("/proc/self/smaps") as handle:
        for line in handle:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                shard = len(fields) >= 6 and fields[-1].endswith(".tar")
            elif shard and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def one_round(loader, mode: str, epochs: int):
    """(microseconds a sample, shard-map RSS after the last epoch)."""
    mapped_shards.KEEP_PAGES = mode == "keep"
    samples, elapsed, rss = 0, 0.0, 0
    for _ in range(epochs):
        start = time.perf_counter()  # letting the last epoch's maps go is timed: the LRU does it while reading
        mapped_shards._SHARDS = mapped_shards.MappedShards()  # fresh maps: a split read once
        samples += sum(len(labels) for _, labels in loader)
        elapsed += time.perf_counter() - start
        rss = shard_map_rss()
    mapped_shards._SHARDS = mapped_shards.MappedShards()
    return elapsed / samples * 1e6, rss


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("datasets", nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--json", default="benchmark-output/mapped_pages_benchmark.json")
    args = parser.parse_args()
    rows = []
    for directory in args.datasets:
        loader = get_data(directory, "train", batch_size=64, workers=0)
        one_round(loader, "release", 1)  # warm-up: imports, the page cache
        figures = {mode: [] for mode in MODES}
        for number in range(args.rounds):
            for mode in (MODES if number % 2 == 0 else MODES[::-1]):
                figures[mode].append(one_round(loader, mode, args.epochs))
        ratios = [r[0] / k[0] for k, r in zip(figures["keep"], figures["release"])]
        rows.append({"dataset": directory, "rounds": args.rounds, "epochs": args.epochs,
                     **{f"{mode}_us_per_sample": statistics.median(f[0] for f in figures[mode]) for mode in MODES},
                     **{f"{mode}_shard_map_rss_mb": figures[mode][-1][1] / 2**20 for mode in MODES},
                     "release_over_keep": statistics.median(ratios), "ratios": ratios})
    print(f"{'dataset':40s} {'keep us':>9s} {'release us':>11s} {'ratio':>7s} {'keep RSS MB':>12s} {'release RSS MB':>15s}")
    for row in rows:
        print(f"{row['dataset'][-40:]:40s} {row['keep_us_per_sample']:9.1f} {row['release_us_per_sample']:11.1f} "
              f"{row['release_over_keep']:7.3f} {row['keep_shard_map_rss_mb']:12.1f} {row['release_shard_map_rss_mb']:15.1f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "pid": os.getpid()}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
