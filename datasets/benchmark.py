"""Measure how fast a pipeline feeds batches, and compare formats against the usual baselines.

The core is `measure_batches`: it pulls batches from any iterable of `(images, labels)`,
excludes warm-up batches, stops after a set number of batches or seconds (or at the end
of the data), and returns a plain dict of figures. Everything else builds iterables for
it (the project's loader, the stock baselines, the bare decode+augment loop) and turns
the dicts into a table, JSON and a bar chart.

What the figures mean, and how they are counted:

images/s        images in the measured batches / wall time from the end of warm-up to the
                arrival of the last measured batch.
per worker      images/s / max(1, DataLoader workers). The bare decode+augment row is one
                process, so its per-worker rate is its rate.
img/CPU-s       images / CPU seconds: "per core". CPU seconds = this process (all its
                threads, `time.process_time`) + every live descendant process (the
                DataLoader workers), read from /proc/<pid>/stat (utime + stime) after each
                batch. `resource.getrusage(RUSAGE_CHILDREN)` cannot do this: it only
                counts children that have exited and been waited for, and the workers are
                alive while they work. Workers are found by scanning /proc for processes
                whose parent chain leads here, once per new iterator (the DataLoader
                starts its workers in `iter()`). A worker's CPU is counted from its first
                sighting (or the start of the measurement) to its last sighting, so work
                on batches prefetched before the start and after the end of the
                measurement roughly cancels in steady state. Without /proc only this
                process is counted, and `cpu_scope` says so.
MB/s            images/s x the source's mean stored bytes per image: for shards, the
                split's shard bytes / samples from metadata.json (tar headers, .cls and
                .json members included: everything a reader fetches); for a folder, the
                mean file size. It is the read rate the storage (disk, NFS, HTTP) must
                sustain to keep up, whether or not the page cache served it here.
                Generated data reads nothing: 0.
latency p50/p99 time the consumer waits in `next()` for each measured batch, in ms.

Comparison rows (`run_comparison`), for a directory that holds the source folder and its
converted forms (layout: see `discover_sources`):

ceiling         bare decode + augment of the same JPEGs in this process, no loader: PIL
                open + decode + RandomResizedCrop + flip to a uint8 array (validation:
                Resize + CenterCrop). The upper bound per process for any JPEG format.
baselines       torchvision ImageFolder + DataLoader and the stock webdataset pipelines
                (`decode("pil")` for JPEG shards, `decode()` for .npy shards), with
                torchvision's standard ImageNet transforms (RandomResizedCrop, flip, ToTensor,
                Normalize), same batch size and workers. The .npy pipeline stays uint8, like
                the loader's device rows, and for train does the augmentation the stored
                tensors still need (v2 RandomResizedCrop + flip on the tensor), so both sides
                of the tensor comparison do the same work.
loader rows     every format found x each normalisation location, through `get_data`.

Goals (`GOALS`): "per worker" and "per core" are compared as images per CPU-second of all
processes involved, the rate of one worker that has a core to itself, which other programs
on a shared host do not distort; the wall-clock ratio is printed beside it. Compare ratios
from one run: rows are interleaved over `rounds` and the median round is reported.
torch runs one thread per process (as DataLoader workers do), set by the CLI.

Adding a format (e.g. tfrecord) is one `FORMATS` entry; a stock pipeline for it is one
`BASELINES` entry.
"""

from __future__ import annotations

import dataclasses
import gc
import io
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .index import METADATA_FILE, DatasetError, read_metadata
from .launcher import Instance

IMAGE_SIZE = 224
RESIZE_SIZE = 256
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
NORMALIZATIONS = ("host", "device")
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")
BARE_PRELOAD_LIMIT = 512  # images held in memory by the bare decode+augment loop (cycled)


class BenchmarkError(Exception):
    """A benchmark that cannot run as asked: the message names the directory, row or value."""


# ---------------------------------------------------------------- CPU time of this process and its workers

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
HAVE_PROC = Path("/proc/self/stat").exists()


