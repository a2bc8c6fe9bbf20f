#!/usr/bin/env python3
"""The loader's speed where users train: a stock-Pillow venv against .venv, or one checkout against another (issue 32).

    python benchmarks/portable_speed.py DIR [--rounds 5] [--seconds 8] [--workers 2] [--json OUT]
    python benchmarks/portable_speed.py DIR --checkouts BEFORE AFTER [...]

DIR holds img/, an img conversion of benchmarks/photo_crops_dataset.py's photos (as for
`host_benchmark.py --compare`; `make demo`'s output works too). Two environments:

  default      "pinned": this interpreter (.venv: pinned torch, pillow-simd, `_jpeg_crop` from make) with
               PYTHONPATH at this checkout; "stock": a venv under --cache-dir as a user's training
               environment: torch 2.13.0 and torchvision 0.28.0 first (--no-deps, as a user's environment
               already has its torch), then `pip install` of this checkout alone (stock Pillow, `_jpeg_crop`
               built by setup.py).
  --checkouts  one stock venv per checkout, each with `pip install` of it: before and after a change
               (C code included) in one paired run.

The venvs are made once and kept under --cache-dir; each run reinstalls the checkout (--no-deps) so the
code measured is the checkout's now. The rows, train and validation (img, device normalisation,
--workers DataLoader workers, --batch-size 64), are measured as host_benchmark does (images per CPU-second of
get_data, every process counted), each in a fresh process of its environment, interleaved: per round
every row in both environments, in ABBA order across rounds so drift cancels. Printed: per round the
paired ratio second / first, and their median; --json writes every figure.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH_WHEELS = "/opt/wheels/torch-2.13.0+cpu-*.whl"
TORCHVISION = "torchvision==0.28.0"
SPLITS = ("train", "validation")
COPY_IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", "*.so", "demo-output",
                                     "benchmark-output", ".pytest_cache", ".device-*")
# One measurement, run by each environment's python: the --compare machinery on DIR/img, one JSON line. The
# library's import name is the checkout's own ({package}: `datasets` before 0.2.0, `imagenet_shards` since).
MEASURE = """
import json, sys
import PIL
from {package}.hostbench.pipelines import loader_batches
from {package}.hostbench.timing import measure_batches
from {package}.launcher import Instance
from {package}.loader import jpeg_crop
path, split, seconds, workers, batch = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
batches = loader_batches(path, split, batch, workers, "device", Instance(0, 1, "explicit"))
figures = measure_batches(batches, warmup_batches=2, max_seconds=seconds, workers=workers)
print(json.dumps({"images_per_cpu_s": figures["images_per_cpu_s"], "images_per_s": figures["images_per_s"],
                  "pil": PIL.__version__, "decode": jpeg_crop.decode_path()}))
"""


class Environment:
    """A python that runs MEASURE: its command's environment variables and a name for the table."""

    def __init__(self, name: str, python: Path, pythonpath: str | None = None, package: str = "imagenet_shards"):
        self.name, self.python, self.pythonpath, self.package = name, python, pythonpath, package

    def measure(self, dataset: Path, split: str, seconds: float, workers: int, batch: int) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath
        measure = MEASURE.replace("{package}", self.package)
        result = subprocess.run([str(self.python), "-c", measure, str(dataset), split, str(seconds), str(workers),
                                 str(batch)],
                                capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=900)
        if result.returncode != 0:
            raise SystemExit(f"portable_speed: {self.name} {split} failed: {result.stderr.strip()[-2000:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])


def pip(python: Path, *args) -> None:
    result = subprocess.run([str(python), "-m", "pip", "install", "-q", *map(str, args)], capture_output=True,
                            text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"portable_speed: pip install {' '.join(map(str, args))} failed: {result.stderr[-2000:]}")


def stock_venv(folder: Path, checkout: Path, name: str) -> Environment:
    """A venv in `folder` (made once: torch and torchvision --no-deps, then the checkout with its dependencies),
    with `checkout` installed afresh from a copy (an in-tree build would leave build/ in the checkout)."""
    wheels = sorted(glob.glob(TORCH_WHEELS))
    if not wheels:
        raise SystemExit(f"portable_speed: no torch wheel at {TORCH_WHEELS}")
    python = folder / "bin" / "python"
    fresh = not python.exists()
    if fresh:
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        pip(python, "--no-deps", wheels[-1], TORCHVISION)
    with tempfile.TemporaryDirectory(prefix="portable-speed-") as tmp:
        copy = Path(tmp) / "checkout"
        shutil.copytree(checkout, copy, ignore=COPY_IGNORE, symlinks=True)
        pip(python, *(() if fresh else ("--no-deps", "--force-reinstall")), copy)
        native = copy / "native" / "jpeg_crop"
        package = library_name(checkout)
        if native.is_dir() and package == "datasets" and not _imports(python, "_jpeg_crop"):
            # a checkout from before the one-step install (issue 32): the second step its README asked for
            pip(python, "--no-deps", "--force-reinstall", native)
    return Environment(name, python, package=package)


def library_name(checkout: Path) -> str:
    """The checkout's import name: `imagenet_shards`, or `datasets` for a checkout from before 0.2.0 (issue 42)."""
    return "imagenet_shards" if (checkout / "imagenet_shards" / "__init__.py").is_file() else "datasets"


def _imports(python: Path, module: str) -> bool:
    return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True,
                          cwd=tempfile.gettempdir()).returncode == 0


