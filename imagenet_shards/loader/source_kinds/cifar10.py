"""The cifar10 kind: items are row numbers into CIFAR-10's images and labels (imagenet_shards.cifar10), two
numpy arrays the main process reads once (loader/sources.py) and forked workers share; each sample is
a 32x32 HWC uint8 array the runtime steps (crop, resize) then process."""

from __future__ import annotations

from imagenet_shards.loader.payloads.tensor import ARRAY
from imagenet_shards.loader.source_kinds.base import SourceKind, numbered_key


def _raw_samples(context, items):
    images, labels = context.source.arrays
    for item in items:
        yield item, "cifar10", int(labels[item]), images[item], ARRAY.name, None


def _labels(context, items) -> list:
    labels = context.source.arrays[1]
    return [int(labels[item]) for item in items]


CIFAR10 = SourceKind("cifar10", _raw_samples, key=numbered_key, labels=_labels)