def read_proc_stat(pid: int):
    """(parent pid, CPU seconds used so far) of a live process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after the last ")".
    rest = data[data.rindex(b")") + 2 :].split()
    # rest[0] is field 3 (state): ppid is field 4, utime field 14, stime field 15.
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / CLOCK_TICKS


def descendant_pids(root: int) -> list:
    """Every live process whose chain of parents leads to `root` (one scan of /proc)."""
    children = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        stat = read_proc_stat(int(name))
        if stat is not None:
            children.setdefault(stat[0], []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return sorted(found)


class CpuMeter:
    """CPU seconds of this process plus its live descendants since `start()` (see module doc)."""

    # Iterators may start their workers lazily (at the first next()), and an epoch boundary
    # replaces them: look for new processes after each epoch's first batch and at this period.
    REDISCOVER_SECONDS = 1.0  # a scan of /proc costs ~2 ms here

    def __init__(self):
        self._discovered_at = 0.0
        self.scope = "process and DataLoader workers (/proc)" if HAVE_PROC else "this process only (no /proc)"
        self._own_start = 0.0
        self._first = {}  # pid -> CPU seconds at first sighting (0 for pids born after start)
        self._last = {}  # pid -> CPU seconds at last sighting
        self._started = False

    def start(self) -> None:
        self._own_start = time.process_time()
        self._first, self._last = {}, {}
        self._started = True
        self.discover(born_before_start=True)

    def discover(self, born_before_start: bool = False) -> None:
        """Pick up new worker processes (call after a DataLoader iterator is created)."""
        self._discovered_at = time.perf_counter()
        if not HAVE_PROC:
            return
        for pid in descendant_pids(os.getpid()):
            if pid in self._first:
                continue
            stat = read_proc_stat(pid)
            if stat is None:
                continue
            # A worker seen at start() counts from that moment; one started later counts from birth.
            self._first[pid] = stat[1] if born_before_start or not self._started else 0.0
            self._last[pid] = stat[1]

    def sample(self) -> None:
        now = time.perf_counter()
        if now - self._discovered_at >= self.REDISCOVER_SECONDS:
            self.discover()
        for pid in self._first:
            stat = read_proc_stat(pid)
            if stat is not None:
                self._last[pid] = stat[1]

    def used(self) -> tuple:
        """(CPU seconds of this process, of its descendants, number of descendants counted) since start."""
        own = time.process_time() - self._own_start
        children = sum(self._last[pid] - self._first[pid] for pid in self._first)
        return own, children, len(self._first)


# ---------------------------------------------------------------- the measurement loop


class EpochBatches:
    """Iterate `make_iterable(epoch)` epoch after epoch, calling `on_new_iterator` at each epoch's first batch.

    The hook lets the CPU meter find the worker processes a DataLoader starts in `iter()`.
    `max_epochs` None repeats forever (the measurement stops by batches or seconds).
    """

    def __init__(self, make_iterable: Callable, max_epochs: int | None = 1, first_epoch: int = 0):
        self.make_iterable = make_iterable
        self.max_epochs = max_epochs
        self.first_epoch = first_epoch
        self.on_new_iterator = lambda: None
        self.epochs_started = 0

    def __iter__(self):
        epoch = self.first_epoch
        while self.max_epochs is None or epoch < self.first_epoch + self.max_epochs:
            iterator = iter(self.make_iterable(epoch))
            self.epochs_started += 1
            produced = False
            try:
                for batch in iterator:
                    if not produced:
                        # Workers exist by now even if iter() started them lazily.
                        self.on_new_iterator()
                    produced = True
                    yield batch
            finally:
                close_iterator(iterator)
            if not produced:
                return  # an empty epoch: repeating would loop forever
            epoch += 1


def close_iterator(iterator) -> None:
    """Stop an iterator's worker processes now, not whenever garbage collection gets to it.

    A DataLoader iterator left alive would be inherited by the next row's forked workers,
    whose exit then tries to shut down processes that are not theirs.
    """
    close = getattr(iterator, "close", None)  # generators (e.g. the project's loader)
    if close is not None:
        close()
    shutdown = getattr(iterator, "_shutdown_workers", None)  # torch DataLoader's multi-process iterator
    if shutdown is not None:
        shutdown()


def percentile_ms(values, q) -> float:
    return float(np.percentile(np.asarray(values), q) * 1000.0) if len(values) else float("nan")


def describe_batch(batch) -> tuple:
    """(dtype, shape) of a batch's images, as text; a list of arrays reads "uint8", "64x224x224x3 (list)"."""
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    if isinstance(images, list):
        first = images[0] if images else None
        dtype = str(getattr(first, "dtype", type(first).__name__))
        inner = "x".join(str(s) for s in getattr(first, "shape", ()))
        return dtype, f"{len(images)}x{inner} (list)" if inner else f"{len(images)} (list)"
    dtype = str(getattr(images, "dtype", type(images).__name__)).replace("torch.", "")
    shape = "x".join(str(s) for s in getattr(images, "shape", ()))
    return dtype, shape


def measure_batches(batches: Iterable, *, warmup_batches: int = 2, max_batches: int | None = None,
                    max_seconds: float | None = None, bytes_per_image: float = 0.0, workers: int = 0,
                    on_batch: Callable | None = None) -> dict:
    """Time `batches` (an iterable of `(images, labels)`); return the figures as a dict.

    Warm-up batches (worker start-up, first file opens) are pulled first and not counted.
    Then batches are counted until `max_batches`, `max_seconds` or the end of the data.
    An `EpochBatches` gets the CPU meter's discovery hook so new workers are counted.
    """
    if warmup_batches < 0:
        raise BenchmarkError(f"warm-up batches must be >= 0, got {warmup_batches}")
    meter = CpuMeter()
    if isinstance(batches, EpochBatches):
        batches.on_new_iterator = meter.discover
    iterator = iter(batches)
    try:
        return _measure(iterator, meter, warmup_batches, max_batches, max_seconds, bytes_per_image, workers,
                        on_batch)
    finally:
        close_iterator(iterator)


def _measure(iterator, meter, warmup_batches, max_batches, max_seconds, bytes_per_image, workers, on_batch):
    for number in range(warmup_batches):
        try:
            next(iterator)
        except StopIteration:
            raise BenchmarkError(
                f"the data ran out after {number} batches, during the {warmup_batches} warm-up batches: "
                f"use a smaller --batch-size or fewer --warmup-batches"
            ) from None
    meter.start()
    waits, images, count = [], 0, 0
    first_batch = None
    started = last = time.perf_counter()
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        arrived = time.perf_counter()
        meter.sample()
        waits.append(arrived - asked)
        images += len(batch[0])
        count += 1
        last = arrived
        if first_batch is None:
            first_batch = batch
        if on_batch is not None:
            on_batch(batch)
        if max_batches is not None and count >= max_batches:
            break
        if max_seconds is not None and arrived - started >= max_seconds:
            break
    if count == 0:
        raise BenchmarkError(
            f"no batch left to measure after {warmup_batches} warm-up batches: the data is too small "
            f"for this batch size; use a smaller --batch-size or fewer --warmup-batches"
        )
    seconds = last - started
    main_cpu, worker_cpu, processes = meter.used()
    dtype, shape = describe_batch(first_batch)
    return measurement_figures(
        images=images, batches=count, seconds=seconds, cpu_seconds=main_cpu + worker_cpu, waits=waits,
        bytes_per_image=bytes_per_image, workers=workers, warmup_batches=warmup_batches,
        batch_dtype=dtype, batch_shape=shape, cpu_scope=meter.scope, processes_counted=1 + processes,
        # Where the CPU went: the consuming process (receiving batches) vs the worker processes.
        main_cpu_ms_per_image=1000.0 * main_cpu / images, worker_cpu_ms_per_image=1000.0 * worker_cpu / images,
    )


def measurement_figures(*, images, batches, seconds, cpu_seconds, waits, bytes_per_image, workers, instances=1,
                        **extra) -> dict:
    seconds = max(seconds, 1e-9)
    rate = images / seconds
    return {
        "images": images,
        "batches": batches,
        "seconds": seconds,
        "images_per_s": rate,
        # workers=0 loads in the consuming process itself: one process does the work.
        "images_per_s_per_worker": rate / (max(1, workers) * instances),
        "workers": workers,
        "instances": instances,
        "cpu_seconds": cpu_seconds,
        "cpu_ms_per_image": 1000.0 * cpu_seconds / images,
        "images_per_cpu_s": images / cpu_seconds if cpu_seconds > 0 else float("nan"),
        "cores_busy": cpu_seconds / seconds,
        "bytes_per_image": bytes_per_image,
        "mb_per_s": rate * bytes_per_image / 1e6,
        "latency_ms_p50": percentile_ms(waits, 50),
        "latency_ms_p99": percentile_ms(waits, 99),
        "waits_s": list(waits),
        **extra,
    }


