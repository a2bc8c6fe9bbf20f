"""The synthetic kind: items are numbers; sample n is image n % 16 of a pool of random uint8 images,
label n % classes, deterministic from the seed."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from imagenet_shards.loader.payloads.tensor import ARRAY
from imagenet_shards.loader.source_kinds.base import SourceKind, fingerprint_start, numbered_key
from imagenet_shards.loader.source_kinds.source import Source

NAMES = ("synthetic", "generated")  # what a `source` argument says to name it (any case)
LENGTH = {"train": 1_281_167, "validation": 50_000}  # images per split by default: ImageNet's (other splits 50,000)


@dataclass(frozen=True)
class SyntheticSettings:
    """The synthetic kind's settings: the images' shape (HWC) and the class count labels cycle through."""

    shape: tuple = (224, 224, 3)
    classes: int = 1000


def _resolve(source, request):
    if not (isinstance(source, str) and source.lower() in NAMES):
        return None
    length = request.synthetic_length or LENGTH.get(request.split, 50_000)
    size = request.image_size
    return Source(SYNTHETIC.name, f"synthetic {request.split}: {length} images {size}x{size}", [list(range(length))],
                  "array", settings=SyntheticSettings(shape=(size, size, 3)))


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
    settings = context.source.settings
    pool = _pool(tuple(settings.shape), context.seed)
    for item in items:
        yield item, "synthetic", item % settings.classes, pool[item % len(pool)], ARRAY.name, None


def _labels(context, items) -> list:
    return [int(item) % context.source.settings.classes for item in items]


def _fingerprint(source):
    digest = fingerprint_start(source.kind, source)
    digest.update(f"{tuple(source.settings.shape)}/{source.settings.classes}".encode())
    return digest


SYNTHETIC = SourceKind("synthetic", _raw_samples, key=numbered_key, labels=_labels, fingerprint=_fingerprint,
                       output_sized=True, resolve=_resolve)
