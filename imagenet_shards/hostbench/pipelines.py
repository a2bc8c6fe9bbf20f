"""What the host benchmark times: the bare decode+augment loop, the stock baselines, and the project's loader.

Each builder returns an iterable of `(images, labels)` batches for `timing.measure_batches`.

ceiling         bare decode + augment of the same JPEGs in this process, no loader: PIL
                open + decode + RandomResizedCrop + flip to a uint8 array (validation:
                Resize + CenterCrop). The upper bound per process for any JPEG format.
floors          the loader's own per-sample work on the same JPEGs in this process, no loader:
                `ImagePipeline.image_into` (native decode + resize + flip for train, decode +
                resize for validation, or the PIL path for "pil") straight into a uint8 NCHW
                batch, in a tight loop. A loader row over its floor is the loader's own
                overhead: reading, index, CRC32C, batching, IPC.
baselines       torchvision ImageFolder + DataLoader and the stock webdataset pipelines
                (`decode("pil")` for JPEG shards, `decode()` for .npy shards), with
                torchvision's standard ImageNet transforms (RandomResizedCrop, flip, ToTensor,
                Normalize), same batch size and workers. The .npy pipeline stays uint8, like
                the loader's device rows, and for train does the augmentation the stored
                tensors still need (v2 RandomResizedCrop + flip on the tensor), so both sides
                of the tensor comparison do the same work.
loader rows     every format found x each normalisation location, through `get_data`.

A format's stock pipeline comes from imagenet_shards.hostbench.stock_baselines (keyed by format name);
BASELINES adds the ImageFolder one.
"""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from imagenet_shards.normalization import IMAGENET_MEAN, IMAGENET_STD
from imagenet_shards.preprocess import output_size, parse_stored_steps
from imagenet_shards.hostbench.timing import BenchmarkError, EpochBatches, close_iterator
from imagenet_shards.hostbench.discovery import BenchmarkSource, folder_split_dir
from imagenet_shards.hostbench.stock_baselines import STOCK_BASELINES

IMAGE_SIZE = 224
RESIZE_SIZE = 256
BARE_PRELOAD_LIMIT = 512  # images held in memory by the bare decode+augment loop (cycled)


def validation_resize(size: int) -> int:
    """The validation Resize for an output side: 256/224 of it, as the loader's default."""
    return int(round(size * RESIZE_SIZE / IMAGE_SIZE))


def standard_transform(split: str, size: int = IMAGE_SIZE, resize: int = RESIZE_SIZE, to_tensor: bool = True):
    """torchvision's standard ImageNet transforms (the baselines'); without ToTensor+Normalize if not to_tensor."""
    from imagenet_shards.torchvision_cpu import transforms

    if split == "train":
        steps = [transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip()]
    else:
        steps = [transforms.Resize(resize), transforms.CenterCrop(size)]
    if to_tensor:
        steps += [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return transforms.Compose(steps)


def bare_decode_augment(paths_and_labels, split: str, batch_size: int, seed: int = 0,
                        size: int = IMAGE_SIZE, resize: int = RESIZE_SIZE):
    """Endless batches (lists of uint8 HWC arrays) from PIL decode + augment of in-memory JPEG bytes.

    No loader, no worker, no file reads in the loop: the bytes are read once up front (at
    most BARE_PRELOAD_LIMIT images, cycled), so the rate is decode + augment alone.
    """
    from PIL import Image

    import torch

    if not paths_and_labels:
        raise BenchmarkError("no images for the bare decode+augment loop")
    torch.manual_seed(seed)  # RandomResizedCrop draws from torch's generator
    rng = np.random.default_rng(seed)
    chosen = rng.permutation(len(paths_and_labels))[:BARE_PRELOAD_LIMIT]
    held = [(Path(paths_and_labels[i][0]).read_bytes(), paths_and_labels[i][1]) for i in chosen]
    augment = standard_transform(split, size, resize, to_tensor=False)

    def batches():
        position = 0
        while True:
            images, labels = [], []
            for _ in range(batch_size):
                data, label = held[position % len(held)]
                position += 1
                with Image.open(io.BytesIO(data)) as image:
                    images.append(np.asarray(augment(image.convert("RGB"))))
                labels.append(label)
            yield images, labels

    return batches()


def floor_batches(paths_and_labels, split: str, batch_size: int, seed: int = 0, size: int = IMAGE_SIZE,
                  resize: int = RESIZE_SIZE, decode: str | None = None, buffers: int = 1):
    """Endless (uint8 NCHW images, labels) batches of `ImagePipeline.image_into` on in-memory JPEG bytes.

    The loader's per-sample work and nothing else: the bytes are read once up front (at most
    BARE_PRELOAD_LIMIT images, cycled), one batch tensor is reused, no worker, no index, no
    checksum. `decode`: the JPEG decode path ("crop" or "pil"; None: the loader's default).
    `buffers` > 1: the batches are written into that many tensors in turn, as the loader's ring
    does (a diagnostic: one reused 9.6 MB batch can stay in a 32 MB L3 cache, ten cannot).
    """
    import random

    import torch

    from imagenet_shards.loader.transform import ImagePipeline

    if not paths_and_labels:
        raise BenchmarkError("no images for the floor loop")
    pipeline, _ = ImagePipeline.build(split == "train", size, resize, decode_path=decode)
    chosen = np.random.default_rng(seed).permutation(len(paths_and_labels))[:BARE_PRELOAD_LIMIT]
    held = [(Path(paths_and_labels[i][0]).read_bytes(), paths_and_labels[i][1]) for i in chosen]
    rng = random.Random(seed)
    ring = [torch.empty((batch_size, 3, size, size), dtype=torch.uint8) for _ in range(max(1, buffers))]
    ring_slots = [images.numpy().transpose(0, 2, 3, 1) for images in ring]  # HWC views of the CHW slots

    def batches():
        position = 0
        for turn in itertools.count():
            images, slots = ring[turn % len(ring)], ring_slots[turn % len(ring)]
            labels = []
            for slot in slots:
                data, label = held[position % len(held)]
                position += 1
                pipeline.image_into(data, slot, rng)
                labels.append(label)
            yield images, torch.tensor(labels)

    return batches()


def make_dataloader(dataset, batch_size, workers, *, shuffle=False, sampler=None, seed=0, drop_last=False):
    import torch
    from torch.utils.data import DataLoader

    generator = torch.Generator()
    generator.manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=shuffle if sampler is None else False,
                      sampler=sampler, generator=generator, drop_last=drop_last)