def combine_instances(per_instance: list) -> dict:
    """Aggregate over instances: total images / the slowest instance's time; CPU summed."""
    if len(per_instance) == 1:
        return dict(per_instance[0])
    first = per_instance[0]
    images = sum(m["images"] for m in per_instance)
    waits = [w for m in per_instance for w in m["waits_s"]]
    combined = measurement_figures(
        images=images,
        batches=sum(m["batches"] for m in per_instance),
        seconds=max(m["seconds"] for m in per_instance),
        cpu_seconds=sum(m["cpu_seconds"] for m in per_instance),
        waits=waits,
        bytes_per_image=first["bytes_per_image"],
        workers=first["workers"],
        instances=len(per_instance),
        **{k: first[k] for k in ("warmup_batches", "batch_dtype", "batch_shape", "cpu_scope") if k in first},
    )
    combined["processes_counted"] = sum(m.get("processes_counted", 1) for m in per_instance)
    for key in ("main_cpu_ms_per_image", "worker_cpu_ms_per_image"):
        if all(key in m for m in per_instance):
            combined[key] = sum(m[key] * m["images"] for m in per_instance) / images
    return combined


# ---------------------------------------------------------------- sources: folder, converted dirs, generated


@dataclass(frozen=True)
class FormatEntry:
    """One on-disk format the comparison knows: how to label it and what to compare it with."""

    name: str  # metadata.json "format" value, or "folder"
    payload: str  # "jpeg" or "tensor": JPEG formats are held against the bare decode+augment ceiling
    stock_baseline: str | None  # BASELINES key of the stock pipeline that reads the same data, if any
    description: str


FORMATS = {
    entry.name: entry
    for entry in (
        FormatEntry("folder", "jpeg", "imagefolder", "extracted ImageNet folder (train/<class>/*.JPEG)"),
        FormatEntry("img", "jpeg", "webdataset_pil", "WebDataset tar shards of JPEG"),
        FormatEntry("tensor", "tensor", "webdataset_npy", "WebDataset tar shards of uint8 .npy"),
        FormatEntry("tfrecord", "jpeg", "tfrecord_torch", "TFRecord shards of JPEG (tf.train.Example)"),
    )
}


@dataclass(frozen=True)
class Source:
    format: str
    path: Path
    shards: dict = field(default_factory=dict)  # split -> [shard paths] (converted formats)
    bytes_per_image: dict = field(default_factory=dict)  # split -> mean stored bytes per sample
    samples: dict = field(default_factory=dict)  # split -> samples
    metadata: dict | None = None
    name: str = ""  # row-id prefix: the format, or "format@directory" for a second source of one format

    @property
    def label(self) -> str:
        return self.format if self.name in ("", self.format) else f"{self.format} ({self.path.name})"


def list_folder_images(folder: Path) -> list:
    """(path, class index) for every image under `folder`/<class>/, classes in sorted order."""
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir())
    items = []
    for label, name in enumerate(classes):
        for path in sorted((folder / name).iterdir()):
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file():
                items.append((path, label))
    return items


def folder_split_dir(root: Path, split: str) -> Path | None:
    names = (split, "val") if split == "validation" else (split,)
    for name in names:
        if (root / name).is_dir():
            return root / name
    return None


def folder_source(root: Path) -> Source:
    samples, per_image = {}, {}
    for split in ("train", "validation"):
        split_dir = folder_split_dir(root, split)
        if split_dir is None:
            continue
        items = list_folder_images(split_dir)
        samples[split] = len(items)
        per_image[split] = (sum(p.stat().st_size for p, _ in items) / len(items)) if items else 0.0
    return Source("folder", root, {}, per_image, samples)


def converted_source(root: Path) -> Source:
    metadata = read_metadata(root)
    shards, per_image, samples = {}, {}, {}
    for split, info in metadata.get("splits", {}).items():
        records = info.get("shards", [])
        shards[split] = [root / s["name"] for s in records]
        count = sum(int(s["samples"]) for s in records)
        samples[split] = count
        per_image[split] = sum(int(s["bytes"]) for s in records) / count if count else 0.0
    return Source(str(metadata["format"]), root, shards, per_image, samples, metadata)


def is_image_folder(root: Path) -> bool:
    return any(folder_split_dir(root, split) is not None for split in ("train", "validation"))


