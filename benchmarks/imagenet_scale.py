"""ImageNet at its full count on this machine: every command over 1,281,167 + 50,000 samples.

    python benchmarks/imagenet_scale.py --out DIR [--fraction F] [--json FILE] [--baseline FILE]

Builds an ImageNet-shaped source in the extracted layout (1,000 class folders; train/<wnid>/<wnid>_<n>.JPEG,
validation/<wnid>/ILSVRC2012_val_<n>.JPEG) with F times ImageNet's counts (F=1, the default: the
full count) of tiny JPEGs (64x48): a few encoded images, each file made distinct by a COM segment
holding its own name, so every file's hash differs. It is kept in DIR/source (reused when it has
the same counts) and converted to DIR/img. Stages, each a subprocess run as a user runs it:

    convert            create_webdataset.py --format img (passthrough) --workers 2
    validate           validate_dataset.py --workers 2
    plan N             distributed_webdataset.py --dry-run --num-instances N, N = 8, 64, 256
    repartition 8      distributed_webdataset.py --num-instances 8 (writes the remainders)
    validate + rep. 8  validate_dataset.py --workers 2 again, now with the repartition to check (its 8
                       instance indexes against the split's)
    validation epoch   get_data(validation) under torchrun, 2 processes x 1 worker; the keys read
                       are checked exactly once against the index (sorted numpy arrays, no sets)
    train 2000 batches get_data(train, batch 64, 2 workers): the first 2,000 batches (or the epoch)

Per stage: wall and CPU seconds (all processes: wait4's rusage), per-sample cost, and per
process (main, workers, ranks) the peak RSS (VmHWM) and the largest private memory seen
(Private_Clean + Private_Dirty of /proc/PID/smaps_rollup, sampled: see ProcessWatch; the stage's peak
RSS also takes wait4's largest RSS, which a process that lived less than a sample interval escapes). The disk used by
DIR and the whole run's wall time are recorded too. --baseline FILE (the JSON of a run at another
fraction) prints the per-sample cost ratio of every stage (linearity: the goal is <= 1.2x).
Writes JSON (--json, default DIR/imagenet_scale.json) and prints a table.
"""

import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

COUNTS = {"train": 1_281_167, "validation": 50_000}
CLASSES = 1000
IMAGE_SIZE = (64, 48)
BASE_IMAGES = 16
PLAN_INSTANCES = (8, 64, 256)
TRAIN_BATCHES = 2000
BATCH_SIZE = 64
PYTHON = sys.executable


# ------------------------------------------------------------------------------- the source

def wnids():
    return [f"n{1440764 + 9973 * number:08d}" for number in range(CLASSES)]


def split_counts(fraction: float) -> dict:
    return {split: max(CLASSES, round(count * fraction)) for split, count in COUNTS.items()}


