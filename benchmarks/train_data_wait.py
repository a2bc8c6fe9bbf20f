#!/usr/bin/env python3
"""The training script's data-wait fraction on this host's accelerator, per DataLoader worker count.

    python benchmarks/train_data_wait.py --data DIR [--workers 2,6,12] [--decode host,device] [--own-rate] \\
        [--arch resnet50] [--batch-size 256] [--steps 150] [--warmup 10] [--amp] [--channels-last] \\
        [--strong-aug] [--json OUT]

Runs examples/train_imagenet.py (one instance, its own process) once per worker count on the
converted dataset DIR, with --step-log, and summarises its steps after the first 10 (worker start,
cuDNN's first kernels): the data-wait fraction (time blocked on the loader / step time, summed), the
part of it spent on each epoch's first step (every worker's first batch; large on a short epoch),
images per second, the host CPU-seconds per image (the training process and its DataLoader
workers, /proc), and the p50 / p90 of each step's wait and time in ms. `--decode host,device` runs
each worker count with the JPEGs decoded in the workers and on the accelerator (`--decode` of the
script); `--own-rate` adds a row that trains on one batch kept on the device: the accelerator's own
rate, with no loader, which the other rows are measured against. Near 0 the host keeps up
with the accelerator; where it does not, the fraction is the share of the accelerator's time lost
to the input pipeline. Prints a table and writes the figures as JSON.

Needs a dataset with several batches per epoch: benchmarks/photo_crops_dataset.py --crops 120 and
create_webdataset.py --format img make one of 12,720 real-photo JPEGs. On a CPU-only host it runs
(device "cpu") but measures the model's CPU time, not an accelerator's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "train_imagenet.py"
WARMUP = 10  # as examples/train_imagenet.py's DataWait; --warmup changes it


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarise(steps: list, warmup: int = WARMUP) -> dict:
    """The figures of one run's step log (its steps after the first `warmup`)."""
    kept = steps[warmup:]
    wait, time_ = sum(s["wait_s"] for s in kept), sum(s["step_s"] for s in kept)
    # An epoch's first step waits for every worker's first batch (DataLoader starts an epoch's reading
    # when the epoch is iterated): on a short epoch this weighs far more than on ImageNet's.
    first = {}
    for s in steps:
        first.setdefault(s["epoch"], s["step"])
    epoch_starts = [s for s in kept if first[s["epoch"]] == s["step"]]
    images = sum(s["images"] for s in kept)
    cpu = kept[-1].get("cpu_s", 0) - steps[warmup - 1].get("cpu_s", 0) if kept and warmup and "cpu_s" in kept[-1] \
        else None
    return {"steps": len(kept), "images": images, "cpu_s_per_image": cpu / images if cpu is not None and images else None,
            "data_wait": wait / time_ if time_ else None,
            "epoch_starts": len(epoch_starts),
            "data_wait_epoch_starts": sum(s["wait_s"] for s in epoch_starts) / time_ if time_ else None,
            "images_per_s": sum(s["images"] for s in kept) / time_ if time_ else None,
            "wait_ms_p50": 1e3 * percentile([s["wait_s"] for s in kept], 0.5),
            "wait_ms_p90": 1e3 * percentile([s["wait_s"] for s in kept], 0.9),
            "step_ms_p50": 1e3 * percentile([s["step_s"] for s in kept], 0.5),
            "step_ms_p90": 1e3 * percentile([s["step_s"] for s in kept], 0.9)}


