"""`make demo`: the whole workflow on the built-in sample dataset, run as a user would.

Each step runs one of the project's commands in a subprocess and prints the command
first, so the demo doubles as a worked example. A step that fails stops the demo with
its exit code.
"""

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from imagenet_shards.formats import format_names

REPO = Path(__file__).resolve().parents[2]  # imagenet_shards/tools/demo.py -> the checkout
PACKAGE = (__package__ or __name__).split(".")[0]  # the import name it was run under, for `python -m`
# Small shards, so that the sample dataset has several per split and 2 instances do not divide them.
SAMPLES_PER_SHARD = 128


def demo_steps(out: Path, classes: int, train_per_class: int, val_per_class: int):
    source = out / "source"
    python = sys.executable
    yield "Build the sample dataset (ImageNet layouts from real photos)", [
        python, "-m", f"{PACKAGE}.sample", "--out", source, "--classes", classes,
        "--train-per-class", train_per_class, "--val-per-class", val_per_class, "--seed", "0", "--quirks",
    ]
    for fmt in format_names():
        yield f"Convert it to {fmt} shards", [
            python, "create_webdataset.py", "--source", source, "--target", out / fmt, "--format", fmt,
            "--seed", "0", "--samples-per-shard", SAMPLES_PER_SHARD, "--overwrite", "--no-progress",
        ]
    yield "Plan a repartition of the img dataset for 2 instances (dry run: writes nothing)", [
        python, "distributed_webdataset.py", "--target", out / "img", "--num-instances", "2", "--dry-run",
    ]
    yield "Repartition it for 2 instances (equal shares; only the balancing samples are copied)", [
        python, "distributed_webdataset.py", "--target", out / "img", "--num-instances", "2", "--quiet",
    ]
    for fmt in format_names():
        yield f"Validate the {fmt} dataset" + (" and its repartition" if fmt == "img" else ""), [
            python, "validate_dataset.py", out / fmt, "--no-progress",
        ]
    yield "Compare the formats: which one feeds accelerators fastest on this host", [
        python, "host_benchmark.py", "--compare", out, "--seconds", "2",
        "--json", out / "comparison.json", "--plot", out / "comparison.png",
    ]
    yield ("Emulate 2 accelerators at an H100's ResNet-50 rate (MLPerf Storage's 1,786 images/s, in batches of 100 "
           "that the sample's train split fits): are they kept busy (AU >= 0.9)?"), [
        python, "host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", out / "img",
        "--accelerators", "2", "--profile", "resnet50-h100", "--batch-size", "100", "--compute-time", "0.056",
        "--depth", "storage", "--seconds", "2", "--json", out / "emulated.json", "--plot", out / "emulated.png",
    ]


def run(out: Path, classes: int, train_per_class: int, val_per_class: int) -> int:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for number, (title, command) in enumerate(demo_steps(out, classes, train_per_class, val_per_class), 1):
        command = [str(part) for part in command]
        shown = " ".join(shlex.quote(part.replace(sys.executable, "python")) for part in command)
        print(f"\n=== step {number}: {title}\n$ {shown}", flush=True)
        result = subprocess.run(command, cwd=REPO)
        if result.returncode != 0:
            print(f"\ndemo: step {number} failed with exit code {result.returncode}", file=sys.stderr)
            return result.returncode
    print(f"\n=== demo finished in {time.perf_counter() - started:.0f} s; everything it wrote is in {out}/")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "demo-output", help="folder for everything the demo writes")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=20)
    args = parser.parse_args(argv)
    return run(args.out.resolve(), args.classes, args.train_per_class, args.val_per_class)


if __name__ == "__main__":
    sys.exit(main())