def base_images() -> list:
    """A few small JPEGs: smooth gradients, quality 50, optimised Huffman tables: ~430 bytes, so that
    with its COM segment each sample's payload fits one 512-byte tar block (the disk goal)."""
    from PIL import Image

    width, height = IMAGE_SIZE
    y, x = np.mgrid[0:height, 0:width]
    images = []
    for number in range(BASE_IMAGES):
        rgb = np.stack([x * 4, y * 5, (x + y) * 2 + number * 8], axis=-1).clip(0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(rgb).save(buffer, format="JPEG", quality=50, optimize=True)
        images.append(buffer.getvalue())
    return images


def with_comment(jpeg: bytes, text: bytes) -> bytes:
    """The JPEG with a COM segment (FF FE, length, text) right after SOI: a different file, the same image."""
    return jpeg[:2] + b"\xff\xfe" + (len(text) + 2).to_bytes(2, "big") + text + jpeg[2:]


def _write_class(task):
    folder, names, images = task
    os.makedirs(folder, exist_ok=True)
    for number, name in enumerate(names):
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(with_comment(images[number % len(images)], name.encode()))
    return len(names)


def build_source(root: Path, fraction: float, workers: int) -> dict:
    counts = split_counts(fraction)
    images = base_images()
    wanted = {"counts": counts, "images_sha256": hashlib.sha256(b"".join(images)).hexdigest(), "complete": True}
    info_path = root / "scale_info.json"
    if info_path.is_file() and json.loads(info_path.read_text()) == wanted:
        return {"reused": True, "counts": counts, "seconds": 0.0}
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    classes = wnids()
    tasks = []
    for split, total in counts.items():
        next_val = 1
        for index, wnid in enumerate(classes):
            count = total // CLASSES + (index < total % CLASSES)
            if split == "train":
                names = [f"{wnid}_{n}.JPEG" for n in range(count)]
            else:
                names = [f"ILSVRC2012_val_{next_val + n:08d}.JPEG" for n in range(count)]
                next_val += count
            tasks.append((str(root / split / wnid), names, images))
    start = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        written = sum(pool.map(_write_class, tasks, chunksize=8))
    seconds = time.perf_counter() - start
    assert written == sum(counts.values())
    info_path.write_text(json.dumps(wanted))
    return {"reused": False, "counts": counts, "seconds": seconds}


# ------------------------------------------------------------------------------- watching processes

TICKS = os.sysconf("SC_CLK_TCK")


def _process_table():
    """({ppid: [pid, ...]}, {pid: CPU seconds so far}) of every process."""
    children, cpu = {}, {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    return children, cpu


def _status_kb(pid, names):
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name in names:
                values[name] = int(value.split()[0])
    return values


def _private_kb(pid):
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


class ProcessWatch(threading.Thread):
    """Samples a process tree: per process its peak RSS (VmHWM, kept by the kernel), the largest
    private memory seen and its CPU seconds when last seen. Every 0.25 s for the first 5 s (short
    stages), then every second; private memory (smaps_rollup: the kernel walks the page tables, ~10 ms
    for a 1 GB process) every 4th sample after that. The watch's own CPU time is kept (`cpu_s`)."""

    def __init__(self, root_pid: int):
        super().__init__(daemon=True)
        self.root = root_pid
        self.processes = {}  # pid -> {"depth", "command", "peak_rss_mb", "peak_private_mb", "cpu_s"}
        self.cpu_s = 0.0
        self._done = threading.Event()

    def run(self):
        started = time.perf_counter()
        samples = 0
        while not self._done.is_set():
            early = time.perf_counter() - started < 5
            self.sample(private=early or samples % 4 == 0)
            samples += 1
            self._done.wait(0.25 if early else 1.0)
        self.cpu_s = time.thread_time()

    def sample(self, private: bool = True):
        children, cpu = _process_table()
        frontier = [(self.root, 0)]
        while frontier:
            pid, depth = frontier.pop()
            frontier.extend((child, depth + 1) for child in children.get(pid, ()))
            try:
                status = _status_kb(pid, ("VmHWM",))
                entry = self.processes.get(pid)
                if entry is None:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
                    entry = self.processes[pid] = {"pid": pid, "depth": depth, "command": command[:160],
                                                   "peak_rss_mb": 0.0, "peak_private_mb": 0.0, "cpu_s": 0.0}
                entry["cpu_s"] = max(entry["cpu_s"], cpu.get(pid, 0.0))  # as last seen: a lower bound
                entry["peak_rss_mb"] = max(entry["peak_rss_mb"], status.get("VmHWM", 0) / 1024)
                if private or not entry["peak_private_mb"]:
                    entry["peak_private_mb"] = max(entry["peak_private_mb"], _private_kb(pid) / 1024)
            except (OSError, ValueError):
                continue

    def stop(self):
        self._done.set()
        self.join()


def run_stage(name: str, command: list, samples: int, env=None) -> dict:
    """Run `command`, watched; a failed command stops the benchmark with its output."""
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(map(str, command))}", flush=True)
    start = time.perf_counter()
    process = subprocess.Popen([str(c) for c in command], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})), cwd=REPO)
    watch = ProcessWatch(process.pid)
    watch.start()
    output = process.stdout.read().decode(errors="replace")
    # wait4: the CPU time and largest RSS of the command and of every descendant it waited for
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    watch.stop()
    cpu = usage.ru_utime + usage.ru_stime
    if process.returncode != 0:
        sys.exit(f"{name} failed (exit {process.returncode}):\n{output[-4000:]}")
    processes = sorted(watch.processes.values(), key=lambda p: (p["depth"], p["pid"]))
    return {"stage": name, "samples": samples, "wall_s": wall, "cpu_s": cpu, "watch_cpu_s": watch.cpu_s,
            "wall_us_per_sample": 1e6 * wall / samples, "cpu_us_per_sample": 1e6 * cpu / samples,
            "peak_rss_mb": max([p["peak_rss_mb"] for p in processes] + [usage.ru_maxrss / 1024]),
            "peak_private_mb": max((p["peak_private_mb"] for p in processes), default=0.0),
            "processes": processes, "output_tail": output[-1500:]}


