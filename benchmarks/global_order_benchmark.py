"""What the global train order (get_data's order="global") costs in bytes and gives in shuffle quality,
against today's order, on one converted dataset served over http (issue 36's closing figures).

    python benchmarks/global_order_benchmark.py DATASET [--instances 4] [--global-batch-size 32]
                                                        [--partitions P] [--json out.json]

Per order, the N instances of one epoch are read one after another in this process (instance=(i, N),
no workers, read_ahead=False, so one epoch's requests are counted), each from a local server that
honours byte ranges (tests/http_range_server.py) and counts the requests for train shards and the
bytes it sends for them; "global+cache" reads through a shard cache per instance (get_data's
cache_dir: whole-shard GETs). Per instance: shard requests, bytes read, bytes over the instance's
share (the split's record bytes / N: 1.00 is every byte read once in all) and over the record bytes
of the samples it delivered (whole shards through the cache also hold the samples the epoch's tail
drops, and tar padding). Then each order's ledgers are verified and
their distinct labels per rank batch and per global batch (every instance's batch of one step) put
against a perfect shuffle (imagenet_shards.ledger): on a dataset converted with --no-shuffle (class
order) the loader's order alone does the mixing. Both orders read with a rank batch of G/N; the global
order with GlobalOrder(global_batch_size=G), P its default (global_order.default_partitions) unless
--partitions is given, and printed.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from http_range_server import RangeHandler  # noqa: E402

from imagenet_shards.ledger import read_ledgers, verify  # noqa: E402
from imagenet_shards.loader import GlobalOrder, TrainCrop, get_data  # noqa: E402
from imagenet_shards.loader.global_order import default_partitions  # noqa: E402
from imagenet_shards.loader.sources import resolve_source  # noqa: E402


class CountingHandler(RangeHandler):
    """RangeHandler that also counts the requests for train shards (ranges or whole files, as the shard
    cache fetches them) and the bytes it sends for them."""

    shard_requests = 0
    bytes_served = 0

    def send_header(self, keyword, value):
        if keyword == "Content-Length" and self.path.rsplit("/", 1)[-1].startswith("train-"):
            type(self).shard_requests += 1
            type(self).bytes_served += int(value)
        super().send_header(keyword, value)


def record_bytes(dataset: Path, split: str) -> int:
    """The bytes of every sample record of the split (what reading each sample once reads)."""
    return int(resolve_source(str(dataset), split, use_repartition=False).columns.record_sizes.sum())


def record_sizes_by_key(dataset: Path, split: str) -> dict:
    columns = resolve_source(str(dataset), split, use_repartition=False).columns
    return {columns.key(row): int(size) for row, size in enumerate(columns.record_sizes.tolist())}


def read_epoch(base_url, instances, order, batch_size, ledgers: Path, name: str, cache: bool) -> list:
    rows = []
    for index in range(instances):
        before = CountingHandler.shard_requests, CountingHandler.bytes_served
        with tempfile.TemporaryDirectory() as cache_dir:  # each instance a node with its own cache
            loader = get_data(base_url, "train", batch_size, 0, normalization="device", instance=(index, instances),
                              transform=TrainCrop(image_size=64), order=order, read_ahead=False, seed=0, epoch=1,
                              cache=cache_dir if cache else None)
            samples = sum(len(labels) for _, labels in loader)
        loader.write_ledger(ledgers / f"{name}-{index}.json")
        rows.append({"order": name, "instance": index, "samples": samples,
                     "shard_requests": CountingHandler.shard_requests - before[0],
                     "bytes": CountingHandler.bytes_served - before[1]})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", type=Path, help="a converted dataset directory (its train split is read)")
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=32, help="G: every step's samples over all instances")
    parser.add_argument("--partitions", type=int, default=None,
                        help="the global order's P (default: its own, from the split's size and G)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not (args.dataset / "metadata.json").is_file():
        print(f"error: {args.dataset}: not a converted dataset (no metadata.json)", file=sys.stderr)
        return 2
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(CountingHandler, directory=str(args.dataset)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/"
    share = record_bytes(args.dataset, "train") / args.instances
    sizes = record_sizes_by_key(args.dataset, "train")
    if args.global_batch_size % args.instances:
        print(f"error: --global-batch-size {args.global_batch_size} is not a multiple of --instances "
              f"{args.instances}", file=sys.stderr)
        return 2
    batch_size = args.global_batch_size // args.instances
    partitions = args.partitions or default_partitions(len(sizes), args.global_batch_size)
    global_order = GlobalOrder(partitions=partitions, global_batch_size=args.global_batch_size)
    orders = {"shards": (None, False), "global": (global_order, False), "global+cache": (global_order, True)}
    rows, shuffle = [], {}
    with tempfile.TemporaryDirectory() as ledgers:
        for name, (order, cache) in orders.items():
            rows += read_epoch(base_url, args.instances, order, batch_size, Path(ledgers), name, cache)
            paths = [Path(ledgers) / f"{name}-{i}.json" for i in range(args.instances)]
            for row, path in zip(rows[-args.instances:], paths):  # the record bytes of what it delivered
                delivered = json.loads(path.read_text())["entries"][-1]["keys"]
                row["delivered_bytes"] = sum(sizes[key] for key in delivered)
            verdict = verify(read_ledgers(paths), str(args.dataset))
            shuffle[name] = {"ok": verdict.ok, "problems": verdict.problems, **verdict.shuffle}
    server.shutdown()
    print(f"{args.dataset}: train, {args.instances} instances, global batch {args.global_batch_size} (rank batch "
          f"{batch_size}), global order P = {partitions}; share = record bytes / N = {share:,.0f}")
    print(f"{'order':12} {'inst':>4} {'samples':>8} {'GETs':>7} {'bytes':>12} {'x share':>8} {'x delivered':>11}")
    for row in rows:
        row["over_share"] = round(row["bytes"] / share, 3)
        row["over_delivered"] = round(row["bytes"] / row["delivered_bytes"], 3)
        print(f"{row['order']:12} {row['instance']:>4} {row['samples']:>8} {row['shard_requests']:>7} "
              f"{row['bytes']:>12,} {row['over_share']:>8.3f} {row['over_delivered']:>11.3f}")
    for name, figures in shuffle.items():
        run, perfect = figures.get("run", {}), figures.get("perfect_shuffle", {})
        whole = figures.get("global", {})
        ratio = whole["run"]["mean"] / whole["perfect_shuffle"]["mean"] if whole else float("nan")
        print(f"{name}: ledger {'OK' if figures['ok'] else 'FAILED'}; distinct labels per rank batch mean "
              f"{run.get('mean')} vs a perfect shuffle's {perfect.get('mean')}; per global batch "
              f"{whole.get('run', {}).get('mean')} vs {whole.get('perfect_shuffle', {}).get('mean')} ({ratio:.3f}x)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "shuffle": shuffle, "share_bytes": share,
                                         "partitions": partitions, "global_batch_size": args.global_batch_size},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
