#!/usr/bin/env python3
"""jpeg_decode="device" against the host path, and its device memory over a long run.

    python benchmarks/device_decode_check.py --data DIR [--batch-size 256] [--workers 4] \\
        [--batches 8] [--memory-steps 1000] [--json OUT]

1. Pixels: the same split, seed and batch size read with jpeg_decode="device" and on the host
   with use_draft=False (a full-scale decode, as nvJPEG does), then with the default DCT-scaled
   host path; the keys must be identical, batch for batch. Per image it reports the mean absolute
   difference (levels); the bound is 2 against use_draft=False.
2. Memory: `--memory-steps` train batches with jpeg_decode="device"; torch.cuda.max_memory_allocated
   and the device's used memory (torch.cuda.mem_get_info, which includes nvJPEG's own pools) after
   the first 100 batches and at the end. Growth past the first 100 is what would leak.
3. Time: the decode thread's milliseconds per batch (decode + crop/resize, synchronised).
4. Parts (`--parts-only --jpegs DIR`, a folder of JPEG files such as photo_crops_dataset.py's train/): one batch
   of them, its nvJPEG decode and its crop/resize timed apart, the device's milliseconds (CUDA
   events) and the calling thread's CPU milliseconds (what it takes from the training loop's
   interpreter), the median of `--repeats`. `--resampler-from FILE` times a second
   device_resample.py (an earlier commit's) on the same batch and boxes.

Without CUDA it runs the CPU stand-in (steps 1 and 3 only, few batches): what CI's tests check.
Exit 1 when a bound is broken, 2 on a usage problem.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from imagenet_shards.loader import TrainCrop, ValidationCrop, get_data  # noqa: E402
from imagenet_shards.loader.device.device_decode import JpegDecoder  # noqa: E402
from imagenet_shards.loader.device.device_resample import BatchResampler, crop_box  # noqa: E402
from imagenet_shards.loader.device.jpeg_header import read_header  # noqa: E402
from imagenet_shards.loader.transform.pipeline import random_resized_crop_box  # noqa: E402

PIXEL_BOUND = 2.0


def batches(loader, count: int):
    for number, batch in enumerate(loader):
        if number == count:
            break
        yield batch


def compare(data, split: str, args) -> dict:
    """Per-image mean absolute differences of the device path against the host paths."""
    common = dict(batch_size=args.batch_size, workers=args.workers, normalization="device", seed=0,
                  with_keys=True, instance=(0, 1), read_ahead=False)
    device = get_data(data, split, jpeg_decode="device", **common)
    full_scale = (TrainCrop if split == "train" else ValidationCrop)(use_draft=False)
    full = get_data(data, split, transform=full_scale, **common)
    draft = get_data(data, split, **common)
    differences, against_draft = [], []
    for got, want, scaled in zip(batches(device, args.batches), batches(full, args.batches),
                                 batches(draft, args.batches)):
        if got.keys != want.keys or got.keys != scaled.keys:
            raise SystemExit(f"device_decode_check: {split}: the device path's keys differ from the host path's")
        images = got.images.cpu().numpy().astype(np.int16)
        differences += list(np.abs(images - want.images.numpy()).mean(axis=(1, 2, 3)))
        against_draft += list(np.abs(images - scaled.images.numpy()).mean(axis=(1, 2, 3)))
    return {"split": split, "images": len(differences),
            "mad_vs_full_decode_max": float(max(differences)), "mad_vs_full_decode_mean": float(np.mean(differences)),
            "mad_vs_dct_scaled_max": float(max(against_draft)), "mad_vs_dct_scaled_mean": float(np.mean(against_draft)),
            "host_decoded": device.report.device_host_decoded if device.report else None}


def memory(data, args) -> dict:
    """Device memory after 100 batches and after `--memory-steps`, and the decode time per batch."""
    loader = get_data(data, "train", batch_size=args.batch_size, workers=args.workers, normalization="device",
                      jpeg_decode="device", pin_memory=True, instance=(0, 1))
    figures, seen, started = {}, 0, time.perf_counter()
    while seen < args.memory_steps:
        for images, _ in loader:
            seen += 1
            if seen in (100, args.memory_steps):
                torch.cuda.synchronize()
                free, total = torch.cuda.mem_get_info()
                figures[seen] = {"max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
                                 "device_used_mb": (total - free) / 2**20}
            if seen == args.memory_steps:
                break
    elapsed = time.perf_counter() - started
    first, last = figures.get(100), figures.get(args.memory_steps)
    return {"steps": seen, "images_per_s": seen * args.batch_size / elapsed, "after_100": first, "at_end": last,
            "growth_max_allocated_mb": last["max_allocated_mb"] - first["max_allocated_mb"] if first else None,
            "growth_device_used_mb": last["device_used_mb"] - first["device_used_mb"] if first else None,
            "decode_ms_per_batch_p50": statistics.median(loader.device_decode_ms) if loader.device_decode_ms else None}


def timed(function, repeats: int, device: torch.device) -> dict:
    """The median device and calling-thread CPU milliseconds of `function()` over `repeats` calls
    (on the CPU the device's are the wall time)."""
    cuda = device.type == "cuda"
    device_ms, cpu_ms = [], []
    for _ in range(repeats + 1):  # the first call warms up (nvJPEG's buffers, the staging buffers)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
        wall, cpu = time.perf_counter(), time.thread_time()
        function()
        cpu_ms.append(1e3 * (time.thread_time() - cpu))
        if cuda:
            end.record()
            torch.cuda.synchronize()
            device_ms.append(start.elapsed_time(end))
        else:
            device_ms.append(1e3 * (time.perf_counter() - wall))
    return {"device_ms": statistics.median(device_ms[1:]), "cpu_ms": statistics.median(cpu_ms[1:])}


def parts(args, device: torch.device) -> dict:
    """One batch of `--jpegs` files: the decode and the crop/resize, timed apart."""
    import importlib.util
    import random

    files = sorted(path for path in Path(args.jpegs).rglob("*") if path.suffix.lower() in (".jpeg", ".jpg"))
    jpegs = [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8) for path in files[:args.batch_size]]
    rng, boxes = random.Random(0), []
    for jpeg in jpegs:
        header = read_header(jpeg.numpy().tobytes())
        boxes.append(crop_box(*random_resized_crop_box(header.width, header.height, (0.08, 1.0), (3 / 4, 4 / 3), rng)))
    boxes, flips = np.array(boxes), np.arange(len(jpegs)) % 2 == 1
    decoder = JpegDecoder(device)
    decoded = decoder.decode(jpegs)
    result = {"images": len(jpegs), "mean_bytes": float(np.mean([j.numel() for j in jpegs])),
              "decode": timed(lambda: decoder.decode(jpegs), args.repeats, device)}
    resampler = BatchResampler(224, device)
    result["resample"] = timed(lambda: resampler(decoded, boxes, flips), args.repeats, device)
    if args.profile:  # where the resize's device time goes, kernel by kernel
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as profiler:
            for _ in range(5):
                resampler(decoded, boxes, flips)
            if device.type == "cuda":
                torch.cuda.synchronize()
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        print(profiler.key_averages().table(sort_by=sort, row_limit=25), flush=True)
    if args.resampler_from:
        spec = importlib.util.spec_from_file_location("earlier_resample", args.resampler_from)
        earlier = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(earlier)
        other = earlier.BatchResampler(224, device)
        result["resample_earlier"] = timed(lambda: other(decoded, boxes, flips), args.repeats, device)
        difference = (other(decoded, boxes, flips).int() - resampler(decoded, boxes, flips).int()).abs()
        result["earlier_max_difference"] = int(difference.max())
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batches", type=int, default=8, help="batches per split compared")
    parser.add_argument("--memory-steps", type=int, default=1000)
    parser.add_argument("--jpegs", type=Path, default=None, help="a folder of JPEG files for the parts' timings")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--resampler-from", type=Path, default=None, help="an earlier device_resample.py to time too")
    parser.add_argument("--parts-only", action="store_true", help="only the parts' timings (needs --jpegs)")
    parser.add_argument("--profile", action="store_true", help="with --parts-only: the resize's kernels, profiled")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.parts_only and not args.jpegs:
        parser.error("--parts-only needs --jpegs")
    if args.memory_steps <= 100:
        parser.error("--memory-steps must be more than 100")
    result = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (stand-in decoder)"}
    if args.parts_only:
        result["parts"] = parts(args, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        print(json.dumps(result, indent=2))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    result["pixels"] = [compare(args.data, split, args) for split in ("train", "validation")]
    if torch.cuda.is_available():
        result["memory"] = memory(args.data, args)
    print(f"jpeg_decode='device' on {result['device']}; {args.data}")
    for row in result["pixels"]:
        print(f"  {row['split']:>10}: {row['images']} images, mean |diff| per image against the full-scale host "
              f"decode max {row['mad_vs_full_decode_max']:.2f} (mean {row['mad_vs_full_decode_mean']:.2f}), "
              f"against the DCT-scaled host path max {row['mad_vs_dct_scaled_max']:.2f} "
              f"(mean {row['mad_vs_dct_scaled_mean']:.2f}); host-decoded {row['host_decoded']}")
    if "memory" in result:
        m = result["memory"]
        print(f"  memory over {m['steps']} batches: max allocated {m['after_100']['max_allocated_mb']:.0f} -> "
              f"{m['at_end']['max_allocated_mb']:.0f} MB, device used {m['after_100']['device_used_mb']:.0f} -> "
              f"{m['at_end']['device_used_mb']:.0f} MB; {m['images_per_s']:,.0f} img/s loader alone; decode "
              f"{m['decode_ms_per_batch_p50']:.1f} ms a batch (p50)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    broken = [row["split"] for row in result["pixels"] if row["mad_vs_full_decode_max"] > PIXEL_BOUND]
    if broken:
        print(f"device_decode_check: the pixel bound ({PIXEL_BOUND} levels) is broken for {', '.join(broken)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
