#!/usr/bin/env python3
"""jpeg_decode="device" under order="global": one flat sequence of keys and pixels at any scale.

    python benchmarks/global_order_device_check.py DATASET [--partitions 4] [--batch-size 16]

Reads the train split of a converted JPEG dataset with jpeg_decode="device" for (instances, workers)
= (1, 0), (2, 2) and (4, 1) (instances simulated in this process) and once on the host: the flat key
sequence must be the same for all four, and the device's pixels the same for the three device runs
(each flat batch is cropped by its own generator). Prints the mean |device - host| in levels (nvJPEG
and libjpeg differ slightly). Without CUDA the loader's CPU stand-in decoder runs (what CI can check).
Exit 1 when keys or pixels differ, 2 on a usage problem.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from imagenet_shards.loader import GlobalOrder, TrainCrop, get_data  # noqa: E402


def flat(source, instances, workers, decode, partitions, batch_size) -> list:
    """[(keys, images)] of every step's global batch, rank 0's first."""
    per_rank = []
    for index in range(instances):
        loader = get_data(source, "train", batch_size, workers, normalization="device", with_keys=True,
                          instance=(index, instances), seed=3, epoch=1, order=GlobalOrder(partitions=partitions),
                          jpeg_decode=decode, transform=TrainCrop(image_size=128))
        per_rank.append([(list(keys), images.clone()) for images, _, keys in loader])
    return [per_rank[rank][step] for step in range(len(per_rank[0])) for rank in range(instances)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", help="a converted JPEG dataset (its train split is read)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args(argv)
    if not (Path(args.dataset) / "metadata.json").is_file():
        print(f"error: {args.dataset}: not a converted dataset (no metadata.json)", file=sys.stderr)
        return 2
    reference = flat(args.dataset, 1, 0, "device", args.partitions, args.batch_size)
    images = reference[0][1]
    print(f"device (1, 0): {len(reference)} batches on {images.device}, {images.dtype} {tuple(images.shape)}")
    host = flat(args.dataset, 1, 0, None, args.partitions, args.batch_size)
    same = [keys for keys, _ in reference] == [keys for keys, _ in host]
    difference = torch.stack([(a.float().cpu() - b.float()).abs().mean() for (_, a), (_, b) in zip(reference, host)])
    print(f"host (1, 0): keys {'equal' if same else 'DIFFER'}; mean |device - host| {float(difference.mean()):.2f} levels")
    for instances, workers in ((2, 2), (4, 1)):
        other = flat(args.dataset, instances, workers, "device", args.partitions, args.batch_size)
        keys = [k for k, _ in other] == [k for k, _ in reference]
        pixels = keys and all(torch.equal(a, b) for (_, a), (_, b) in zip(other, reference))
        print(f"device ({instances}, {workers}): keys {'equal' if keys else 'DIFFER'}, "
              f"pixels {'equal' if pixels else 'DIFFER'}")
        same = same and keys and pixels
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
