#!/usr/bin/env python3
"""jpeg_decode="device" under order="global": the same global batches, keys and pixels, at any scale.

    python benchmarks/global_order_device_check.py DATASET [--partitions 4] [--global-batch-size 32]

Reads the train split of a converted JPEG dataset with jpeg_decode="device" for (instances, workers)
= (1, 0), (2, 2) and (4, 1) (instances simulated in this process, each rank's batch G/N) and once on
the host: every step's global batch must hold the same keys for all four, and the device's pixels of
each key be the same for the three device runs (each sample is cropped by its own generator, seeded
by its flat position). Prints the mean |device - host| in levels (nvJPEG
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


def flat(source, instances, workers, decode, partitions, global_batch) -> list:
    """(sorted keys, their images stacked) of every step's global batch."""
    per_rank = []
    order = GlobalOrder(partitions=partitions, global_batch_size=global_batch)
    for index in range(instances):
        loader = get_data(source, "train", None, workers, normalization="device", with_keys=True,
                          instance=(index, instances), seed=3, epoch=1, order=order,
                          jpeg_decode=decode, transform=TrainCrop(image_size=128))
        per_rank.append([(list(keys), images.clone()) for images, _, keys in loader])
    steps = []
    for step in range(len(per_rank[0])):
        batch = {key: images[n] for rank in per_rank for n, key in enumerate(rank[step][0])
                 for images in (rank[step][1],)}
        keys = sorted(batch)
        steps.append((keys, torch.stack([batch[key] for key in keys])))
    return steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", help="a converted JPEG dataset (its train split is read)")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    if not (Path(args.dataset) / "metadata.json").is_file():
        print(f"error: {args.dataset}: not a converted dataset (no metadata.json)", file=sys.stderr)
        return 2
    reference = flat(args.dataset, 1, 0, "device", args.partitions, args.global_batch_size)
    images = reference[0][1]
    print(f"device (1, 0): {len(reference)} batches on {images.device}, {images.dtype} {tuple(images.shape)}")
    host = flat(args.dataset, 1, 0, None, args.partitions, args.global_batch_size)
    same = [keys for keys, _ in reference] == [keys for keys, _ in host]
    difference = torch.stack([(a.float().cpu() - b.float()).abs().mean() for (_, a), (_, b) in zip(reference, host)])
    print(f"host (1, 0): keys {'equal' if same else 'DIFFER'}; mean |device - host| {float(difference.mean()):.2f} levels")
    for instances, workers in ((2, 2), (4, 1)):
        other = flat(args.dataset, instances, workers, "device", args.partitions, args.global_batch_size)
        keys = [k for k, _ in other] == [k for k, _ in reference]
        pixels = keys and all(torch.equal(a, b) for (_, a), (_, b) in zip(other, reference))
        print(f"device ({instances}, {workers}): keys {'equal' if keys else 'DIFFER'}, "
              f"pixels {'equal' if pixels else 'DIFFER'}")
        same = same and keys and pixels
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
