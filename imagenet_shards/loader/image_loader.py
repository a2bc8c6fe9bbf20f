"""The loader training code imports: `get_data(...)` -> an iterable of (images, labels) batches.

    from imagenet_shards.loader import get_data
    from imagenet_shards.normalization import NormalizeOnDevice

    train = get_data("/data/imagenet-wds", "train", batch_size=64, workers=8, normalization="device")
    model = NormalizeOnDevice(model)          # uint8 batches are normalised on the accelerator
    for epoch in range(epochs):
        train.set_epoch(epoch)
        for images, labels in train:          # images: uint8 NCHW (device) or float NCHW (host)
            ...
        print(train.report.summary())         # samples, skipped (with reasons), padded/dropped keys

Mid-epoch resume: `state_dict()` after a batch, `load_state_dict(state)` on restart (the same counts:
exactly the batches that followed; other counts: every rank's states, what was left dealt anew);
`write_ledger(path)` writes what this rank delivered. The arithmetic: loader/plan/resume.py, ledger_writer.py.

How the work is shared (imagenet_shards/loader/plan/share_plan.py has the rules and their proofs in tests):
  * every instance (poprun / torchrun / SLURM / OpenMPI process, see imagenet_shards/launcher.py) computes
    the same epoch order: shards permuted by (seed, epoch), samples in shard order;
  * instance i reads a contiguous range of it: "drop" (train default: floor(n/N) each), "pad"
    (ceil(n/N), repeating named samples) or "spread" (validation default: every sample exactly
    once, counts differ by at most 1). When distributed_webdataset.py made a repartition for this
    instance count, its manifest fixes each instance's samples instead;
  * inside an instance, DataLoader workers get contiguous runs of whole batches, so each reads
    sequential byte ranges and the instance's batch count does not depend on the worker count;
    fewer shards (or batches) than workers leaves workers idle;
  * last partial batch: dropped for train (`drop_last=True`, its keys are reported), kept for
    validation. Hence, for train, every instance yields exactly `len(loader)` batches.

Between epochs the workers do not wait: one DataLoader iteration spans every epoch, and a worker
that finished its share goes on into the next epoch (the one `for` without set_epoch asks for next)
while the training loop finishes this one. set_epoch to another epoch, a `break` midway or
load_state_dict throws that read-ahead away (imagenet_shards/loader/read/epoch_runs.py); read_ahead=False
makes each epoch an iteration of its own.

Batches are built inside the workers, written sample by sample into one preallocated uint8 tensor
(in shared memory, so handing it to the main process copies nothing: imagenet_shards/loader/output/batch_ring.py).
With host normalisation the worker converts it to float32/float16; with device normalisation it is
sent as it is. A worker reads its items through the source's kind (imagenet_shards/loader/source_kinds/:
indexed shards, image folder, synthetic) and writes each payload into its slot through the payload's
kind (imagenet_shards/loader/payloads/: encoded image, .npy, .pth, array); this module names neither.

Bad data: with on_error="skip" a sample that cannot be read or decoded is left out, counted and
listed (key, shard, reason) in `loader.report` at the end of the epoch. For train (policies drop
and pad) the equal-batches guarantee is kept by filling the gap with repeats of samples the same
worker read successfully (re-read and re-augmented), listed in `report.substituted`. For validation
("spread") nothing is substituted: each sample must count once, so the epoch is shorter. With
on_error="fail" the first bad sample raises SampleError naming the shard and the key.

Integrity: with verify=True (the default) every payload read through a sample index is checked
against the CRC32C the index records for it before it is decoded; a mismatch (a bit flipped at rest,
even one that still decodes) makes it a bad sample as above. Samples without a recorded CRC32C
(shards read without an index, an index of the earlier version that recorded sha256, image folders)
are not checked (validate_dataset.py checks those sha256).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import warnings
from typing import Optional

import torch
from torch.utils.data import DataLoader, IterableDataset

from imagenet_shards.formats.mapped_shards import release_payload
from imagenet_shards.index.compact import release_freed_memory
from imagenet_shards.launcher import Instance, detect_instance
from imagenet_shards.normalization import Normalization
from imagenet_shards.loader.plan.epoch_planner import EpochPlanner
from imagenet_shards.loader.plan.global_order import order_setting, per_rank_batch
from imagenet_shards.loader.options import Cache, DataSource, Order, transform_setting, with_keywords
from imagenet_shards.loader.read.epoch_runs import EpochRuns, RunFlags, discard, worker_messages
from imagenet_shards.loader.transform import jpeg_crop
from imagenet_shards.loader.read import worker_shards
from imagenet_shards.loader.output.batch_ring import BatchRing, RingMessage, labels_tensor
from imagenet_shards.loader.device.device_batches import NO_BUFFER, check_device_pipeline
from imagenet_shards.loader.device.device_decode import DeviceBatches, decode_device
from imagenet_shards.loader.read.read_loop import ReadLoop, SampleError
from imagenet_shards.loader.output.reports import Batch, EpochReport, Skipped, WorkerReport
from imagenet_shards.loader.plan.ledger_writer import write_ledger
from imagenet_shards.loader.plan.resume import (EpochProgress, Segment, identity as resume_identity,
                                                 load as resume_load, state as resume_state)
from imagenet_shards.loader.transform.pipeline import RANDOM_RESIZED_CROP, ImagePipeline
from imagenet_shards.loader.source_kinds import ReadContext, get_source_kind, keys_of as source_keys, resolve_source
from imagenet_shards.loader.settings import LoaderSettings
from imagenet_shards.loader.source_kinds.mix import mix_parts
from imagenet_shards.loader.transform.user_transforms import build_pipeline
from imagenet_shards.errors import UsageError
from imagenet_shards.shard_cache import open_cache, parse_size, warn_cache_problems

__all__ = ["ImageLoader", "ImageStream", "SampleError", "get_data"]

log = logging.getLogger(__name__)


class ImageStream(IterableDataset):
    """One instance's share of a split, as batches, for torch.utils.data.DataLoader(batch_size=None).

    Each worker yields its `RingMessage`s of an epoch and, last, its `WorkerReport`, epoch after
    epoch (`spans_epochs`); `ImageLoader` turns that into (images, labels) and an `EpochReport`.
    What it plans is the planner's (imagenet_shards/loader/plan/epoch_planner.py), how a worker reads is the
    read loop's (imagenet_shards/loader/read/read_loop.py), how the epochs follow each other epoch_runs.py's.
    """

    def __init__(self, planner: EpochPlanner, read_loop: ReadLoop):
        self.planner, self.read_loop = planner, read_loop
        self.ring = BatchRing(1, 3)  # ImageLoader gives it one sized for its workers
        self.byte_ring = BatchRing(1, 3)  # jpeg_decode="device": the workers' JPEG bytes (device_batches.py)
        # Where the workers start (generation, epoch; shared) and whether they go on into the next
        # epoch (ImageLoader's read_ahead): imagenet_shards/loader/read/epoch_runs.py.
        self.run_flags, self.spans_epochs = RunFlags(planner.epoch), False
        self.worker_table = None  # each worker's pid and shard, to name a worker's death (worker_shards.py)

    @property
    def pipeline(self) -> ImagePipeline:
        return self.read_loop.pipeline

    def __iter__(self):
        """The worker's messages, epoch after epoch: imagenet_shards/loader/read/epoch_runs.py."""
        return worker_messages(self)