# ------------------------------------------------------------------------------- loader runs (subprocesses)

def epoch_run(dataset: str, keys_dir: str) -> None:
    """One torchrun process: a whole validation epoch, keys written to keys_dir/rank-<r>.txt."""
    from imagenet_shards.loader import get_data

    loader = get_data(dataset, "validation", batch_size=BATCH_SIZE, workers=1, normalization="device",
                      with_keys=True)
    keys = []
    for batch in loader:
        keys.extend(batch.keys)
    rank = loader.instance.index
    Path(keys_dir, f"rank-{rank}.txt").write_text("\n".join(keys) + "\n")
    print(json.dumps({"rank": rank, "samples": len(keys), "report": loader.report.summary()}))


def train_run(dataset: str, batches: int) -> None:
    from imagenet_shards.loader import get_data

    loader = get_data(dataset, "train", batch_size=BATCH_SIZE, workers=2, normalization="device")
    done = samples = 0
    for images, labels in loader:
        done += 1
        samples += len(labels)
        if done >= batches:
            break
    print(json.dumps({"batches": done, "samples": samples}))


def check_exactly_once(dataset: Path, keys_dir: Path, ranks: int) -> dict:
    """Every validation key read exactly once over the ranks: sorted byte arrays compared, no sets."""
    from imagenet_shards.index import read_metadata, sample_index_name
    from imagenet_shards.index import read_sample_columns

    read = []
    for rank in range(ranks):
        read.extend(line for line in (keys_dir / f"rank-{rank}.txt").read_bytes().split(b"\n") if line)
    read = np.sort(np.array(read, dtype=bytes))
    entry = read_metadata(dataset)["splits"]["validation"]
    columns = read_sample_columns(str(dataset / (entry.get("index") or {}).get("name", sample_index_name("validation"))))
    offsets = columns.key_offsets
    data = columns.keys.tobytes()
    expected = np.sort(np.array([data[offsets[i]:offsets[i + 1]] for i in range(len(columns))], dtype=bytes))
    duplicates = int(np.sum(read[1:] == read[:-1])) if len(read) > 1 else 0
    same = len(read) == len(expected) and bool(np.array_equal(read, expected))
    return {"read": int(len(read)), "expected": int(len(expected)), "duplicates": duplicates, "exactly_once": same}


# ------------------------------------------------------------------------------- report

def du_bytes(path: Path) -> int:
    result = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True)
    return int(result.stdout.split()[0]) if result.returncode == 0 else -1


def du_disk_bytes(path: Path) -> int:
    result = subprocess.run(["du", "-s", "--block-size=1", str(path)], capture_output=True, text=True)
    return int(result.stdout.split()[0]) if result.returncode == 0 else -1


