"""The synthetic kind: items are numbers; sample n is image n % 16 of a pool of random uint8 images,
label n % classes, deterministic from the seed."""

from __future__ import annotations

import functools

import numpy as np

from imagenet_shards.loader.payloads.tensor import ARRAY
from imagenet_shards.loader.source_kinds.base import SourceKind, fingerprint_start, numbered_key


def synthetic_pool(shape, seed: int, count: int = 16) -> np.ndarray:
    """A few random images that synthetic samples cycle through (generating per sample would
    measure numpy's random generator, not the loader)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(count, *shape), dtype=np.uint8)


@functools.lru_cache(maxsize=4)  # one pool per (shape, seed) in each process: made once, read-only after
def _pool(shape, seed: int) -> np.ndarray:
    pool = synthetic_pool(shape, seed)
    pool.setflags(write=False)  # shared by every context of this process
    return pool


def _raw_samples(context, items):
    source = context.source
    pool = _pool(tuple(source.synthetic_shape), context.seed)
    for item in items:
        yield item, "synthetic", item % source.synthetic_classes, pool[item % len(pool)], ARRAY.name, None


def _labels(context, items) -> list:
    return [int(item) % context.source.synthetic_classes for item in items]


def _fingerprint(source):
    digest = fingerprint_start(source.kind, source)
    digest.update(f"{tuple(source.synthetic_shape)}/{source.synthetic_classes}".encode())
    return digest


SYNTHETIC = SourceKind("synthetic", _raw_samples, key=numbered_key, labels=_labels, fingerprint=_fingerprint,
                       output_sized=True)