def environments(args) -> list:
    if args.checkouts:
        return [stock_venv(args.cache_dir / f"checkout-{i}", Path(c).resolve(), f"{i}:{Path(c).name}")
                for i, c in enumerate(args.checkouts, 1)]
    return [Environment("pinned", Path(sys.executable), str(REPO)),
            stock_venv(args.cache_dir / "stock-pillow", REPO, "stock")]


def run_rounds(envs, args) -> dict:
    """{split: {env name: [figures per round]}}: per round every split in both environments, ABBA order."""
    figures = {split: {env.name: [] for env in envs} for split in SPLITS}
    for round_index in range(args.rounds):
        order = envs if round_index % 2 == 0 else envs[::-1]
        for split in SPLITS:
            for env in order:
                figures[split][env.name].append(env.measure(args.dir / "img", split, args.seconds, args.workers,
                                                                  args.batch_size))
            first, second = (figures[split][env.name][-1]["images_per_cpu_s"] for env in envs)
            print(f"  round {round_index + 1}/{args.rounds} {split:10s} {envs[0].name} {first:7.0f}  "
                  f"{envs[1].name} {second:7.0f} img/CPU-s  ratio {second / first:.3f}", flush=True)
    return figures


def summary(envs, figures) -> dict:
    """Per split: each environment's median img/CPU-s and the median of the rounds' paired ratios."""
    out = {}
    for split, by_env in figures.items():
        rates = [[f["images_per_cpu_s"] for f in by_env[env.name]] for env in envs]
        ratios = [b / a for a, b in zip(*rates)]
        out[split] = {"medians": {env.name: statistics.median(r) for env, r in zip(envs, rates)},
                      "paired_ratios": ratios, "median_ratio": statistics.median(ratios)}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="the folder holding img/ (photo crops converted to img)")
    parser.add_argument("--checkouts", nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                        help="two checkouts, each pip-installed into its own stock-Pillow venv")
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "portable-speed-venvs",
                        help="where the venvs are kept between runs (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured per row and round, after warm-up")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not (args.dir / "img" / "metadata.json").is_file():
        print(f"portable_speed: {args.dir}: no img/metadata.json (convert benchmarks/photo_crops_dataset.py's "
              f"folder with create_webdataset.py --format img into DIR/img)", file=sys.stderr)
        return 2
    for checkout in args.checkouts or []:
        if not (Path(checkout) / "pyproject.toml").is_file():
            print(f"portable_speed: --checkouts {checkout}: not a checkout of this project (no pyproject.toml)",
                  file=sys.stderr)
            return 2
    envs = environments(args)
    print(f"portable_speed {args.dir}/img: {args.rounds} round(s) of {args.seconds:g} s per row, {args.workers} "
          f"workers, batch {args.batch_size}, device normalisation; images per CPU-second")
    figures = run_rounds(envs, args)
    result = summary(envs, figures)
    for env in envs:
        first = figures["train"][env.name][0]
        print(f"  {env.name}: {env.python}  (PIL {first['pil']}, JPEG decode {first['decode']})")
    print(f"\n{'split':10s} {envs[0].name:>12s} {envs[1].name:>12s}  median paired ratio  (rounds)")
    for split, row in result.items():
        print(f"{split:10s} {row['medians'][envs[0].name]:12.0f} {row['medians'][envs[1].name]:12.0f}  "
              f"{row['median_ratio']:19.3f}  {[round(r, 3) for r in row['paired_ratios']]}")
    if args.json:
        args.json.write_text(json.dumps({"dir": str(args.dir), "rounds": args.rounds, "seconds": args.seconds,
                                         "workers": args.workers, "batch_size": args.batch_size,
                                         "environments": [{"name": e.name, "python": str(e.python)} for e in envs],
                                         "figures": figures, "summary": result}, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
