#!/usr/bin/env python3
"""What stands between the JPEG loader and its floor, measured in one run (issue 23).

    python benchmarks/loader_floor.py DIR [--split validation] [--seconds 6] [--rounds 3] [--json OUT]

DIR as for `host_benchmark.py --compare` (DIR/source the image folder, DIR/img its img conversion).
Rows, interleaved over --rounds, images per CPU-second of every process involved, median round,
and the median over rounds of each row's ratio to floor x1 measured in the same round:

  floor x1        the floor row of --compare: ImagePipeline.image_into of the folder's bytes held in
                  memory, into one reused uint8 batch, one process
  floor x2        two floor processes at once (each one's rate): what running two decoding
                  processes side by side costs on this host, loader or not
  floor ring      floor x1 writing its batches into 10 buffers in turn, as many as the 2-worker
                  loader's ring holds: the floor without its one reused batch staying in cache
  floor w2        the floor loop itself in each of 2 DataLoader workers, handing the main process
                  a 64-image marker per batch (no pixels): what the 2-worker process layout costs
                  the decode with none of the loader's work (the fair floor of "loader w2")
  loader w0       get_data on DIR/img with 0 workers: the loader's per-sample reading, index,
                  CRC32C and batching in the same process as the decode
  loader w2       the same with 2 workers: + the main process and the IPC between them
  own w0, own w2  the loader rows with `image_into` skipped (a no-op): the loader's own CPU per
                  image (reading, index, CRC32C, batching, IPC), printed in microseconds with the
                  ratio it leaves possible, floor / (floor + own), before any side-by-side cost

Prints a table and writes the figures as JSON. Timings on a shared host are noisy: compare the
ratios of one run.
"""

import argparse
import contextlib
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imagenet_shards.hostbench.pipelines import floor_batches, loader_batches  # noqa: E402
from imagenet_shards.hostbench.discovery import folder_split_dir, list_folder_images  # noqa: E402
from imagenet_shards.hostbench.timing import measure_batches  # noqa: E402
from imagenet_shards.launcher import Instance  # noqa: E402
from imagenet_shards.loader.transform.pipeline import ImagePipeline  # noqa: E402

BATCH = 64
RING_BUFFERS_W2 = 2 * (2 + 3)  # the loader's ring with 2 workers: (prefetch 2 + 3) batches each


@contextlib.contextmanager
def _image_into_skipped():
    """ImagePipeline.image_into a no-op (the slot keeps what it held), in this process and the
    workers it forks meanwhile."""
    kept = ImagePipeline.image_into
    ImagePipeline.image_into = lambda self, payload, slot, rng, bbox=None: None
    try:
        yield
    finally:
        ImagePipeline.image_into = kept


class _FloorInWorkers(torch.utils.data.IterableDataset):
    """Each DataLoader worker runs floor_batches; per batch it yields an empty (64, 0) tensor
    (measure_batches counts its length) and the labels: no pixels cross to the main process."""

    def __init__(self, items, split):
        self.items, self.split = items, split

    def __iter__(self):
        torch.set_num_threads(1)
        for images, labels in floor_batches(self.items, self.split, BATCH):
            yield torch.empty((len(images), 0), dtype=torch.uint8), labels


def _floor_in_workers(items, split):
    return torch.utils.data.DataLoader(_FloorInWorkers(items, split), batch_size=None, num_workers=2)


def _own_rate(build, seconds, workers):
    with _image_into_skipped():
        return _rate(build, seconds, workers=workers)


def _rate(build, seconds, workers=0, queue=None):
    figures = measure_batches(build(), warmup_batches=2, max_seconds=seconds, workers=workers)
    if queue is not None:
        queue.put(figures["images_per_cpu_s"])
    return figures["images_per_cpu_s"]


def _side_by_side(build, seconds):
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    processes = [context.Process(target=_rate, args=(build, seconds, 0, queue)) for _ in range(2)]
    for process in processes:
        process.start()
    rates = [queue.get() for _ in processes]
    for process in processes:
        process.join()
    return sum(rates) / len(rates)


FAIR = {"loader w2": "floor w2"}  # a row compared with its own process layout's floor too


def paired(rates, reference) -> float:
    """The median over rounds of rate / reference, each round's pair measured back to back: drift
    between rounds (±7% on this shared host) cancels, as it does not in a ratio of medians."""
    return statistics.median(r / f for r, f in zip(rates, reference))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--split", choices=("train", "validation"), default="validation")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    folder = folder_split_dir(args.dir / "source", args.split)
    if folder is None or not (args.dir / "img").is_dir():
        print(f"loader_floor: {args.dir} needs source/{args.split}/ and img/ (see --help)", file=sys.stderr)
        return 2
    items = list_folder_images(folder)
    single = Instance(0, 1, "explicit")
    rows = {
        "floor x1": lambda: _rate(lambda: floor_batches(items, args.split, BATCH), args.seconds),
        "floor x2": lambda: _side_by_side(lambda: floor_batches(items, args.split, BATCH), args.seconds),
        "floor ring": lambda: _rate(lambda: floor_batches(items, args.split, BATCH, buffers=RING_BUFFERS_W2),
                                    args.seconds),
        "floor w2": lambda: _rate(lambda: _floor_in_workers(items, args.split), args.seconds, workers=2),
        "loader w0": lambda: _rate(lambda: loader_batches(args.dir / "img", args.split, BATCH, 0, "device", single),
                                   args.seconds),
        "loader w2": lambda: _rate(lambda: loader_batches(args.dir / "img", args.split, BATCH, 2, "device", single),
                                   args.seconds, workers=2),
        "own w0": lambda: _own_rate(lambda: loader_batches(args.dir / "img", args.split, BATCH, 0, "device", single),
                                    args.seconds, 0),
        "own w2": lambda: _own_rate(lambda: loader_batches(args.dir / "img", args.split, BATCH, 2, "device", single),
                                    args.seconds, 2),
    }
    rounds = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, measure in rows.items():
            rounds[name].append(measure())
    medians = {name: sorted(rates)[len(rates) // 2] for name, rates in rounds.items()}
    print(f"{args.dir} {args.split}: images per CPU-second, median of {args.rounds} rounds of {args.seconds:g} s")
    floor_us = 1e6 / medians["floor x1"]
    for name, rates in rounds.items():
        if name.startswith("own"):
            own_us = 1e6 / medians[name]
            print(f"  {name:10s} {own_us:7.1f} us/img of the loader's own CPU: {floor_us / (floor_us + own_us):.3f}x "
                  f"floor x1 at best  rounds {[round(1e6 / r, 1) for r in rates]} us")
            continue
        print(f"  {name:10s} {medians[name]:7.0f}  {paired(rates, rounds['floor x1']):.3f}x floor x1"
              f"{f'  {paired(rates, rounds[FAIR[name]]):.3f}x {FAIR[name]}' if name in FAIR else ''}  "
              f"rounds {[round(r) for r in rates]}")
    if args.json:
        args.json.write_text(json.dumps({"dir": str(args.dir), "split": args.split, "rounds": rounds,
                                         "medians": medians}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
