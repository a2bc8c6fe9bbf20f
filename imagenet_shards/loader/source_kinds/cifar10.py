"""The cifar10 kind: items are row numbers into CIFAR-10's images and labels (imagenet_shards.cifar10), two
numpy arrays the main process reads once (its `resolve` hook) and forked workers share; each sample is
a 32x32 HWC uint8 array the runtime steps (crop, resize) then process."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from imagenet_shards.cifar10 import WHERE, CifarError, batches_folder, is_cifar_folder, load_split
from imagenet_shards.loader.payloads.tensor import ARRAY
from imagenet_shards.loader.source_kinds.base import SourceKind, numbered_key
from imagenet_shards.loader.source_kinds.source import Source


class Cifar10Arrays(NamedTuple):
    """The cifar10 kind's settings: the split's images (uint8 [N, 32, 32, 3]) and labels (int64 [N])."""

    images: object
    labels: object


def _resolve(source, request):
    """A folder holding cifar-10-batches-py/ (or the batches themselves), read by a restricted unpickler."""
    if isinstance(source, (list, tuple)) or not is_cifar_folder(Path(str(source))):
        return None
    path = Path(str(source))
    images, labels, names = load_split(path, request.split)
    return Source(CIFAR10.name, f"{path} (CIFAR-10 python batches, {request.split}: {len(labels):,} images "
                                f"{images.shape[2]}x{images.shape[1]})", [list(range(len(labels)))], "array",
                  classes=names, settings=Cifar10Arrays(images, labels))


def _raw_samples(context, items):
    images, labels = context.source.settings
    for item in items:
        yield item, "cifar10", int(labels[item]), images[item], ARRAY.name, None


def _labels(context, items) -> list:
    labels = context.source.settings.labels
    return [int(labels[item]) for item in items]


def _stored_bytes_per_image(source) -> float:
    """Raw pixels, as the batches store them (the host benchmark's bytes per image)."""
    return int(source.settings.images[0].nbytes) if len(source.settings.images) else 0


def _check_location(location) -> None:
    """The batches are in `location` (nothing is ever downloaded), or a CifarError saying where to put them."""
    if not location:
        raise CifarError(f"reads local files only (nothing is downloaded): {WHERE}")
    batches_folder(location)


CIFAR10 = SourceKind("cifar10", _raw_samples, key=numbered_key, labels=_labels, resolve=_resolve,
                     stored_bytes_per_image=_stored_bytes_per_image, check_location=_check_location)