def discover_sources(directory) -> list:
    """The sources in a comparison directory, in FORMATS order, then unknown formats by name.

    Layout (what `make demo` writes; names are free, detection is by content):
        DIR/source/    the extracted folder: train/<class>/*.JPEG, validation/<class>/*.JPEG
        DIR/img/       a converted dataset: metadata.json with "format": "img"
        DIR/tensor/    ... "format": "tensor"
        DIR/tfrecord/  ... "format": "tfrecord"
    DIR itself may also be the folder or a converted dataset.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise BenchmarkError(f"{directory}: not a directory (--compare expects the folder holding the source "
                             f"folder and its converted forms)")
    candidates = [directory] + sorted(p for p in directory.iterdir() if p.is_dir())
    found = []
    for path in candidates:
        if (path / METADATA_FILE).is_file():
            try:
                source = converted_source(path)
            except DatasetError as error:
                raise BenchmarkError(str(error)) from None
        elif is_image_folder(path):
            source = folder_source(path)
        else:
            continue
        found.append(source)
    if not found:
        raise BenchmarkError(
            f"{directory}: found no image folder (train/ or validation/ of class folders) and no converted "
            f"dataset ({METADATA_FILE}) in it or its subdirectories"
        )
    order = list(FORMATS)
    found.sort(key=lambda s: (order.index(s.format) if s.format in order else len(order), s.format))
    # The first source of a format (by directory name) carries the plain row ids the goals use;
    # further ones (another quality, other steps) get "format@directory".
    named, seen = [], set()
    for source in found:
        name = source.format if source.format not in seen else f"{source.format}@{source.path.name}"
        seen.add(source.format)
        named.append(dataclasses.replace(source, name=name))
    return named


# ---------------------------------------------------------------- pipelines: bare, baselines, loader


def standard_transform(split: str, size: int = IMAGE_SIZE, resize: int = RESIZE_SIZE, to_tensor: bool = True):
    """torchvision's standard ImageNet transforms (the baselines'); without ToTensor+Normalize if not to_tensor."""
    from .torchvision_cpu import transforms

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


def make_dataloader(dataset, batch_size, workers, *, shuffle=False, sampler=None, seed=0, drop_last=False):
    import torch
    from torch.utils.data import DataLoader

    generator = torch.Generator()
    generator.manual_seed(seed)
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=shuffle if sampler is None else False,
                      sampler=sampler, generator=generator, drop_last=drop_last)


def imagefolder_baseline(source: Source, split, batch_size, workers, instance, seed=0, **_):
    """torchvision ImageFolder + DataLoader with the standard transforms (float32, normalised on the host)."""
    from torch.utils.data.distributed import DistributedSampler

    from .torchvision_cpu import torchvision

    split_dir = folder_split_dir(source.path, split)
    if split_dir is None:
        raise BenchmarkError(f"{source.path}: no {split}/ folder for the ImageFolder baseline")
    dataset = torchvision.datasets.ImageFolder(str(split_dir), transform=standard_transform(split))

    def epoch_loader(epoch):
        sampler = None
        if instance.count > 1:
            sampler = DistributedSampler(dataset, num_replicas=instance.count, rank=instance.index,
                                         shuffle=split == "train", seed=seed)
            sampler.set_epoch(epoch)
        return make_dataloader(dataset, batch_size, workers, shuffle=split == "train", sampler=sampler,
                               seed=seed + epoch)

    return EpochBatches(epoch_loader, max_epochs=None)


def _webdataset_pipeline(shard_paths, instance):
    import webdataset as wds

    if not shard_paths:
        raise BenchmarkError("no shards for the stock webdataset baseline")
    # empty_check=False: stock webdataset refuses fewer shards than workers otherwise; the
    # node splitter only matters under a launcher (the stock default refuses several nodes).
    return wds.WebDataset(
        [str(p) for p in shard_paths], shardshuffle=False, empty_check=False,
        nodesplitter=wds.split_by_node if instance.count > 1 else wds.single_node_only,
    )


def webdataset_pil_baseline(source: Source, split, batch_size, workers, instance, seed=0, **_):
    """Stock webdataset: decode("pil") + the standard transforms + DataLoader."""
    transform = standard_transform(split)
    dataset = (_webdataset_pipeline(source.shards.get(split, []), instance)
               .decode("pil").to_tuple("jpg", "cls").map_tuple(transform, int))
    return EpochBatches(lambda epoch: make_dataloader(dataset, batch_size, workers, seed=seed + epoch),
                        max_epochs=None)


def stored_at_output_size(source: Source, split: str, size: int = IMAGE_SIZE) -> bool:
    """Whether the converter already cropped this split's tensors to the output size."""
    steps = (source.metadata or {}).get(f"{split}_transform_pipeline") or []
    return any(str(step).replace(" ", "") in (f"CenterCrop({size})", f"CenterCrop({size},{size})") for step in steps)