def print_table(report: dict, baseline: dict = None) -> None:
    base = {s["stage"]: s for s in (baseline or {}).get("stages", [])}
    header = (f"{'stage':<22}{'samples':>10}{'wall s':>9}{'CPU s':>9}{'wall us/s':>11}{'CPU us/s':>10}"
              f"{'peak RSS MB':>13}{'private MB':>12}")
    if base:
        header += f"{'CPU ratio':>11}{'wall ratio':>11}"
    print(header)
    print("-" * len(header))
    for stage in report["stages"]:
        line = (f"{stage['stage']:<22}{stage['samples']:>10,}{stage['wall_s']:>9.1f}{stage['cpu_s']:>9.1f}"
                f"{stage['wall_us_per_sample']:>11.1f}{stage['cpu_us_per_sample']:>10.1f}"
                f"{stage['peak_rss_mb']:>13.0f}{stage['peak_private_mb']:>12.0f}")
        other = base.get(stage["stage"])
        if other:
            line += (f"{stage['cpu_us_per_sample'] / max(other['cpu_us_per_sample'], 1e-9):>11.2f}"
                     f"{stage['wall_us_per_sample'] / max(other['wall_us_per_sample'], 1e-9):>11.2f}")
        print(line)
    print()
    print("per process: peak RSS / largest private MB (CPU s as last seen)")
    for stage in report["stages"]:
        parts = [f"{role(stage, p)} {p['peak_rss_mb']:.0f}/"
                 f"{p['peak_private_mb']:.0f} ({p.get('cpu_s', 0):.0f} s)" for p in stage["processes"]]
        print(f"  {stage['stage']:<22}" + ", ".join(parts))
    print()
    print(f"total wall {report['total_wall_s'] / 60:.1f} min; disk {report['disk_bytes'] / 1e9:.2f} GB "
          f"(source {report['source_disk_bytes'] / 1e9:.2f} GB, img {report['img_disk_bytes'] / 1e9:.2f} GB); "
          f"loader processes peak RSS {report['loader_peak_rss_mb']:.0f} MB; exactly once: {report['exactly_once']}")


def role(stage: dict, process: dict) -> str:
    """What a watched process is: torchrun's agent, a rank, a (DataLoader or pool) worker, the command."""
    names = ("torchrun", "rank", "worker") if stage["stage"] == "validation epoch" else ("main", "worker")
    return names[min(process["depth"], len(names) - 1)]


def markdown_table(report: dict, baseline: dict = None) -> str:
    """The docs/full-scale.md table: per stage wall, CPU (= wall on one free core), cost per sample, ratio, memory."""
    base = {s["stage"]: s for s in (baseline or {}).get("stages", [])}
    lines = ["| stage | samples | wall s | CPU s (one core) | CPU us / sample | ratio to 1/16 | "
             "memory per process: peak RSS / private MB |", "|---|---:|---:|---:|---:|---:|---|"]
    for stage in report["stages"]:
        other = base.get(stage["stage"])
        ratio = f"{stage['cpu_us_per_sample'] / other['cpu_us_per_sample']:.2f}" if other else ""
        memory = ", ".join(f"{role(stage, p)} {p['peak_rss_mb']:.0f} / {p['peak_private_mb']:.0f}"
                           for p in stage["processes"])
        lines.append(f"| {stage['stage']} | {stage['samples']:,} | {stage['wall_s']:.1f} | {stage['cpu_s']:.1f} | "
                     f"{stage['cpu_us_per_sample']:.1f} | {ratio} | {memory} |")
    return "\n".join(lines)


