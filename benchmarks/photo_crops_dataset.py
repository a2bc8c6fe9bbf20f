#!/usr/bin/env python3
"""An ImageNet-like folder of ~100 KB JPEGs from real photos, for host_benchmark.py --compare.

    python benchmarks/photo_crops_dataset.py --photos ../shared/photos/large [MORE_FOLDERS] --out DIR/source \\
        [--crops 5] [--classes 10] [--workers N]

Per photo, --crops random crops (60-100% of each side), resized (Lanczos) to a long side of 560-640 px,
saved at quality 95 with 4:2:0 chroma: of every 5, 4 under train/ and 1 under validation/, classes by
photo index modulo --classes (10; photos sorted over every --photos folder). ../shared/photos/large
gives 530 images with the default 5, mean ~98 KB and ~590x401 px (the sample builder's grain-free
crops of the same photos are ~60 KB); --crops 120 gives
a 12,720-image set for a training run (benchmarks/train_data_wait.py). Deterministic for a seed and
--crops, whatever --workers: the crops are drawn in one sequence before the workers encode them.
"""

import argparse
import os
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image


def draw_crops(photos, crops: int, seed: int):
    """Per photo, its crops as (x, y, w, h, long side): one random sequence over every photo, in order."""
    rng = random.Random(seed)
    plans = []
    for path in photos:
        with Image.open(path) as image:  # the header: the size alone
            width, height = image.size
        plan = []
        for _ in range(crops):
            fraction = rng.uniform(0.6, 1.0)
            w, h = int(width * fraction), int(height * fraction)
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            plan.append((x, y, w, h, rng.randint(560, 640)))
        plans.append(plan)
    return plans


def write_crops(task):
    """Encode one photo's crops; returns the bytes written."""
    index, path, plan, out, stride, classes = task
    image = Image.open(path).convert("RGB")
    total = 0
    for k, (x, y, w, h, long_side) in enumerate(plan):
        scale = long_side / max(w, h)
        crop = image.crop((x, y, x + w, y + h)).resize((max(1, round(w * scale)), max(1, round(h * scale))),
                                                       Image.LANCZOS)
        wnid = f"n{index % classes:08d}"
        folder = Path(out) / ("validation" if k % 5 == 4 else "train") / wnid
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{wnid}_{index * stride + k}.JPEG"
        crop.save(target, quality=95)
        total += target.stat().st_size
    return total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", required=True, type=Path, nargs="+",
                        help="folder(s) of photos (*.jpg, searched recursively)")
    parser.add_argument("--out", required=True, type=Path, help="new or empty output folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--crops", type=int, default=5, help="crops per photo (every fifth is a validation image)")
    parser.add_argument("--classes", type=int, default=10, help="classes (photo index modulo this)")
    parser.add_argument("--workers", type=int, default=1, help="processes encoding photos at once")
    args = parser.parse_args(argv)
    if args.crops < 1 or args.workers < 1 or args.classes < 1:
        print("photo_crops_dataset: --crops, --classes and --workers must be at least 1", file=sys.stderr)
        return 2
    photos = sorted(path for folder in args.photos for path in folder.rglob("*.jpg"))
    if not photos:
        print(f"photo_crops_dataset: no *.jpg under {' '.join(map(str, args.photos))}", file=sys.stderr)
        return 2
    if args.out.exists() and any(args.out.iterdir()):
        print(f"photo_crops_dataset: {args.out} is not empty", file=sys.stderr)
        return 2
    stride = max(10, args.crops)  # file numbers index * 10 + k, as before --crops existed, unless more crops
    tasks = [(index, path, plan, str(args.out), stride, args.classes)
             for index, (path, plan) in enumerate(zip(photos, draw_crops(photos, args.crops, args.seed)))]
    if args.workers == 1:
        sizes = [write_crops(task) for task in tasks]
    else:
        with ProcessPoolExecutor(min(args.workers, os.cpu_count() or 1)) as pool:
            sizes = list(pool.map(write_crops, tasks))
    count = len(photos) * args.crops
    print(f"{count} images from {len(photos)} photos in {args.out}, mean {sum(sizes) / count / 1e3:.1f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