def tensor_transform(source: Source, split: str, size: int = IMAGE_SIZE, resize: int = RESIZE_SIZE):
    """torchvision (v2, on uint8 CHW tensors) doing what the train/validation pipeline must still do.

    train: RandomResizedCrop + flip, as for JPEGs (antialiased, like PIL's resampling);
    validation: nothing when the tensors are stored at the output size, else Resize + CenterCrop.
    None when nothing is left to do.
    """
    import torch

    from .torchvision_cpu import transforms_v2 as v2

    if split == "train":
        steps = [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
    elif stored_at_output_size(source, split, size):
        return None
    else:
        steps = [v2.Resize(resize, antialias=True), v2.CenterCrop(size)]
    return v2.Compose([lambda array: torch.from_numpy(array).permute(2, 0, 1), *steps])


def webdataset_npy_baseline(source: Source, split, batch_size, workers, instance, seed=0, **_):
    """Stock webdataset: decode() (np.load for .npy) + DataLoader, uint8 throughout.

    With the augmentation the split still needs (train: RandomResizedCrop + flip in torchvision
    v2 on the tensor), so that it does the same work as the loader's tensor rows.
    """
    dataset = _webdataset_pipeline(source.shards.get(split, []), instance).decode().to_tuple("npy", "cls")
    transform = tensor_transform(source, split)
    if transform is not None:
        dataset = dataset.map_tuple(transform, int)
    return EpochBatches(lambda epoch: make_dataloader(dataset, batch_size, workers, seed=seed + epoch),
                        max_epochs=None)


class TFRecordExampleTransform:
    """The stock TFRecord pipeline's per-record step: PIL decode + the standard transforms; label - offset."""

    def __init__(self, split: str, label_offset: int):
        self.transform = standard_transform(split)
        self.label_offset = label_offset

    def __call__(self, features):
        from PIL import Image

        image = Image.open(io.BytesIO(features["image/encoded"])).convert("RGB")
        return self.transform(image), int(features["image/class/label"][0]) - self.label_offset


def tfrecord_torch_baseline(source: Source, split, batch_size, workers, instance, seed=0, **_):
    """The tfrecord package's torch TFRecordDataset (one per shard, with its .tfindex, chained) + PIL decode
    + the standard transforms + DataLoader.

    With an index and DataLoader workers, the package gives each worker its slice of every shard;
    with no workers it starts each shard at a random record (and wraps around). It has no node
    splitting: instances take every Nth shard. Its reader checks no CRC (the project's does).
    """
    from tfrecord.torch.dataset import TFRecordDataset
    from torch.utils.data import ChainDataset

    from .tfrecord_format import tfrecord_index_path

    paths = source.shards.get(split, [])[instance.index :: instance.count]
    if not paths:
        raise BenchmarkError(f"{source.path}: no {split} shards for the stock tfrecord baseline")
    transform = TFRecordExampleTransform(split, int((source.metadata or {}).get("label_offset", 0)))
    description = {"image/encoded": "byte", "image/class/label": "int"}
    dataset = ChainDataset([TFRecordDataset(str(p), str(tfrecord_index_path(p)), description, transform=transform)
                            for p in paths])
    return EpochBatches(lambda epoch: make_dataloader(dataset, batch_size, workers, seed=seed + epoch),
                        max_epochs=None)


@dataclass(frozen=True)
class BaselineEntry:
    key: str
    reads: str  # the FORMATS name of the source it reads
    label: str
    build: Callable
    note: str


BASELINES = {
    entry.key: entry
    for entry in (
        BaselineEntry("imagefolder", "folder", "ImageFolder + DataLoader (baseline)", imagefolder_baseline,
                      "ImageFolder(transform=RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize)"),
        BaselineEntry("webdataset_pil", "img", "webdataset decode(\"pil\") (baseline)",
                      webdataset_pil_baseline,
                      'WebDataset(urls).decode("pil").to_tuple("jpg","cls").map_tuple(transform, int)'),
        BaselineEntry("webdataset_npy", "tensor", "webdataset .npy decode() (baseline)",
                      webdataset_npy_baseline,
                      'WebDataset(urls).decode().to_tuple("npy","cls"), + map_tuple(v2 RandomResizedCrop+flip, int) '
                      'for train; uint8 as stored'),
        BaselineEntry("tfrecord_torch", "tfrecord", "tfrecord TFRecordDataset + PIL (baseline)",
                      tfrecord_torch_baseline,
                      "tfrecord.torch.TFRecordDataset(shard, shard.tfindex) per shard, chained; PIL decode + "
                      "RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize"),
    )
}


def loader_batches(source, split, batch_size, workers, normalization, instance, seed=0, **options):
    """The project's loader (`datasets.loader.get_data`) as an epoch-repeating batch iterable.

    The loader is made once, outside the timing (resolving a source reads its metadata and
    sample index); each epoch is `set_epoch(n)` and a fresh iteration (new workers).
    """
    from .loader import get_data

    loader = get_data(str(source), split, batch_size, workers, normalization=normalization, instance=instance,
                      seed=seed, **options)

    def epoch_loader(epoch):
        loader.set_epoch(epoch)
        return loader

    return EpochBatches(epoch_loader, max_epochs=None)


# ---------------------------------------------------------------- the comparison


@dataclass
class RowPlan:
    id: str
    label: str
    kind: str  # "ceiling" | "baseline" | "loader"
    format: str
    normalization: str
    workers: int
    bytes_per_image: float
    source: str
    build: Callable  # () -> iterable of batches
    note: str = ""


def plan_rows(sources: list, split: str, batch_size: int, workers: int, instance, seed: int = 0,
              normalizations=NORMALIZATIONS, loader_options: dict | None = None) -> list:
    """The rows to measure, in display order: ceiling, then per format its stock baseline and its loader rows."""
    loader_options = loader_options or {}
    rows = []
    jpeg_folder = next((s for s in sources if s.format == "folder"), None)
    if jpeg_folder is not None and folder_split_dir(jpeg_folder.path, split) is not None:
        items = list_folder_images(folder_split_dir(jpeg_folder.path, split))
        share = items[instance.index :: instance.count]
        rows.append(RowPlan(
            "bare_decode_augment", "bare decode+augment, 1 process (ceiling)", "ceiling", "folder", "none", 0,
            jpeg_folder.bytes_per_image.get(split, 0.0), str(jpeg_folder.path),
            lambda share=share: bare_decode_augment(share, split, batch_size, seed),
            "PIL open+decode+" + ("RandomResizedCrop+flip" if split == "train" else "Resize+CenterCrop")
            + " to uint8 from in-memory bytes: the per-process ceiling for JPEG formats",
        ))
    for source in sources:
        entry = FORMATS.get(source.format)
        baseline = BASELINES.get(entry.stock_baseline) if entry and entry.stock_baseline else None
        if baseline is not None and source.name == source.format:  # once per format
            rows.append(RowPlan(
                f"baseline_{baseline.key}", baseline.label, "baseline", source.format, "host", workers,
                source.bytes_per_image.get(split, 0.0), str(source.path),
                lambda b=baseline, s=source: b.build(s, split, batch_size, workers, instance, seed=seed),
                baseline.note,
            ))
        for normalization in normalizations:
            rows.append(RowPlan(
                f"{source.name or source.format}/{normalization}", f"{source.label}, {normalization} normalisation",
                "loader",
                source.format, normalization, workers, source.bytes_per_image.get(split, 0.0), str(source.path),
                lambda s=source, n=normalization: loader_batches(s.path, split, batch_size, workers, n, instance,
                                                                 seed=seed, **loader_options),
                (entry.description if entry else f"format {source.format!r}") + " via datasets.loader.get_data",
            ))
    return rows


def run_comparison(rows: list, *, warmup_batches: int, max_batches=None, max_seconds=None, rounds: int = 1,
                   gather=None, progress=None) -> list:
    """Measure every row `rounds` times, interleaved (row order repeated), so drift hits all rows alike.

    `gather(figures) -> [figures per instance]` collects each instance's figures (identity
    when single). Returns one dict per row: its plan, per-round and per-instance figures,
    and the headline figures of the round with the median aggregate images/s.
    """
    gather = gather or (lambda figures: [figures])
    results = {row.id: [] for row in rows}
    for round_number in range(rounds):
        for row in rows:
            if progress:
                progress(f"round {round_number + 1}/{rounds}: {row.label}")
            try:
                figures = measure_batches(row.build(), warmup_batches=warmup_batches, max_batches=max_batches,
                                          max_seconds=max_seconds, bytes_per_image=row.bytes_per_image,
                                          workers=row.workers)
                error = None
            except Exception as exc:  # one broken row must not hide the others' figures
                figures, error = None, f"{type(exc).__name__}: {exc}"
            # Drop what a failed row's traceback still holds (DataLoader iterators) before the next forks.
            gc.collect()
            gathered = gather({"figures": figures, "error": error})
            errors = [g["error"] for g in gathered if g["error"]]
            if errors:
                results[row.id].append({"error": errors[0], "instances": None})
            else:
                per_instance = [g["figures"] for g in gathered]
                results[row.id].append({"instances": per_instance, "aggregate": combine_instances(per_instance)})
    return [row_result(row, results[row.id]) for row in rows]


def row_result(row: RowPlan, rounds: list) -> dict:
    result = {
        "id": row.id, "label": row.label, "kind": row.kind, "format": row.format,
        "normalization": row.normalization, "workers": row.workers, "source": row.source, "note": row.note,
    }
    good = [r for r in rounds if r.get("error") is None]
    if not good:
        result["error"] = rounds[0]["error"] if rounds else "not measured"
        return result
    good.sort(key=lambda r: r["aggregate"]["images_per_s"])
    median = good[len(good) // 2]
    headline = {k: v for k, v in median["aggregate"].items() if k != "waits_s"}
    result.update(headline)
    result["rounds_images_per_s"] = [r["aggregate"]["images_per_s"] for r in rounds if r.get("error") is None]
    result["instances"] = [{k: v for k, v in m.items() if k != "waits_s"} for m in median["instances"]]
    failed = [r["error"] for r in rounds if r.get("error")]
    if failed:
        result["failed_rounds"] = failed
    return result


# ---------------------------------------------------------------- goals


@dataclass(frozen=True)
class Goal:
    name: str
    row: str
    reference: str
    metric: str  # decides met / not met
    threshold: float
    text: str
    also: str  # a second ratio, printed for context


METRIC_UNITS = {"images_per_s": "img/s", "images_per_cpu_s": "img/CPU-s", "images_per_s_per_worker": "img/s/worker"}

# "Per worker" and "per core" are both measured as images per CPU-second of every process
# involved (main + workers): that is the rate of one worker that has a core to itself, and
# it does not depend on how many cores other programs on the host take meanwhile. The
# wall-clock per-worker ratio is printed beside it.
GOALS = (
    Goal("jpeg_vs_bare", "img/device|tfrecord/device|folder/device", "bare_decode_augment", "images_per_cpu_s", 0.90,
         "JPEG train pipeline (device normalisation) per worker >= 90% of bare decode+augment",
         "images_per_s_per_worker"),
    Goal("jpeg_vs_imagefolder", "img/device|tfrecord/device|folder/device", "baseline_imagefolder", "images_per_s", 1.40,
         "JPEG train pipeline (device normalisation) >= 1.4x torchvision ImageFolder (same workers)",
         "images_per_cpu_s"),
    Goal("tensor_vs_stock_npy", "tensor/device", "baseline_webdataset_npy", "images_per_cpu_s", 3.0,
         "tensor format (device normalisation) >= 3x stock webdataset .npy per core", "images_per_s"),
)


def evaluate_goals(results: list, split: str) -> list:
    by_id = {r["id"]: r for r in results}
    evaluated = []
    for goal in GOALS:
        # The first JPEG format present stands for "the JPEG pipeline" (img, else folder, ...).
        candidates = [r for r in goal.row.split("|") if r in by_id] or [goal.row.split("|")[0]]
        row, reference = by_id.get(candidates[0]), by_id.get(goal.reference)
        entry = {"goal": goal.name, "text": goal.text, "row": candidates[0], "reference": goal.reference,
                 "metric": goal.metric, "threshold": goal.threshold}
        if split != "train" and goal.name.startswith("jpeg"):
            entry.update(status="not measured", why="defined for the train pipeline (--split train)")
        elif row is None or reference is None or "error" in row or "error" in reference:
            missing = [name for name, r in ((candidates[0], row), (goal.reference, reference))
                       if r is None or "error" in r]
            entry.update(status="not measured", why=f"row(s) {', '.join(missing)} missing or failed")
        else:
            ratio = row[goal.metric] / reference[goal.metric]
            entry.update(value=row[goal.metric], reference_value=reference[goal.metric], ratio=ratio,
                         status="met" if ratio >= goal.threshold else "not met")
            if row.get(goal.also) and reference.get(goal.also):
                entry.update(also_metric=goal.also, also_ratio=row[goal.also] / reference[goal.also])
        evaluated.append(entry)
    return evaluated


# ---------------------------------------------------------------- output: table, JSON, chart


def _num(value, digits=0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


TABLE_COLUMNS = (
    ("row", 36, lambda r: r["label"]),
    ("img/s", 8, lambda r: _num(r.get("images_per_s"))),
    ("/worker", 8, lambda r: _num(r.get("images_per_s_per_worker"))),
    ("img/CPU-s", 9, lambda r: _num(r.get("images_per_cpu_s"))),
    ("CPU ms/img", 10, lambda r: _num(r.get("cpu_ms_per_image"), 2)),
    ("main ms", 7, lambda r: _num(r.get("main_cpu_ms_per_image"), 2)),
    ("MB/s", 7, lambda r: _num(r.get("mb_per_s"), 1)),
    ("p50 ms", 7, lambda r: _num(r.get("latency_ms_p50"), 1)),
    ("p99 ms", 7, lambda r: _num(r.get("latency_ms_p99"), 1)),
    ("batch", 0, lambda r: f"{r.get('batch_dtype', '')} {r.get('batch_shape', '')}".strip()),
)


def format_table(results: list) -> str:
    def line(cells):
        parts = []
        for (name, width, _), cell in zip(TABLE_COLUMNS, cells):
            parts.append(cell.ljust(width) if name in ("row", "batch") else cell.rjust(width))
        return "  ".join(parts).rstrip()

    lines = [line([c[0] for c in TABLE_COLUMNS]), line(["-" * max(c[1], 5) for c in TABLE_COLUMNS])]
    short = False
    for result in results:
        if "error" in result:
            lines.append(f"{result['label']:<36}  FAILED: {result['error']}")
            continue
        cells = [c[2](result) for c in TABLE_COLUMNS]
        if result["seconds"] < SHORT_MEASUREMENT_SECONDS:
            cells[0], short = cells[0] + " *", True
        lines.append(line(cells))
    if short:
        lines.append(SHORT_NOTE)
    return "\n".join(lines)


SHORT_MEASUREMENT_SECONDS = 1.0
SHORT_NOTE = (f"* measured for less than {SHORT_MEASUREMENT_SECONDS:g} s: CPU figures are coarse (the kernel counts "
              f"CPU in {1000 // CLOCK_TICKS} ms ticks per process) and prefetching skews them; measure longer")


def format_goals(goals: list) -> str:
    lines = []
    for goal in goals:
        if goal["status"] == "not measured":
            lines.append(f"  [not measured] {goal['text']}: {goal['why']}")
            continue
        unit = METRIC_UNITS.get(goal["metric"], goal["metric"])
        line = (f"  [{goal['status']}] {goal['text']}: {goal['row']} {goal['value']:,.0f} vs {goal['reference']} "
                f"{goal['reference_value']:,.0f} {unit} = {goal['ratio']:.2f}x (needs {goal['threshold']:.2f}x)")
        if "also_ratio" in goal:
            line += f"; by {METRIC_UNITS.get(goal['also_metric'], goal['also_metric'])}: {goal['also_ratio']:.2f}x"
        lines.append(line)
    return "\n".join(lines)


def format_instances(label: str, per_instance: list, aggregate: dict) -> str:
    """Each instance's figures and the aggregate, as rank 0 prints them."""
    lines = []
    for index, m in enumerate(per_instance):
        lines.append(
            f"{label} instance {index}: {m['images']} images in {m['seconds']:.2f} s = {m['images_per_s']:,.1f} img/s, "
            f"{m['images_per_cpu_s']:,.0f} img/CPU-s, p50 {m['latency_ms_p50']:.1f} ms, p99 {m['latency_ms_p99']:.1f} ms"
        )
    lines.append(
        f"{label} aggregate over {len(per_instance)} instance(s): {aggregate['images']} images / "
        f"{aggregate['seconds']:.2f} s (slowest instance) = {aggregate['images_per_s']:,.1f} img/s"
    )
    return "\n".join(lines)


def host_description() -> dict:
    import PIL
    import torch

    return {
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "hostname": platform.node(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pillow": PIL.__version__,
        "platform": platform.platform(),
    }


def cores_busy_now(seconds: float = 0.5) -> float | None:
    """How many cores the whole host keeps busy, sampled from /proc/stat over `seconds` (None without it)."""
    def busy_and_total():
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values) - idle, sum(values)

    try:
        busy0, total0 = busy_and_total()
        time.sleep(seconds)
        busy1, total1 = busy_and_total()
    except (OSError, ValueError, IndexError):
        return None
    cpus = os.cpu_count() or 1
    return cpus * (busy1 - busy0) / max(1, total1 - total0)


def busy_host_warning(usable_cpus: int | None = None, busy: float | None = None) -> str:
    """A warning when other programs already keep the CPUs busy (call before starting any worker)."""
    usable = usable_cpus or host_description()["usable_cpus"]
    if busy is None:
        if not hasattr(os, "getloadavg"):
            return ""
        busy, what = os.getloadavg()[0], "load average"
    else:
        what = "cores busy"
    if busy < 0.25 * usable:
        return ""
    return (f"other programs keep this host busy before the benchmark starts ({what} {busy:.1f} of {usable} CPUs): "
            f"wall-clock figures (img/s, per worker, latency) will be low and noisy; images per CPU-second hold "
            f"better")


def comparison_report(results, goals, config) -> dict:
    return {
        "kind": "host_benchmark comparison",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": host_description(),
        "config": config,
        "how_counted": {
            "images_per_s": "images in measured batches / wall time after warm-up; instances: total / slowest",
            "images_per_s_per_worker": "images_per_s / max(1, DataLoader workers x instances)",
            "images_per_cpu_s": "images / CPU seconds of the process and its live DataLoader workers (/proc/<pid>/stat)",
            "mb_per_s": "images_per_s x mean stored bytes per image of the source (shard bytes / samples; folder: file sizes)",
            "latency_ms": "time the consumer waits in next() per measured batch",
            "main_cpu_ms_per_image": "CPU of the consuming process alone (with workers: receiving batches)",
            "worker_cpu_ms_per_image": "CPU of the DataLoader worker processes",
        },
        "rows": results,
        "goals": goals,
    }


def write_json(path, report: dict) -> None:
    from .fileio import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(report, indent=1, allow_nan=False, default=_json_default) + "\n").encode())


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def sanitize_nan(obj):
    """JSON has no NaN: turn NaN into None throughout."""
    if isinstance(obj, float) and math.isnan(obj):
        return None
    if isinstance(obj, dict):
        return {k: sanitize_nan(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [sanitize_nan(v) for v in obj]
    return obj


GOAL_SHORT = {"jpeg_vs_bare": "vs bare per worker",
              "jpeg_vs_imagefolder": "vs ImageFolder",
              "tensor_vs_stock_npy": "vs stock .npy per core"}
KIND_COLOURS = {"ceiling": "#2e7d32", "baseline": "#9e9e9e"}
NORMALIZATION_COLOURS = {"host": "#1f77b4", "device": "#ff7f0e"}


def plot_comparison(path, results: list, config: dict, goals: list | None = None) -> None:
    """Two horizontal bar panels: images/s and images per CPU-second; baselines grey and hatched.

    The ceiling (bare decode+augment in one process) is a green bar, and on the images/s
    panel a dashed line at ceiling x workers: what a JPEG loader with no overhead of its
    own could reach. A failed row is listed with "failed" instead of a bar.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from .fileio import atomic_open

    if not results:
        raise BenchmarkError("no rows: nothing to plot")
    measured = [r for r in results if "error" not in r]
    if not measured:
        raise BenchmarkError("every row failed: nothing to plot")
    labels = [r["label"] for r in results]
    colours = [KIND_COLOURS.get(r["kind"]) or NORMALIZATION_COLOURS.get(r["normalization"], "#1f77b4") for r in results]
    height = 2.0 + 0.42 * len(results)
    figure, axes = plt.subplots(1, 2, figsize=(14, height), sharey=True, layout="constrained")
    positions = np.arange(len(results))[::-1]
    workers = int(config.get("workers", 0) or 0)
    panels = (
        ("images_per_s", "images per second (higher is better)",
         lambda r: f" {r['images_per_s']:,.0f}" + (f"  ({r['images_per_s_per_worker']:,.0f} per worker)"
                                                    if r["kind"] != "ceiling" and r["workers"] > 1 else "")),
        ("images_per_cpu_s", "images per CPU-second of all processes (per-core efficiency)",
         lambda r: f" {r['images_per_cpu_s']:,.0f}" if r.get("images_per_cpu_s") else " -"),
    )
    for axis, (metric, xlabel, text) in zip(axes, panels):
        values = [(r.get(metric) or 0.0) if "error" not in r else 0.0 for r in results]
        top = max(values) if max(values) > 0 else 1.0
        bars = axis.barh(positions, values, color=colours, edgecolor="#424242", linewidth=0.6, height=0.7)
        for bar, result, position, value in zip(bars, results, positions, values):
            if result["kind"] == "baseline":
                bar.set_hatch("//")
            label = " failed (see the table)" if "error" in result else text(result)
            axis.annotate(label.strip(), (value, position), xytext=(4, 0), textcoords="offset points", va="center",
                          ha="left", fontsize=8, color="#b71c1c" if "error" in result else "black",
                          bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85})
        axis.set_xlabel(xlabel)
        axis.set_xlim(0, top * 1.45)
        axis.grid(axis="x", linestyle=":", alpha=0.6)
        axis.set_axisbelow(True)
    ceiling = next((r for r in measured if r["kind"] == "ceiling"), None)
    if ceiling is not None:
        # The ceiling holds for JPEG rows only: mark it across those rows, not the tensor ones.
        scaled = ceiling["images_per_s"] * max(1, workers)
        jpeg_rows = [p for p, r in zip(positions, results)
                     if r["kind"] != "ceiling" and FORMATS.get(r["format"], FORMATS["img"]).payload == "jpeg"]
        for position in jpeg_rows:
            axes[0].vlines(scaled, position - 0.45, position + 0.45, color=KIND_COLOURS["ceiling"],
                           linestyle="--", linewidth=1.2)
        if jpeg_rows:
            axes[0].text(scaled, max(jpeg_rows) + 0.45, f" ceiling x {max(1, workers)} worker(s) = {scaled:,.0f}",
                         color=KIND_COLOURS["ceiling"], fontsize=8, va="bottom")
    for axis in axes:  # a thin rule between format groups
        for upper, lower, position in zip(results, results[1:], positions[1:]):
            if upper["format"] != lower["format"]:
                axis.axhline(position + 0.5, color="#bdbdbd", linewidth=0.8)
    axes[0].set_yticks(positions, labels)
    axes[0].set_ylim(-0.6, len(results) - 0.1)
    legend = [Patch(facecolor=KIND_COLOURS["ceiling"], label="bare decode+augment, 1 process (ceiling for JPEG)"),
              Patch(facecolor=KIND_COLOURS["baseline"], hatch="//", edgecolor="#424242", label="baseline (stock pipeline)"),
              Patch(facecolor=NORMALIZATION_COLOURS["host"], label="this loader, host normalisation (float batches)"),
              Patch(facecolor=NORMALIZATION_COLOURS["device"], label="this loader, device normalisation (uint8 batches)")]
    figure.legend(handles=legend, loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    instances = int(config.get("instances", 1) or 1)
    title = (f"Host data loading, {config.get('split')} split: batch {config.get('batch_size')}, {workers} DataLoader "
             f"worker(s)" + (f" x {instances} instances" if instances > 1 else "")
             + f", {config.get('cpus')} CPUs ({config.get('created', '')})")
    measured_goals = [g for g in goals or () if g["status"] != "not measured"]
    if measured_goals:
        title += "\n" + "   ".join(f"{g['row']} {GOAL_SHORT.get(g['goal'], g['goal'])}: {g['ratio']:.2f}x "
                                   f"(goal {g['threshold']:.2g}x, {g['status']})" for g in measured_goals)
    figure.suptitle(title, fontsize=10)
    with atomic_open(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=110)
    plt.close(figure)


# ---------------------------------------------------------------- distributed: gather figures to rank 0


class Collective:
    """Gathers each instance's figures (torch.distributed gloo); a no-op for a single instance."""

    def __init__(self, instance, init_method: str | None = None):
        self.instance = instance
        self.dist = None
        self.owns_group = False
        self.warning = ""
        if instance.count <= 1:
            return
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.dist = dist
            return
        if init_method is None and not ("MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ):
            self.warning = (f"{instance.describe()}: no MASTER_ADDR/MASTER_PORT and no --rendezvous: each instance "
                            f"reports only its own figures (no aggregate)")
            return
        dist.init_process_group("gloo", init_method=init_method or "env://", rank=instance.index,
                                world_size=instance.count)
        self.dist = dist
        self.owns_group = True

    @property
    def is_reporter(self) -> bool:
        """Whether this instance prints: rank 0, or every instance when figures cannot be gathered."""
        return self.dist is None or self.instance.index == 0

    def gather(self, obj) -> list:
        if self.dist is None:
            return [obj]
        gathered = [None] * self.instance.count
        self.dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        if self.dist is not None:
            self.dist.barrier()

    def close(self) -> None:
        if self.owns_group:
            self.dist.destroy_process_group()
            self.owns_group = False


# ---------------------------------------------------------------- one source, several iterations


def source_bytes_per_image(kind: str, path, split: str) -> float:
    """Mean stored bytes per image of the source `--data` names (0 for generated data)."""
    if kind == "generated" or path is None:
        return 0.0
    path = Path(path)
    if (path / METADATA_FILE).is_file():
        return converted_source(path).bytes_per_image.get(split, 0.0)
    if is_image_folder(path):
        return folder_source(path).bytes_per_image.get(split, 0.0)
    return 0.0  # URLs or a list of shards: not counted (reported as 0)


def run_iterations(make_epoch: Callable, *, iterations: int, warmup_batches: int, max_batches=None,
                   max_seconds=None, bytes_per_image=0.0, workers=0, collective: Collective | None = None,
                   on_iteration: Callable | None = None) -> list:
    """Measure `iterations` times; each starts a fresh iterator (new workers), as an epoch does.

    Without a batch or time limit an iteration is one whole epoch (the reference harness's
    behaviour). Returns per iteration {"instances": [...], "aggregate": {...}}.
    """
    collective = collective or Collective(Instance(0, 1, "single"))
    limited = max_batches is not None or max_seconds is not None
    results = []
    next_epoch = 0  # iteration n continues where n-1 stopped, so each sees a new shuffle
    for iteration in range(iterations):
        batches = EpochBatches(make_epoch, max_epochs=None if limited else 1, first_epoch=next_epoch)
        collective.barrier()
        try:
            figures, error = measure_batches(batches, warmup_batches=warmup_batches, max_batches=max_batches,
                                             max_seconds=max_seconds, bytes_per_image=bytes_per_image,
                                             workers=workers), None
        except Exception as exc:  # gathered first, so no instance waits forever for a failed one
            figures, error = None, f"{type(exc).__name__}: {exc}"
        next_epoch += max(1, batches.epochs_started)
        gathered = collective.gather({"figures": figures, "error": error, "index": collective.instance.index})
        failed = [f"instance {g['index']}: {g['error']}" for g in gathered if g["error"]]
        if failed:
            raise BenchmarkError("; ".join(failed))
        per_instance = [g["figures"] for g in gathered]
        result = {"iteration": iteration + 1, "instances": per_instance, "aggregate": combine_instances(per_instance)}
        results.append(result)
        if on_iteration is not None:
            on_iteration(result)
    return results