def run_one(args, workers: int, folder: Path, decode: str = "host", fixed: bool = False) -> dict:
    name = f"{args.arch}-{'own-rate' if fixed else decode}-w{workers}"
    log = (args.keep_logs or folder) / f"steps-{name}.jsonl"
    log.unlink(missing_ok=True)  # the script appends
    command = [sys.executable, str(SCRIPT), "--data", str(args.data), "--arch", args.arch,
               "--batch-size", str(args.batch_size), "--workers", str(workers), "--max-steps", str(args.steps),
               "--image-size", str(args.image_size),
               "--epochs", "1000", "--no-val", "--checkpoint", str(folder / f"ckpt-{name}.pt"), "--decode", decode,
               "--checkpoint-every", "0", "--print-every", str(max(1, args.steps // 10)), "--step-log", str(log)]
    command += [flag for flag, on in (("--amp", args.amp), ("--channels-last", args.channels_last),
                                      ("--strong-aug", args.strong_aug), ("--fixed-batch", fixed)) if on]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"train_data_wait: {name}: train_imagenet.py exited {result.returncode}:\n"
                         f"{result.stderr[-3000:]}")
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    done = [line for line in result.stdout.splitlines() if line.startswith("done:")]
    return {"workers": workers, "decode": "none (one batch on the device)" if fixed else decode,
            **summarise(steps, args.warmup), "wall_s": time.perf_counter() - started,
            "script_summary": done[-1] if done else None}


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="converted dataset (folder, http(s)://, s3://)")
    parser.add_argument("--workers", default="2,6,12", help="comma-separated DataLoader worker counts")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--decode", default="host", help="comma-separated: host, device (where JPEGs are decoded)")
    parser.add_argument("--own-rate", action="store_true",
                        help="add a row on one batch kept on the device (no loader): the accelerator's own rate")
    parser.add_argument("--steps", type=int, default=150, help="steps per run, the first --warmup not counted")
    parser.add_argument("--warmup", type=int, default=WARMUP, help="steps not counted at the start of each run")
    parser.add_argument("--amp", action="store_true")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--strong-aug", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="folder for each run's step log (steps-w<workers>.jsonl); default: deleted")
    args = parser.parse_args(argv)
    try:
        counts = [int(w) for w in args.workers.split(",")]
    except ValueError:
        parser.error(f"--workers {args.workers!r}: comma-separated integers")
    decodes = args.decode.split(",")
    if any(d not in ("host", "device") for d in decodes):
        parser.error(f"--decode {args.decode!r}: comma-separated host, device")
    if args.warmup < 1 or args.steps <= args.warmup:
        parser.error(f"--warmup must be at least 1 and --steps more than --warmup ({args.warmup})")
    if args.keep_logs:
        args.keep_logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:  # checkpoints (and the logs unless kept)
        rows = [run_one(args, counts[0], Path(tmp), fixed=True)] if args.own_rate else []
        rows += [run_one(args, workers, Path(tmp), decode) for decode in decodes for workers in counts]
    device = device_name()
    print(f"{args.arch}, batch {args.batch_size}, {args.steps} steps ({args.warmup} warm-up not counted), "
          f"{'bf16 autocast' if args.amp else 'fp32'}{', channels_last' if args.channels_last else ''}"
          f"{', strong augmentation' if args.strong_aug else ''}, on {device}; {args.data}")
    print(f"  {'decode':>8} {'workers':>7} {'data wait':>9} {'at epoch starts':>15} {'img/s':>8} {'CPU-ms/img':>10} "
          f"{'wait p50/p90 ms':>16} {'step p50/p90 ms':>16}")
    for row in rows:
        cpu = row["cpu_s_per_image"]
        print(f"  {row['decode'][:8]:>8} {row['workers']:>7} {row['data_wait']:>9.1%} "
              f"{row['data_wait_epoch_starts']:>9.1%} ({row['epoch_starts']}) {row['images_per_s']:>8,.0f} "
              f"{(1e3 * cpu if cpu is not None else float('nan')):>10.3f} {row['wait_ms_p50']:>7.1f} /{row['wait_ms_p90']:>7.1f} "
              f"{row['step_ms_p50']:>7.1f} /{row['step_ms_p90']:>7.1f}")
    if args.json:
        args.json.write_text(json.dumps({"device": device, "arch": args.arch, "batch_size": args.batch_size,
                                         "amp": args.amp, "channels_last": args.channels_last,
                                         "strong_aug": args.strong_aug, "data": str(args.data), "rows": rows},
                                        indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