class ImageLoader:
    """Iterable of (images, labels) for one instance; `len()` is the batches per epoch.

    Each `for` over it is one epoch. The epoch number is the one given to `set_epoch`, or else one
    more than the previous iteration's (so forgetting set_epoch does not repeat the same order).
    After an iteration, `report` holds that epoch's `EpochReport`.
    """

    def __init__(self, dataset: ImageStream, workers: int, with_keys: bool = False, pin_memory: bool = False,
                 prefetch_factor: Optional[int] = None, read_ahead: bool = True):
        self.dataset, self.workers, self.with_keys = dataset, workers, with_keys
        self.planner = dataset.planner
        self.pin_memory, self.prefetch_factor = pin_memory, prefetch_factor
        # Per worker: the batches in flight (prefetch), the one the training step holds, the one
        # being filled, and one spare; beyond that a worker allocates fresh buffers (still correct).
        dataset.ring = BatchRing(workers, (prefetch_factor or 2) + 3 if workers else 3)
        # jpeg_decode="device": byte buffers also wait in the decode thread's queue (DECODE_AHEAD)
        dataset.byte_ring = BatchRing(workers, ((prefetch_factor or 2) + 3 if workers else 3) + DECODE_AHEAD)
        self._device = None  # jpeg_decode="device": the main process's DeviceBatches, made at the first batch
        self.report: Optional[EpochReport] = None
        self._loader = None
        self._runs = None  # the DataLoader iteration kept across epochs (imagenet_shards/loader/read/epoch_runs.py)
        dataset.spans_epochs = self.read_ahead = read_ahead
        dataset.worker_table = worker_shards.shared_table(workers)
        self._progress: Optional[EpochProgress] = None  # the epoch being (or last) iterated: plan/resume.py
        self._identity = None
        self.source_argument = None  # what get_data was given, named in ledgers

    @property
    def instance(self) -> Instance:
        return self.planner.instance

    @property
    def epoch(self) -> int:
        return self.planner.epoch

    @property
    def classes(self) -> Optional[list]:
        """Class index -> class name (wnid) as the dataset records them, or None where it does not."""
        return self.planner.source.classes

    def set_epoch(self, epoch: int) -> None:
        self.planner.set_epoch(epoch)

    @property
    def batches_per_epoch(self) -> int:
        return self.planner.plan().batches

    @property
    def samples_per_epoch(self) -> int:
        plan = self.planner.plan()
        return min(len(plan.items), plan.batches * plan.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch

    # -- resume and ledger (the arithmetic: imagenet_shards/loader/plan/resume.py, ledger_writer.py)
    def _identity_and_segment(self):
        if self._identity is None:
            self._identity = resume_identity(self.planner)
        return self._identity, Segment(self.instance.count, max(self.workers, 1), self.planner.batch_size,
                                       self.dataset.read_loop.shuffle_buffer)

    def state_dict(self) -> dict:
        """Where this instance is in its epoch (torchdata's StatefulDataLoader convention): a JSON-able
        dict of a few hundred bytes, no sample list. Save it after each batch with the model."""
        identity, segment = self._identity_and_segment()
        live, index = self._progress, self.instance.index
        if live is not None and not live.complete:
            return resume_state(identity, live.epoch, live.resume, segment, index, live.progress())
        pending = self.planner.resume_for(self.epoch)  # loaded, not yet iterated
        if pending is not None:
            start = EpochProgress.starting(self.epoch, pending, index, segment.workers)
            return resume_state(identity, self.epoch, pending, segment, index, start.progress())
        return resume_state(identity, self.epoch, None, None, index, None)

    def load_state_dict(self, state) -> None:
        """Continue from `state_dict()`: this instance's own state (the same instance and worker
        counts, batch size: exactly the batches that followed), or the list of every instance's
        states (any instance or worker count: what was left, dealt anew). Sets the epoch. Raises
        ResumeError naming what differs (dataset, seed, split, policy...) or what is missing."""
        identity, segment = self._identity_and_segment()
        states = [state] if isinstance(state, dict) else list(state)
        resume = resume_load(states, identity, self.instance.index, segment)
        self.planner.set_epoch(int(states[0]["epoch"]))
        self.planner.load_resume(resume)
        self._progress = None
        self._loader = self._runs = None  # workers started before hold no resume: start new ones

    def write_ledger(self, path) -> dict:
        """Write (and return) the ledger of the epoch being or last iterated: the keys and labels
        each instance delivered, in order, per segment (the earlier ones of a resume included),
        derived from the plan and progress. `python -m imagenet_shards.ledger verify` checks a run's ledgers."""
        identity, segment = self._identity_and_segment()
        return write_ledger(path, self.planner, self.dataset.read_loop.context, self._progress, self.source_argument,
                            identity, segment)

    def _dataloader(self) -> DataLoader:
        options = {}
        if self.workers > 0:
            check_worker_tempdir()
            # Persistent workers: no process start-up when an iteration starts afresh (a new
            # generation after an error); the iteration itself spans epochs (EpochRuns).
            options = {"prefetch_factor": self.prefetch_factor or 2, "persistent_workers": True}
        # pin_memory is done by the ring (its buffers page-locked once): DataLoader's pin thread
        # would copy every batch, and the ring would then keep serving that stale copy.
        # collate_fn: the worker's message as it is (the batch is built); the default would walk
        # it (64 keys) and turn the labels into a tensor, sent through shared memory.
        release_freed_memory()  # the index's and the plan's freed heap pages, before the workers fork
        self._loader = DataLoader(self.dataset, batch_size=None, num_workers=self.workers, collate_fn=as_sent,
                                  **options)
        return self._loader

    def _batches_of(self, messages, ring, pin, report):
        """(message, Batch) in the workers' order; WorkerReports as (report, None). With
        jpeg_decode="device" each batch is assembled on the device in the decode thread, DECODE_AHEAD
        batches ahead of the one handed out (imagenet_shards/loader/device/device_decode.py)."""
        if not self.dataset.read_loop.device_decode:
            for item in messages:
                if isinstance(item, WorkerReport):
                    yield item, None
                    continue
                batch = Batch(ring.receive(item), labels_tensor(item), item.keys)
                if pin:  # the images came pinned (the ring's page-locked buffers)
                    batch = Batch(batch.images, batch.labels.pin_memory(), batch.keys)
                yield item, batch
            return
        pending = collections.deque()
        for item in messages:
            if isinstance(item, WorkerReport):
                yield item, None
                continue
            pending.append((item, self._submit(item, ring)))
            if len(pending) > DECODE_AHEAD:
                yield self._assembled(*pending.popleft(), report)
        while pending:
            yield self._assembled(*pending.popleft(), report)

    def _submit(self, message, ring):
        """Hand a worker's batch to the decode thread (its image and byte buffers received from the rings)."""
        if self._device is None:
            read_loop = self.dataset.read_loop
            self._device = DeviceBatches(read_loop.pipeline.size, decode_device(), read_loop.channels_last,
                                         read_loop.batch_transform)
        jpegs = message.jpegs
        buffer = None
        if jpegs.slot != NO_BUFFER:
            buffer = self.dataset.byte_ring.receive(
                RingMessage(message.worker, jpegs.slot, int(jpegs.offsets[-1]), jpegs.buffer, None, []))
        return self._device.submit(ring.receive(message), labels_tensor(message), message.keys, jpegs, buffer)

    def _assembled(self, message, future, report):
        """(message, Batch) of a batch the decode thread assembled; what it could not decode is reported."""
        result = future.result()
        report.device_host_decoded += message.jpegs.host_decoded
        for key, shard, reason in result.failed:
            if self.dataset.read_loop.on_error == "fail":
                raise SampleError(f"{shard}: sample {key!r}: {reason}")
            report.skipped.append(Skipped(key, shard, reason))
        images = result.images
        if images.is_cuda:  # made on the decode thread's stream, used on this one
            images.record_stream(torch.cuda.current_stream(images.device))
        return message, Batch(images, result.labels, result.keys)

    @property
    def device_decode_ms(self) -> list:
        """jpeg_decode="device": the decode thread's milliseconds per batch (decode, crop, resize; synchronised)."""
        return list(self._device.milliseconds) if self._device is not None else []

    def __iter__(self):
        dataset, planner = self.dataset, self.planner
        epoch = planner.epoch
        plan = planner.plan(epoch)
        keys_of = functools.partial(source_keys, dataset.read_loop.context)
        report = EpochReport(
            epoch, self.instance.index, self.instance.count, planner.split, planner.source.description,
            plan.policy, planner.manifest, self.samples_per_epoch, plan.batches,
            padded=keys_of(plan.padded), policy_dropped=keys_of(plan.policy_dropped),
            last_batch_dropped=keys_of(plan.last_batch_dropped),
        )
        self.report = report
        workers = max(self.workers, 1)
        live = self._progress = EpochProgress.starting(epoch, planner.resume_for(epoch), self.instance.index, workers)
        if self._runs is None:
            # discard holds the ring, not this loader: a cycle through the DataLoader iterator would
            # leave its shutdown to the garbage collector, which closes its queues first (5 s per worker)
            self._runs = EpochRuns(self._dataloader(), dataset.run_flags, self.workers,
                                   functools.partial(discard, dataset.ring), self.read_ahead)
        ring = dataset.ring
        ring.release_returned()
        pin = ring.pin = self.pin_memory and torch.cuda.is_available()  # the ring hands out pinned batches
        if self.pin_memory and not pin:
            log.info("pin_memory ignored: no CUDA device")
        dataset.byte_ring.pin = pin
        try:
            for item, batch in self._batches_of(self._runs.messages(epoch), ring, pin, report):
                if isinstance(item, WorkerReport):
                    report.add_worker(item)
                    continue
                live.handed_over(*item.progress, workers)
                item = None
                ring.release_returned()
                dataset.byte_ring.release_returned()
                report.batches += 1
                report.samples += len(batch.keys)
                yield batch if self.with_keys else (batch.images, batch.labels)
                batch = None
        except (RuntimeError, *worker_shards.PIPE_BROKEN) as error:
            columns = dataset.read_loop.context.columns
            died = worker_shards.death_of(error, dataset.worker_table, getattr(columns, "shard_names", None),
                                          planner.source.description)
            if died is None:
                raise
            raise died from None
        finally:
            planner.set_epoch(epoch + 1)
        report.complete = live.complete = True
        planner.end_resume()  # a loaded state applies to its epoch only
        if report.skipped and not report.samples:
            first = report.skipped[0]
            raise SampleError(f"{planner.source.description}: every sample of this instance's {planner.split} share "
                              f"failed ({len(report.skipped)}; first: {first.key} in {first.shard}: {first.reason})")
        if report.skipped:
            warnings.warn(f"{len(report.skipped)} samples skipped: {report.summary()}", stacklevel=2)
        warn_cache_problems(report.cache)
        log.info("%s", report.summary())


DECODE_AHEAD = 2  # jpeg_decode="device": batches submitted to the decode thread before the one handed out


def as_sent(message):
    """DataLoader's collate_fn: a worker's RingMessage or WorkerReport, unchanged."""
    return message


def get_data(source, split: str = "train", batch_size: Optional[int] = None, workers: int = 0, *,
             transform=None, batch_transform=None, normalization="host", order=None, cache=None,
             instance=None, seed: int = 0, epoch: int = 0, train: Optional[bool] = None, on_error: str = "skip",
             jpeg_decode: Optional[str] = None, with_keys: bool = False, pin_memory: bool = False,
             prefetch_factor: Optional[int] = None, read_ahead: bool = True, **earlier) -> ImageLoader:
    """Batches of one split for this instance. See the module docstring and README for the rules; the
    groups (DataSource, TrainCrop, ValidationCrop, UserTransform, Normalization, Cache, Order) and their
    fields are in imagenet_shards/loader/options.py.

    source          a DataSource, or its location alone: converted dataset dir or http(s) base URL; shard
                    paths/URLs (brace patterns ok); an ImageNet folder; "synthetic"; a Mix (loader/mix.py).
    split           "train" or "validation" (anything else is read like validation).
    transform       per sample: None (the split's recipe, TrainCrop() or ValidationCrop()), a recipe with
                    its own image_size/scale/ratio/resize_size/use_draft, or a torchvision v2 transform (a
                    leading RandomResizedCrop [+ flip] runs fused in the decoder; UserTransform(T, ...) for
                    its settings); see imagenet_shards/loader/transform/user_transforms.py.
    batch_transform per batch (MixUp/CutMix).
    normalization   "host" (float batches), "device"/"ipu" (uint8 NCHW; wrap the model in
                    imagenet_shards.normalization.NormalizeOnDevice), or a Normalization(location, dtype, mean, std,
                    channels_last).
    batch_size      samples per batch of this instance (default 64); under GlobalOrder(global_batch_size=G)
                    derived as G / the instance count (a batch_size given must equal it).
    order           None, "shards", "global", GlobalOrder(global_batch_size=G, partitions=P) or an Order(policy,
                    shuffle, drop_last, shuffle_buffer, sequence): who gets which samples when
                    (imagenet_shards/loader/plan/global_order.py).
    cache           None, a directory, or Cache(directory, limit, remote_paths, prefetch): docs/shard-cache.md.
    instance        a launcher.Instance or (index, count); default: detected from the launcher.
    train           the split's defaults (recipe, policy, shuffle, drop_last) are train's (default: split == "train").
    on_error        "skip" (count, report, substitute for train) or "fail" (SampleError).
    jpeg_decode     "crop" (decode only the JPEG region a crop needs), "pil" (whole images); default "crop" where
                    native/jpeg_crop is built, unless DATASETS_JPEG_DECODE=pil. "device": nvJPEG decodes on the
                    accelerator, batches are uint8 there (imagenet_shards/loader/device/device_decode.py).
    with_keys       yield Batch(images, labels, keys) instead of (images, labels).
    read_ahead      workers go on into the next epoch while this one is finished (one DataLoader iteration
                    across epochs); False: each epoch its own iteration, nothing read before it is asked for.
    earlier         the keywords of the earlier signature (image_size=, cache_dir=, dtype=, verify=, policy= ...):
                    mapped onto the groups with a DeprecationWarning naming the new form (options.with_keywords).
    """
    if instance is None or isinstance(instance, tuple):
        instance = detect_instance(*(instance or ()))
    train = (split == "train") if train is None else train
    groups = {"source": DataSource.of(source), "transform": transform_setting(transform, train),
              "normalization": Normalization.of(normalization), "cache": Cache.of(cache), "order": Order.of(order)}
    if earlier:
        groups = with_keywords(groups, earlier)
    # under GlobalOrder(global_batch_size=G): G / the instance count, or checked against it
    batch_size = per_rank_batch(order_setting(groups["order"].sequence), batch_size, instance.count)
    settings = LoaderSettings(**groups, split=split, batch_size=batch_size, instance=instance, seed=seed, epoch=epoch,
                              train=train, on_error=on_error, jpeg_decode=jpeg_decode,
                              batch_transform=batch_transform).checked()  # before anything is read
    dataset = build_stream(settings)
    loader = ImageLoader(dataset, workers, with_keys=with_keys, pin_memory=pin_memory,
                         prefetch_factor=prefetch_factor, read_ahead=read_ahead)
    location = settings.source.location  # named in ledgers
    loader.source_argument = str(location) if isinstance(location, (str, os.PathLike)) else None
    announce(loader, loader.planner.source, loader.dataset.pipeline)
    return loader


def build_stream(settings: LoaderSettings) -> ImageStream:
    """get_data's dataset from its checked settings (imagenet_shards/loader/settings.py)."""
    source, recipe, normalization, cache = settings.source, settings.transform, settings.normalization, settings.cache
    instance, seed, batch_size = settings.instance, settings.seed, settings.batch_size
    resolved = resolve_source(source.location, settings.split, instance.count, recipe.image_size or 224,
                              source.synthetic_length, seed, source.use_repartition, source.label_offset)
    if cache is not None:
        open_caches(resolved, cache)
    pipeline, notes, torch_random, batch_transform = build_pipeline(
        recipe, settings.batch_transform, settings.train, resolved.stored_steps,
        None if settings.device_decode else settings.jpeg_decode, get_source_kind(resolved.kind).output_sized)
    if settings.device_decode:
        check_device_pipeline(pipeline)  # what the device cannot run is refused now, not at the first batch
    say_pipeline_notes(resolved.description, pipeline, notes)
    planner = EpochPlanner(resolved, settings.split, instance, batch_size, policy=settings.policy, seed=seed,
                           epoch=settings.epoch, shuffle=settings.shuffle, drop_last=settings.drop_last,
                           use_repartition=source.use_repartition, order=settings.train_order())
    boxes = source.use_bbox_info and get_source_kind(resolved.kind).bboxes and RANDOM_RESIZED_CROP in pipeline.steps
    shuffle_buffer = settings.order.shuffle_buffer if settings.shuffle and planner.order is None else 0
    context = ReadContext(resolved, planner.columns, source.verify, boxes, seed, positions=planner.order is not None)
    read_loop = ReadLoop(context, pipeline, batch_size, instance.index, on_error=settings.on_error,
                         shuffle_buffer=shuffle_buffer, drop_last=settings.drop_last, normalization=normalization,
                         batch_transform=batch_transform, torch_random=torch_random,
                         device_decode=settings.device_decode)
    return ImageStream(planner, read_loop)


def open_caches(resolved, cache: Cache) -> None:
    """The node's shard cache for the source, or for each source of a Mix (each its own entries under the
    one directory, keyed by its dataset; the size limit, split evenly among a mix's sources)."""
    mix = mix_parts(resolved)
    parts = mix.parts if mix is not None else [resolved]
    limit = cache.limit
    if limit is not None and len(parts) > 1:
        limit = parse_size(limit) // len(parts)
    for part in parts:
        part.cache = open_cache(cache.directory, part.metadata, part.description, limit, cache.remote_paths,
                                cache.prefetch)


def announce(loader: ImageLoader, resolved, pipeline) -> None:
    """One log line: the instance, the source, the runtime steps (and those stored), the batches."""
    skipped_steps = resolved.stored_steps[:2 - len(pipeline.steps)] if len(pipeline.steps) < 2 else []
    log.info("%s; %s; runtime steps %s%s; %d batches of %d per epoch", loader.instance.describe(),
             resolved.description, " + ".join(pipeline.steps) or "none",
             f" (stored: {' + '.join(map(str, skipped_steps))})" if skipped_steps else "", len(loader),
             loader.planner.batch_size)


def say_pipeline_notes(description: str, pipeline, notes) -> None:
    """The pipeline's warnings (stored steps it redoes...), and once a process where JPEGs decode whole with PIL."""
    for note in notes:
        warnings.warn(f"{description}: {note}", stacklevel=4)  # get_data's caller
    if getattr(pipeline, "decode_path", None) == jpeg_crop.PIL_FULL:
        jpeg_crop.note_unavailable_once()  # one log line per process when _jpeg_crop is not built


class TempDirError(UsageError, OSError):
    """A temporary folder DataLoader workers cannot use: names it and the limit."""


UNIX_SOCKET_PATH = 108  # bytes of sun_path; a path that fills it fails (a clean-clone CI run hung at 108)
LISTENER_SUFFIX = len("/pymp-12345678/listener-12345678")


def check_worker_tempdir() -> None:
    """Workers hand batch buffers over (torch's file_descriptor sharing) through a Unix socket that
    multiprocessing makes in the temporary folder. Under a TMPDIR too long for a socket's path the
    worker's send fails in a background thread, the batch never arrives, and the loop waits for ever
    (found by benchmarks/soak.py under a long pytest tmp_path): refuse it at the start instead."""
    import tempfile

    import torch.multiprocessing

    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return
    folder = tempfile.gettempdir()
    if len(os.fsencode(folder)) + LISTENER_SUFFIX >= UNIX_SOCKET_PATH:
        raise TempDirError(f"the temporary folder {folder} (TMPDIR) is {len(os.fsencode(folder))} bytes long: "
                           f"DataLoader workers pass batches through a Unix socket under it, whose path must fit "
                           f"{UNIX_SOCKET_PATH} bytes; use a TMPDIR of at most {UNIX_SOCKET_PATH - LISTENER_SUFFIX - 1} "
                           f"bytes (or workers=0)")