def imagefolder_baseline(source: BenchmarkSource, split, batch_size, workers, instance, seed=0, size=IMAGE_SIZE, **_):
    """torchvision ImageFolder + DataLoader with the standard transforms (float32, normalised on the host)."""
    from torch.utils.data.distributed import DistributedSampler

    from imagenet_shards.torchvision_cpu import torchvision

    split_dir = folder_split_dir(source.path, split)
    if split_dir is None:
        raise BenchmarkError(f"{source.path}: no {split}/ folder for the ImageFolder baseline")
    dataset = torchvision.datasets.ImageFolder(str(split_dir), transform=standard_transform(split, size, validation_resize(size)))

    def epoch_loader(epoch):
        sampler = None
        if instance.count > 1:
            sampler = DistributedSampler(dataset, num_replicas=instance.count, rank=instance.index,
                                         shuffle=split == "train", seed=seed)
            sampler.set_epoch(epoch)
        return make_dataloader(dataset, batch_size, workers, shuffle=split == "train", sampler=sampler,
                               seed=seed + epoch)

    return EpochBatches(epoch_loader, max_epochs=None)


def stored_at_output_size(source: BenchmarkSource, split: str, size: int = IMAGE_SIZE) -> bool:
    """Whether the converter already cropped this split's tensors to the output size."""
    steps = parse_stored_steps((source.metadata or {}).get(f"{split}_transform_pipeline"))
    return output_size(steps) == (size, size)


