"""The loader state's size and cost at ImageNet count (1,331,167 samples: train + validation).

    python benchmarks/resume_state_benchmark.py [--out benchmark-output/resume] [--instances 8] [--workers 8]

On the synthetic source (its plan is the one a converted dataset of that many samples gets; tiny
images keep the batches cheap), batch 256, instance 0 of --instances:
  state, one segment     state_dict() after 3 batches: JSON bytes, and the time of
                         json.dumps(loader.state_dict()) per call (the per-batch save cost),
                         against the time of one batch of 224x224 synthetic images (workers 0)
  state after N -> 2N    every instance's state loaded by instance 0 of 2N (a new segment: the
                         remainder dealt anew); load_state_dict's time and the new state's bytes
Writes OUT/resume_state_benchmark.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from imagenet_shards.loader import DataSource, TrainCrop, get_data

SAMPLES = 1_331_167
BATCH = 256


def per_call(function, seconds=1.0):
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        function()
        calls += 1
    return (time.perf_counter() - start) / calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmark-output/resume")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--workers", type=int, default=8, help="worker count recorded in the state (plan only)")
    args = parser.parse_args()

    def loader(index, count, size=8):
        return get_data(DataSource("synthetic", synthetic_length=SAMPLES), "train", BATCH, 0, normalization="device",
                        transform=TrainCrop(image_size=size), instance=(index, count), seed=0, epoch=5)

    first = loader(0, args.instances)
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    state = first.state_dict()
    state_bytes = len(json.dumps(state))
    save = per_call(lambda: json.dumps(first.state_dict()))
    big = loader(0, args.instances, 224)
    batches = iter(big)
    next(batches)
    batch = per_call(lambda: next(batches), 2.0)

    # every instance stopped at a different batch, each with `workers` workers' progress
    states = []
    for index in range(args.instances):
        data = json.loads(json.dumps(state))
        per_worker = [[1 + (index + w) % 3, 0] for w in range(args.workers)]
        data.update(instance=index)
        data["segment_config"]["workers"] = args.workers
        data["progress"] = {"next": index % args.workers,
                            "done": [[b, b * BATCH] for b, _ in per_worker]}
        states.append(data)
    grown = loader(0, 2 * args.instances)
    start = time.perf_counter()
    grown.load_state_dict(states)
    load_seconds = time.perf_counter() - start
    grown_bytes = len(json.dumps(grown.state_dict()))
    result = {"samples": SAMPLES, "batch": BATCH, "instances": args.instances, "workers": args.workers,
              "state_bytes_one_segment": state_bytes, "state_dict_json_us": round(save * 1e6, 1),
              "batch_224_ms": round(batch * 1e3, 2), "save_fraction_of_batch": round(save / batch, 6),
              "load_after_resize_s": round(load_seconds, 3), "state_bytes_after_resize": grown_bytes}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "resume_state_benchmark.json").write_text(json.dumps(result, indent=1))
    print(f"{'figure':32} value")
    for name, value in result.items():
        print(f"{name:32} {value}")


if __name__ == "__main__":
    main()
