#!/usr/bin/env python3
"""An ImageNet-like folder of ~100 KB JPEGs from real photos, for host_benchmark.py --compare.

    python benchmarks/photo_crops_dataset.py --photos ../shared/photos/large --out DIR/source

Per photo, 5 random crops (60-100% of each side), resized (Lanczos) to a long side of 560-640 px,
saved at quality 95 with 4:2:0 chroma: 4 under train/, 1 under validation/, classes by photo
index modulo 10. ../shared/photos/large gives 530 images, mean ~98 KB and ~590x401 px (the
sample builder's grain-free crops of the same photos are ~60 KB). Deterministic for a seed.
"""

import argparse
import random
import sys
from pathlib import Path

from PIL import Image


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", required=True, type=Path, help="folder of photos (*.jpg, searched recursively)")
    parser.add_argument("--out", required=True, type=Path, help="new or empty output folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    photos = sorted(args.photos.rglob("*.jpg"))
    if not photos:
        print(f"photo_crops_dataset: no *.jpg under {args.photos}", file=sys.stderr)
        return 2
    if args.out.exists() and any(args.out.iterdir()):
        print(f"photo_crops_dataset: {args.out} is not empty", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    total, count = 0, 0
    for index, path in enumerate(photos):
        image = Image.open(path).convert("RGB")
        for k in range(5):
            width, height = image.size
            fraction = rng.uniform(0.6, 1.0)
            w, h = int(width * fraction), int(height * fraction)
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            scale = rng.randint(560, 640) / max(w, h)
            crop = image.crop((x, y, x + w, y + h)).resize((max(1, round(w * scale)), max(1, round(h * scale))),
                                                           Image.LANCZOS)
            wnid = f"n{index % 10:08d}"
            folder = args.out / ("validation" if k == 4 else "train") / wnid
            folder.mkdir(parents=True, exist_ok=True)
            target = folder / f"{wnid}_{index * 10 + k}.JPEG"
            crop.save(target, quality=95)
            total, count = total + target.stat().st_size, count + 1
    print(f"{count} images from {len(photos)} photos in {args.out}, mean {total / count / 1e3:.1f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