def tensor_transform(source: BenchmarkSource, split: str, size: int = IMAGE_SIZE, resize: int = RESIZE_SIZE):
    """torchvision (v2, on uint8 CHW tensors) doing what the train/validation pipeline must still do.

    train: RandomResizedCrop + flip, as for JPEGs (antialiased, like PIL's resampling);
    validation: nothing when the tensors are stored at the output size, else Resize + CenterCrop.
    None when nothing is left to do.
    """
    import torch

    from imagenet_shards.torchvision_cpu import transforms_v2 as v2

    if split == "train":
        steps = [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
    elif stored_at_output_size(source, split, size):
        return None
    else:
        steps = [v2.Resize(resize, antialias=True), v2.CenterCrop(size)]
    return v2.Compose([lambda array: torch.from_numpy(array).permute(2, 0, 1), *steps])


def stock_baseline_batches(format_name, source: BenchmarkSource, split, batch_size, workers, instance, seed=0,
                           size=IMAGE_SIZE, **_):
    """A format's stock pipeline (STOCK_BASELINES[format_name]) + DataLoader, with the standard
    transforms (PIL input) or the tensor transform (uint8 arrays), at output `size`."""
    baseline = STOCK_BASELINES[format_name]
    shards = source.shards.get(split, [])
    if not shards:
        raise BenchmarkError(f"{source.path}: no {split} shards for the stock {format_name} baseline")
    if baseline.tensor_input:
        transform = tensor_transform(source, split, size, validation_resize(size))
    else:
        transform = standard_transform(split, size, validation_resize(size))
    try:
        dataset = baseline.build(shards, transform, instance, source.metadata)
    except ValueError as error:
        raise BenchmarkError(f"{source.path}: {error}") from None
    return EpochBatches(lambda epoch: make_dataloader(dataset, batch_size, workers, seed=seed + epoch),
                        max_epochs=None)


@dataclass(frozen=True)
class BaselineEntry:
    key: str
    reads: str  # the format name (imagenet_shards.formats.FORMATS, or "folder") of the source it reads
    label: str
    build: Callable
    note: str


BASELINES = {
    "imagefolder": BaselineEntry(
        "imagefolder", "folder", "ImageFolder + DataLoader (baseline)", imagefolder_baseline,
        "ImageFolder(transform=RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize)"),
    **{stock.key: BaselineEntry(stock.key, name, stock.label, partial(stock_baseline_batches, name), stock.description)
       for name, stock in STOCK_BASELINES.items()},
}


def loader_batches(source, split, batch_size, workers, normalization, instance, seed=0, rebatch_size=None,
                   image_size=None, verify=True, use_bbox_info=False, transform=None, **options):
    """The project's loader (`imagenet_shards.loader.get_data`) as an epoch-repeating batch iterable.

    The loader is made once, outside the timing (resolving a source reads its metadata and
    sample index); each epoch is `set_epoch(n)` and a fresh iteration (new workers).
    `source` may be a list of shard paths. `rebatch_size` (the reference's
    --dataloader-rebatch-size): workers build batches of that size, which the main process
    joins into `batch_size` batches (less memory held per worker batch). A row's `image_size`,
    `verify` and `use_bbox_info` go into get_data's groups (`row_transform`, DataSource); the other
    `options` are get_data's own (cache=Cache(...), jpeg_decode, order, read_ahead...).
    """
    from imagenet_shards.loader import DataSource, get_data

    worker_batch = rebatch_size or batch_size
    source = DataSource(source if isinstance(source, list) else str(source), verify=verify,
                        use_bbox_info=use_bbox_info)
    loader = get_data(source, split, worker_batch, workers, normalization=normalization, instance=instance, seed=seed,
                      transform=row_transform(split, image_size, transform), **options)

    def epoch_loader(epoch):
        loader.set_epoch(epoch)
        return loader if worker_batch == batch_size else Rebatched(loader, batch_size)

    batches = EpochBatches(epoch_loader, max_epochs=None)
    batches.loader = loader  # its figures after the run (device_decode_ms)
    return batches


def row_transform(split: str, image_size, transform=None):
    """get_data's transform for a row: the split's recipe at `image_size`, or the user `transform` (checked
    against `image_size` when given); None: the split's recipe at its default size."""
    from imagenet_shards.loader import TrainCrop, UserTransform, ValidationCrop

    if transform is not None:
        return transform if image_size is None else UserTransform(transform, image_size=image_size)
    if image_size is None:
        return None
    return TrainCrop(image_size=image_size) if split == "train" else ValidationCrop(image_size=image_size)


AUGMENTATIONS = {
    "tv-rrc-flip": "torchvision v2 RandomResizedCrop + flip as a user transform (fused in the decoder)",
    "strong": "strong augmentation: RandomResizedCrop + flip (fused) + TrivialAugmentWide + RandomErasing",
    "strong-mix": "strong augmentation + MixUp/CutMix per batch (in the worker)",
}


def augmented_loader_batches(source, split, batch_size, workers, normalization, instance, recipe, seed=0,
                             image_size=IMAGE_SIZE, **options):
    """`loader_batches` with a user transform recipe (AUGMENTATIONS) passed to get_data."""
    from imagenet_shards.loader import mixup_cutmix, strong_augmentation
    from imagenet_shards.torchvision_cpu import transforms_v2 as v2

    if recipe == "tv-rrc-flip":
        options["transform"] = v2.Compose([v2.RandomResizedCrop(image_size), v2.RandomHorizontalFlip()])
    else:
        options["transform"] = strong_augmentation(image_size)
    if recipe == "strong-mix":  # MixUp/CutMix need the class count the dataset records
        classes = loader_batches(source, split, batch_size, 0, normalization, instance, seed=seed,
                                 image_size=image_size, **{k: v for k, v in options.items() if k != "transform"}
                                 ).loader.classes
        options["batch_transform"] = mixup_cutmix(len(classes) if classes else 1000)
    return loader_batches(source, split, batch_size, workers, normalization, instance, seed=seed, **options)


class Rebatched:
    """Batches of `batch_size` joined from a loader's smaller (images, labels) batches; a last
    incomplete batch is dropped, as the reference's rebatching does for training."""

    def __init__(self, loader, batch_size: int):
        self.loader = loader
        self.batch_size = batch_size

    def __iter__(self):
        import torch

        iterator = iter(self.loader)
        images, labels, count = [], [], 0
        try:
            for batch_images, batch_labels in iterator:
                images.append(batch_images)
                labels.append(batch_labels)
                count += len(batch_labels)
                while count >= self.batch_size:
                    joined_images, joined_labels = torch.cat(images), torch.cat(labels)
                    yield joined_images[:self.batch_size], joined_labels[:self.batch_size]
                    images, labels = [joined_images[self.batch_size:]], [joined_labels[self.batch_size:]]
                    count -= self.batch_size
        finally:
            close_iterator(iterator)