STAGE_GROUPS = ("convert", "validate", "plan", "repartition", "loader")  # --stages: "repartition" includes
# "validate + rep. 8", "loader" the validation epoch and the training batches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--fraction", type=float, default=1.0, help="of ImageNet's sample counts (default 1)")
    parser.add_argument("--json", type=Path, help="default OUT/imagenet_scale.json")
    parser.add_argument("--baseline", type=Path, help="the JSON of a run at another fraction: print cost ratios")
    parser.add_argument("--stages", nargs="+", choices=STAGE_GROUPS, default=list(STAGE_GROUPS),
                        help="run only these (default all); a stage after convert reads OUT/img as an earlier "
                             "run left it")
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="print the docs/full-scale.md table of a run's JSON "
                        "(with --baseline: the ratios) and exit")
    parser.add_argument("--epoch-run", nargs=2, metavar=("DATASET", "KEYS_DIR"), help=argparse.SUPPRESS)
    parser.add_argument("--train-run", nargs=2, metavar=("DATASET", "BATCHES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.epoch_run:
        epoch_run(*args.epoch_run)
        return 0
    if args.train_run:
        train_run(args.train_run[0], int(args.train_run[1]))
        return 0
    if args.markdown:
        baseline = json.loads(args.baseline.read_text()) if args.baseline else None
        print(markdown_table(json.loads(args.markdown.read_text()), baseline))
        return 0
    if args.out is None:
        parser.error("--out is required")
    if not 0 < args.fraction <= 1:
        parser.error("--fraction must be in (0, 1]")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    print(f"[{time.strftime('%H:%M:%S')}] building the source ({args.fraction} of ImageNet's count)", flush=True)
    built = build_source(out / "source", args.fraction, workers=2)
    counts = built["counts"]
    total = sum(counts.values())
    print(f"  {counts} in {built['seconds']:.1f} s{' (reused)' if built['reused'] else ''}", flush=True)
    img = out / "img"
    stages, once = [], {"exactly_once": True, "skipped": True}
    if "convert" in args.stages:
        stages.append(run_stage("convert", [PYTHON, "create_webdataset.py", "--source", out / "source", "--target",
                                            img, "--format", "img", "--workers", 2, "--overwrite", "--no-progress"],
                                total))
    if "validate" in args.stages:
        stages.append(run_stage("validate", [PYTHON, "validate_dataset.py", img, "--workers", 2, "--no-progress"],
                                total))
    if "plan" in args.stages:
        for count in PLAN_INSTANCES:
            stages.append(run_stage(f"plan {count}", [PYTHON, "distributed_webdataset.py", "--target", img,
                                                      "--num-instances", count, "--dry-run", "--quiet"], total))
    if "repartition" in args.stages:
        shutil.rmtree(img / "distributed", ignore_errors=True)
        stages.append(run_stage("repartition 8", [PYTHON, "distributed_webdataset.py", "--target", img,
                                                  "--num-instances", 8, "--quiet"], total))
        stages.append(run_stage("validate + rep. 8", [PYTHON, "validate_dataset.py", img, "--workers", 2,
                                                      "--no-progress"], total))
    if "loader" in args.stages:
        keys_dir = out / "keys"
        shutil.rmtree(keys_dir, ignore_errors=True)
        keys_dir.mkdir()
        torchrun = Path(PYTHON).with_name("torchrun")
        stages.append(run_stage("validation epoch", [torchrun, "--standalone", "--nproc_per_node", 2,
                                                     Path(__file__).resolve(), "--epoch-run", img, keys_dir],
                                counts["validation"]))
        once = check_exactly_once(img, keys_dir, 2)
        train_samples = min(TRAIN_BATCHES, counts["train"] // BATCH_SIZE) * BATCH_SIZE
        stages.append(run_stage(f"train {TRAIN_BATCHES} batches", [PYTHON, Path(__file__).resolve(), "--train-run",
                                                                    img, TRAIN_BATCHES], train_samples))
    loader_stages = [s for s in stages if s["stage"] in ("validation epoch", f"train {TRAIN_BATCHES} batches")]
    # torchrun's own agent is not a loader process: only the ranks and their workers count
    loader_rss = [p["peak_rss_mb"] for s in loader_stages for p in s["processes"]
                  if not (s["stage"] == "validation epoch" and p["depth"] == 0)]
    report = {
        "fraction": args.fraction, "counts": counts, "source_build_s": built["seconds"],
        "source_reused": built["reused"], "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "stages": stages, "exactly_once": once, "loader_peak_rss_mb": max(loader_rss, default=0.0),
        "total_wall_s": time.perf_counter() - began, "disk_bytes": du_disk_bytes(out),
        "source_disk_bytes": du_disk_bytes(out / "source"), "img_disk_bytes": du_disk_bytes(img),
    }
    json_path = args.json or out / "imagenet_scale.json"
    json_path.write_text(json.dumps(report, indent=1))
    baseline = json.loads(args.baseline.read_text()) if args.baseline else None
    print_table(report, baseline)
    print(f"\nwrote {json_path}")
    return 0 if once["exactly_once"] else 1


if __name__ == "__main__":
    sys.exit(main())
