"""Validation throughput against hashing the same files, measured in one run.

    python benchmarks/validate_benchmark.py [--out benchmark-output/validate] [--size-mb 1000] [--repeats 3]

Builds (once, reused if present) two synthetic datasets written with the formats' own writers,
--samples-per-shard 256 (enough shards for two workers to share evenly): a tensor dataset shaped like the converter's default output (train
256x256x3 uint8, ~197 KB a sample) and an img dataset of ImageNet-sized JPEGs (~110 KB a sample).
Warms the page cache, then measures per dataset, each the best of --repeats, interleaved:

  openssl dgst -sha256  the command-line tool on the same shards, through the page cache: the floor
                        (w2: two openssl processes, every other shard each: the floor for two workers)
  sha256 (files)        imagenet_shards.fileio.sha256_file over every shard
  validate w1 / w2      imagenet_shards.validate.converted.validate_converted with 1 and 2 worker processes
  validate --deep w1    every payload's CRC32C checked and every payload decoded as well

and sha256 over a buffer already in memory (the CPU bound), and writes the figures as JSON
(OUT/validate_benchmark.json) and a table. Goals: validate w1 >= 95% of openssl's rate on the
same files; w2 >= 1.8x w1. Timings on a shared machine are noisy: compare the ratios of one run.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imagenet_shards.fileio import sha256_file  # noqa: E402
from imagenet_shards.formats import EncodedSample, get_format  # noqa: E402
from imagenet_shards.index import (FORMAT_VERSION, ShardRecord, sample_index_name, write_metadata,  # noqa: E402
                            write_sample_index)
from imagenet_shards.formats.npy import encode_npy  # noqa: E402
from imagenet_shards.validate.converted import validate_converted  # noqa: E402

# The converter's default tensor shapes: train Resize(256) CenterCrop(256), validation CenterCrop(224).
SAMPLE_SHAPES = {"train": (256, 256, 3), "validation": (224, 224, 3)}


def build_synthetic_dataset(out, fmt="tensor", samples=None, samples_per_shard=1024, classes=10, seed=0,
                            payload=None):
    """A converted dataset in the documented layout, written with the shared core.

    `samples`: {split: count}. `payload(rng, split, number) -> bytes` makes each payload (default:
    a random 224x224x3 uint8 tensor as .npy). Returns the metadata dict.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    samples = samples or {"train": 2048, "validation": 256}
    class_names = [f"n{number:08d}" for number in range(classes)]
    rng = np.random.default_rng(seed)
    if payload is None:
        def payload(rng, split, number):
            return encode_npy(rng.integers(0, 256, SAMPLE_SHAPES.get(split, (224, 224, 3)), dtype=np.uint8))
    metadata = {"format_version": FORMAT_VERSION, "format": fmt, "shuffle": False, "seed": seed, "image_quality": 95,
                "train_transform_pipeline": [], "validation_transform_pipeline": [],
                "classes": class_names, "tensor_layout": "HWC" if fmt == "tensor" else None, "splits": {}}
    shard_format = get_format(fmt)
    for split, count in samples.items():
        shards, records = [], []
        for first in range(0, count, samples_per_shard):
            name = shard_format.shard_name(split, first // samples_per_shard, -(-count // samples_per_shard))
            with shard_format.open_writer(out / name) as writer:
                for number in range(first, min(first + samples_per_shard, count)):
                    key = f"{split}_{number:08d}"
                    label = number % classes
                    source = f"{split}/{class_names[label]}/{key}.JPEG"
                    info = {"source": source, "class": class_names[label]}
                    sample = EncodedSample(key, label, class_names[label], source, info, payload(rng, split, number))
                    records.append(writer.add_sample(sample, name))
            shards.append(ShardRecord(name, writer.samples, writer.bytes_written, writer.sha256, writer.md5))
        index = write_sample_index(out / sample_index_name(split), records)
        metadata[f"{split}_length"] = count
        metadata["splits"][split] = {"length": count, "source_samples": count, "skipped": [],
                                     "shards": [s.to_json() for s in shards], "index": index}
    write_metadata(out, metadata)
    return metadata


def cpu_seconds():
    """CPU time of this process and its reaped children (pool workers), user + system."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def best_rates(cases, repeats):
    """{label: {"wall": MB/s, "cpu": MB/s per CPU-second}}: each case's best of `repeats`, run interleaved.

    Interleaving gives every case the same share of whatever else the machine is doing; the
    best run is the one least disturbed by it. The CPU-time rate is what one core does when it
    is not shared, the figure to compare per worker on a busy machine.
    """
    best = {}
    for _ in range(repeats):
        for label, run, nbytes in cases:
            wall, cpu = time.perf_counter(), cpu_seconds()
            run()
            wall, cpu = time.perf_counter() - wall, cpu_seconds() - cpu
            entry = best.setdefault(label, {"wall": 0.0, "cpu": 0.0})
            entry["wall"] = max(entry["wall"], nbytes / wall / 1e6)
            entry["cpu"] = max(entry["cpu"], nbytes / max(cpu, 1e-9) / 1e6)
    return best


JPEG_BYTES = 110_000  # ImageNet's average JPEG


def imagenet_sized_jpegs(count=8, seed=0):
    """`count` distinct RGB JPEGs of ~JPEG_BYTES each (smooth noise at 500x375, the quality searched)."""
    from io import BytesIO

    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        small = rng.integers(0, 256, (94, 125, 3), dtype=np.uint8)
        noise = rng.integers(-24, 24, (375, 500, 3))
        pixels = np.clip(np.kron(small, np.ones((4, 4, 1)))[:375, :500] + noise, 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        low, high = 10, 98
        while low < high:  # the lowest quality whose JPEG is at least JPEG_BYTES
            quality = (low + high) // 2
            buffer = BytesIO()
            image.save(buffer, format="JPEG", quality=quality)
            if buffer.tell() < JPEG_BYTES:
                low = quality + 1
            else:
                high = quality
        buffer = BytesIO()
        image.save(buffer, format="JPEG", quality=low)
        out.append(buffer.getvalue())
    return out


def two_openssl(shards):
    """`openssl dgst -sha256` in two processes at once, each on every other shard."""
    running = [subprocess.Popen(["openssl", "dgst", "-sha256"] + [str(p) for p in shards[start::2]],
                                stdout=subprocess.DEVNULL) for start in (0, 1)]
    if any(process.wait() for process in running):
        raise SystemExit("openssl failed")


def dataset_of(out, fmt, size_mb, samples_per_shard=256):
    """The benchmark's dataset of format `fmt` (built when missing or of another size): (path, shards)."""
    data = Path(out) / f"dataset-{fmt}"
    if fmt == "tensor":
        sample_bytes = len(encode_npy(np.zeros(SAMPLE_SHAPES["train"], np.uint8))) + 3 * 512 + 100
        payload = None
    else:
        jpegs = imagenet_sized_jpegs()
        sample_bytes = sum(map(len, jpegs)) // len(jpegs) + 3 * 512 + 100

        def payload(rng, split, number):
            return jpegs[number % len(jpegs)]
    train = max(1, size_mb * 1_000_000 // sample_bytes)
    built = json.loads((data / "metadata.json").read_text()) if (data / "metadata.json").is_file() else None
    if not built or built["train_length"] != train or built["splits"]["train"]["shards"][0]["samples"] != min(train, samples_per_shard):
        print(f"building a synthetic {fmt} dataset of {train:,} train samples in {data} ...", file=sys.stderr)
        if data.exists():
            shutil.rmtree(data)
        build_synthetic_dataset(data, fmt, {"train": train, "validation": 256}, samples_per_shard, payload=payload)
    return data, sorted(data.glob("*.tar"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmark-output/validate")
    parser.add_argument("--size-mb", type=int, default=1000, help="size of each synthetic dataset (default 1000 MB)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", default="tensor,img")
    # Enough shards that two workers get equal work (ImageNet at 1,024 a shard has 1,252 train shards).
    parser.add_argument("--samples-per-shard", type=int, default=256)
    args = parser.parse_args(argv)

    buffer = os.urandom(256 << 20)
    cases = [("sha256 (memory)", "-", 1, lambda: hashlib.sha256(buffer).hexdigest(), len(buffer))]
    datasets = {}
    for fmt in args.formats.split(","):
        data, shards = dataset_of(args.out, fmt, args.size_mb, args.samples_per_shard)
        total = sum(path.stat().st_size for path in shards)
        datasets[fmt] = {"path": str(data), "shards": len(shards), "bytes": total,
                         "samples": json.loads((data / "metadata.json").read_text())["train_length"] + 256}
        for path in shards:  # warm the page cache
            sha256_file(path)

        def run_validate(workers, deep=False, data=data):
            report = validate_converted(data, workers=workers, deep=deep)
            if not report.ok:
                raise SystemExit("the synthetic dataset does not validate:\n" + "\n".join(p.line() for p in report.errors))

        cases += [
            ("openssl dgst -sha256", fmt, 1, lambda shards=shards: subprocess.run(
                ["openssl", "dgst", "-sha256"] + [str(p) for p in shards], check=True, stdout=subprocess.DEVNULL), total),
            # Two openssl processes on half the shards each: what two cores of this machine give hashing
            # (the floor under validate w2's scaling: two vCPUs may share one physical core).
            ("openssl dgst -sha256", fmt, 2, lambda shards=shards: two_openssl(shards), total),
            ("sha256 (files, sha256_file)", fmt, 1, lambda shards=shards: [sha256_file(p) for p in shards], total),
            ("validate", fmt, 1, lambda run=run_validate: run(1), total),
            ("validate", fmt, 2, lambda run=run_validate: run(2), total),
            ("validate --deep", fmt, 1, lambda run=run_validate: run(1, deep=True), total),
        ]
    best = best_rates([(f"{what} {fmt} w{w}", run, n) for what, fmt, w, run, n in cases], args.repeats)
    memory = best["sha256 (memory) - w1"]
    rows = []
    for what, fmt, w, _, _ in cases:
        rate = best[f"{what} {fmt} w{w}"]
        openssl = best.get(f"openssl dgst -sha256 {fmt} w1")
        w1 = best.get(f"{what} {fmt} w1")
        rows.append({"what": what, "format": fmt, "workers": w,
                     "mb_per_s": round(rate["wall"], 1),
                     "mb_per_cpu_s": round(rate["cpu"], 1),
                     "vs_openssl": round(rate["wall"] / openssl["wall"], 3) if openssl else None,
                     "cpu_vs_openssl": round(rate["cpu"] / openssl["cpu"], 3) if openssl else None,
                     "vs_w1": round(rate["wall"] / w1["wall"], 3) if w1 else None,
                     "vs_sha256_memory": round(rate["wall"] / memory["wall"], 3)})
    results = {"datasets": datasets, "cpus": len(os.sched_getaffinity(0)), "load_average_1min": os.getloadavg()[0],
               "repeats": args.repeats, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "validate_benchmark.json").write_text(json.dumps(results, indent=1) + "\n")
    for fmt, info in datasets.items():
        print(f"{fmt}: {info['shards']} shards, {info['bytes'] / 1e6:,.0f} MB, {info['bytes'] / info['samples'] / 1e3:,.0f} KB "
              f"a sample (page cache warm)")
    print(f"best of {args.repeats}; load average {results['load_average_1min']:.1f} on {results['cpus']} CPUs")
    print(f"{'what':28} {'format':>6} {'workers':>7} {'MB/s':>7} {'MB/CPU-s':>9} {'vs openssl':>10} "
          f"{'CPU vs openssl':>14} {'vs w1':>6} {'vs sha256 mem':>13}")
    for row in rows:
        ratio = lambda value: f"{value:.0%}" if value is not None else "-"  # noqa: E731
        print(f"{row['what']:28} {row['format']:>6} {row['workers']:>7} {row['mb_per_s']:>7,.0f} {row['mb_per_cpu_s']:>9,.0f} "
              f"{ratio(row['vs_openssl']):>10} {ratio(row['cpu_vs_openssl']):>14} "
              f"{(str(row['vs_w1']) + 'x') if row['vs_w1'] else '-':>6} {ratio(row['vs_sha256_memory']):>13}")
    print(f"written: {out / 'validate_benchmark.json'}")


if __name__ == "__main__":
    main()
