"""The loader training code imports: `get_data(...)` -> an iterable of (images, labels) batches.

    from datasets.loader import get_data
    from datasets.normalization import NormalizeOnDevice

    train = get_data("/data/imagenet-wds", "train", batch_size=64, workers=8, normalization="device")
    model = NormalizeOnDevice(model)          # uint8 batches are normalised on the accelerator
    for epoch in range(epochs):
        train.set_epoch(epoch)
        for images, labels in train:          # images: uint8 NCHW (device) or float NCHW (host)
            ...
        print(train.report.summary())         # samples, skipped (with reasons), padded/dropped keys

Mid-epoch resume: `state_dict()` after a batch, `load_state_dict(state)` on restart (the same counts:
exactly the batches that followed; other counts: every rank's states, what was left dealt anew);
`write_ledger(path)` writes what this rank delivered. The arithmetic: datasets/loader/resume.py.

How the work is shared (datasets/loader/share_plan.py has the rules and their proofs in tests):
  * every instance (poprun / torchrun / SLURM / OpenMPI process, see datasets/launcher.py) computes
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
load_state_dict throws that read-ahead away (datasets/loader/epoch_runs.py); read_ahead=False
makes each epoch an iteration of its own.

Batches are built inside the workers, written sample by sample into one preallocated uint8 tensor
(in shared memory, so handing it to the main process copies nothing: datasets/loader/batch_ring.py).
With host normalisation the worker converts it to float32/float16; with device normalisation it is
sent as it is. A worker reads its items through the source's kind (datasets/loader/source_kinds/:
indexed shards, image folder, synthetic) and writes each payload into its slot through the payload's
kind (datasets/loader/payloads/: encoded image, .npy, .pth, array); this module names neither.

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

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from datasets.formats.mapped_shards import release_payload
from datasets.launcher import Instance, detect_instance
from datasets.normalization import IMAGENET_MEAN, IMAGENET_STD, float_dtype, normalization_location, scale_and_bias
from datasets.loader.epoch_runs import EpochRuns, RunFlags, discard, worker_messages
from datasets.loader.batch_ring import BatchBuilder, BatchRing, RingMessage, SharedFlags, labels_tensor
from datasets.loader.reports import Batch, EpochReport, Skipped, WorkerReport
from datasets.loader.resume import (Segment, SubOrder, augment_rng, buffer_order, identity as resume_identity, in_order,
                                    load as resume_load, order_rng, pick, plan_segment, shuffled,
                                    state as resume_state, write_ledger)
from datasets.loader.share_plan import DEFAULT_POLICY, POLICIES, epoch_order, epoch_sequence, plan_instance, plan_own_share
from datasets.loader.device_batches import DEVICE_DECODE, NO_BUFFER, JpegPacker, check_device_pipeline
from datasets.loader.device_decode import DeviceBatches, decode_device
from datasets.loader.pipeline import RANDOM_RESIZED_CROP, ImagePipeline
from datasets.loader.payloads import payload_kind
from datasets.loader.source_kinds import Boxed, get_source_kind
from datasets.loader.sources import Source, load_own_share, resolve_source
from datasets.loader.user_transforms import build_pipeline
from datasets.shard_cache import open_cache, warn_cache_problems

log = logging.getLogger(__name__)
ON_ERROR = ("skip", "fail")


class SampleError(RuntimeError):
    """A sample that cannot be read or decoded (on_error="fail"): names the shard and the key."""


# Substitutes for skipped samples are drawn from the first samples a worker read well; keeping
# only this many bounds the worker's memory over an epoch (one int per sample read would not).
GOOD_KEPT = 4096


class ImageStream(IterableDataset):
    """One instance's share of a split, as batches, for torch.utils.data.DataLoader(batch_size=None).

    Each worker yields its `RingMessage`s of an epoch and, last, its `WorkerReport`, epoch after
    epoch (`spans_epochs`); `ImageLoader` turns that into (images, labels) and an `EpochReport`.
    """

    def __init__(self, source: Source, split: str, batch_size: int, instance: Instance, *, train: bool,
                 policy: str, seed: int, epoch: int, shuffle: bool, drop_last: bool, pipeline: ImagePipeline,
                 normalization: str, dtype, mean, std, on_error: str, shuffle_buffer: int, channels_last: bool,
                 use_repartition: bool = True, use_bbox_info: bool = False,
                 verify: bool = True, batch_transform=None, torch_random=None, device_decode: bool = False):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {on_error!r}")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.source, self.split, self.batch_size, self.instance = source, split, batch_size, instance
        self.train, self.policy, self.seed = train, policy, seed
        # The epoch the main process iterates next; workers take theirs from run_flags (epoch_runs.py).
        self._epoch = int(epoch)
        self.shuffle, self.drop_last, self.pipeline = shuffle, drop_last, pipeline
        self.normalization, self.dtype = normalization, dtype
        self.scale, self.bias = scale_and_bias(mean, std)
        self.on_error, self.shuffle_buffer, self.channels_last = on_error, shuffle_buffer, channels_last
        self.verify = verify
        self.batch_transform, self.torch_random = batch_transform, torch_random  # see user_transforms.py
        self.own_share = None
        # Bounding boxes (from the sample index, else each sample's json) steer RandomResizedCrop: train only.
        self.source_kind = get_source_kind(source.kind)
        self.use_bbox_info = use_bbox_info and self.source_kind.bboxes and RANDOM_RESIZED_CROP in pipeline.steps
        if source.repartition is not None and use_repartition:
            self.own_share = self._choose_repartition(source.repartition)
        self._plans = {}
        # A loaded state (datasets/loader/resume.py) applies to its epoch while this flag (shared
        # with persistent workers) is 1; it is cleared once that epoch's iteration finished.
        self.resume = None
        self._resume_on = SharedFlags(1, 0)
        self.ring = BatchRing(1, 3)  # ImageLoader gives it one sized for its workers
        # jpeg_decode="device": workers pack JPEG bytes (datasets/loader/device_batches.py) into this ring's buffers
        self.device_decode = device_decode
        self.byte_ring = BatchRing(1, 3)
        self.byte_capacity = self._largest_batch_bytes() if device_decode else 0
        # Where the workers start (generation, epoch; shared) and whether they go on into the next
        # epoch (ImageLoader's read_ahead): datasets/loader/epoch_runs.py.
        self.run_flags, self.spans_epochs = RunFlags(epoch), False

    def _choose_repartition(self, repartition):
        manifest, their_policy, counts = repartition["location"], repartition["policy"], repartition["counts"]
        if their_policy != self.policy:
            warnings.warn(f"{manifest}: made with policy {their_policy}, this loader uses {self.policy}; dealing "
                          f"samples at run time", stacklevel=3)
            return None
        if self.policy != "spread" and len(set(counts)) != 1:
            warnings.warn(f"{manifest}: instance counts {counts} differ; dealing samples at run time", stacklevel=3)
            return None
        share = load_own_share(repartition, self.instance.index)
        log.info("%s: instance %d reads its %d samples from the repartition", manifest, self.instance.index,
                 len(share.columns))
        # Rows holding a padded key (a few: one per padded slot), found once, not per epoch.
        self._padded_rows = share.columns.rows_with_keys(share.padded_keys)
        return share

    def _largest_batch_bytes(self) -> int:
        """The most payload bytes a batch can hold: its `batch_size` largest payloads (the index has every
        size); 0 where the source has no index (the packer grows its buffer as needed)."""
        columns = self.columns
        if columns is None or not len(columns):
            return 0
        sizes = columns.payload_sizes
        count = min(self.batch_size, len(sizes))
        return int(np.partition(sizes, len(sizes) - count)[-count:].astype(np.int64).sum())

    @property
    def columns(self):
        """The columnar index the plan's rows refer to (this instance's repartition share, or the source's)."""
        return self.own_share.columns if self.own_share is not None else self.source.columns

    def key_of(self, item) -> str:
        """The key of a plan item: a row of the columnar index, a folder item or a synthetic number."""
        if self.source.columns is not None:
            return self.columns.key(item)
        if isinstance(item, int):
            return f"{self.source.kind}-{item:09d}"  # synthetic-000000042, cifar10-000000042
        return item.key

    def keys_of(self, items) -> list:
        return [item if isinstance(item, str) else self.key_of(item) for item in items]

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    def resume_for(self, epoch: int):
        """The loaded resume.Resume if it applies to `epoch`, else None."""
        resume = self.resume
        return resume if resume is not None and self._resume_on.values[0] and resume.epoch == epoch else None

    def plan(self, epoch: Optional[int] = None):
        epoch = self.epoch if epoch is None else epoch
        resumed = self.resume_for(epoch) is not None
        # Unshuffled (validation), every epoch has the same plan: made once, not once an epoch in the
        # main process and in each worker (~40 us each on a 200-sample split, more on larger ones).
        key = (epoch if self.shuffle or resumed else None, resumed)
        if key not in self._plans:
            self._plans = {key: self._make_plan(epoch)}  # keep one: plans of 1.28M items are large
        return self._plans[key]

    def _make_plan(self, epoch):
        if self.own_share is not None:
            share = self.own_share
            order = epoch_order(*share.columns.group_ranges(), self.seed, epoch, self.shuffle)
            items = order.take(np.arange(len(order), dtype=np.int64))
            # A padded key appears twice in this instance's share; name the copies read after the first.
            padded = []
            if self._padded_rows:
                position = np.empty(len(items), dtype=np.int64)
                position[items] = np.arange(len(items), dtype=np.int64)
                repeats = []
                for key, rows in self._padded_rows.items():
                    repeats.extend((p, key) for p in sorted(int(position[row]) for row in rows)[1:])
                padded = [key for _, key in sorted(repeats)]
            if len(padded) < len(share.padded_keys):  # the original lives with another instance
                padded = list(share.padded_keys)
            plan = plan_own_share(items, share.counts, self.batch_size, self.drop_last, share.policy, padded)
            plan.policy_dropped = list(share.dropped_keys)
            return plan
        if self.source.columns is not None:
            sequence = epoch_order(*self.source.columns.group_ranges(), self.seed, epoch, self.shuffle)
        else:
            sequence = epoch_sequence(self.source.groups, self.seed, epoch, self.shuffle)
        resume = self.resume_for(epoch)
        if resume is not None and resume.positions is not None:  # a later segment: what is left, dealt anew
            return plan_segment(SubOrder(sequence, resume.positions), self.instance.index, self.instance.count,
                                self.policy, self.batch_size, self.drop_last)
        return plan_instance(sequence, self.instance.index, self.instance.count, self.policy, self.batch_size,
                             self.drop_last)

    # ------------------------------------------------------------------ in the worker

    def __iter__(self):
        """The worker's messages, epoch after epoch: datasets/loader/epoch_runs.py."""
        return worker_messages(self)

    def _batches(self, items, plan, epoch, workers, segment, start, report, shared):
        """Batches of `items` from reading position start[1] (start[0] batches handed over): in the
        shuffle buffer's order, computed on indices (resume.buffer_order), each batch augmented with
        its own generator, so a resumed worker yields what the uninterrupted one would have."""
        logical, worker = workers
        tag = (self.seed, epoch, segment, self.instance.index, logical)
        size, first_batch, position = self.shuffle_buffer if self.shuffle else 0, int(start[0]), int(start[1])
        if position == 0:
            raw = self._raw_samples(items)
            raw = shuffled(raw, size, order_rng(*tag)) if size > 1 else raw
        else:  # resumed: read only what is left, emit it in the order the buffer would have
            todo = buffer_order(len(items), size, order_rng(*tag))[position:]
            inputs = np.sort(todo)
            raw = in_order(self._raw_samples(pick(items, inputs)), inputs, todo)
        packer = JpegPacker(self.pipeline, self.byte_ring, worker, shared, self.byte_capacity,
                            self.torch_random) if self.device_decode else None
        builder = BatchBuilder(self.batch_size, self.pipeline.size, self.channels_last,
                                self.normalization == "host", self.dtype, self.scale, self.bias, shared,
                                self.ring, worker, None if packer else self.batch_transform, packer)
        progress = builder.progress = [logical, first_batch, position]
        rng = self._augment_rng(tag, first_batch)
        good = []
        for item, shard, label, payload, kind, error in raw:
            progress[2] += 1
            if error is None:
                error = self._process(kind, payload, builder, rng, shard)
                release_payload(payload)  # its shard pages go where keeping them does not pay
            if error is not None:
                self._bad(report, self.key_of(item), shard, error)
                continue
            if len(good) < GOOD_KEPT:
                good.append(item)
            report.samples += 1
            if builder.add(label, self.key_of(item)):
                report.batches += 1
                progress[1] += 1
                yield builder.emit()
                rng = self._augment_rng(tag, progress[1])
        deficit = len(items) - first_batch * self.batch_size - report.samples
        if deficit > 0 and plan.policy != "spread":
            yield from self._substitute(good, deficit, builder, report, rng, worker)
        if builder.count:
            if self.drop_last and builder.count < self.batch_size:
                report.partial_dropped.extend(builder.keys[:builder.count])
                builder.discard()
            else:
                report.batches += 1
                progress[1] += 1
                yield builder.emit()

    def _augment_rng(self, tag, batch: int):
        """The generator of one batch's augmentation; a user transform's torch draws are seeded alike,
        so that a resumed worker draws what the uninterrupted one did."""
        if self.torch_random is not None:
            self.torch_random.begin("/".join(map(str, (*tag, batch))))
        return augment_rng(*tag, batch)

    def _substitute(self, good, deficit, builder, report, rng, worker):
        """Keep the batch count: repeat samples this worker read well in place of the skipped ones."""
        if not good:
            raise SampleError(
                f"instance {self.instance.index}, worker {worker}: every sample of its share failed "
                f"(first: {report.skipped[0].key} in {report.skipped[0].shard}: {report.skipped[0].reason}); "
                f"there is no sample to repeat in their place"
            )
        missing = [s.key for s in report.skipped][-deficit:]
        for n in range(deficit):
            item = good[n % len(good)]
            for _, shard, label, payload, kind, error in self._raw_samples([item]):
                error = error or self._process(kind, payload, builder, rng, shard)
                if error is not None:
                    raise SampleError(f"{shard}: sample {self.key_of(item)!r} failed when read again: {error}")
                report.substituted.append((missing[n], self.key_of(item)))
                report.samples += 1
                if builder.add(label, self.key_of(item)):
                    report.batches += 1
                    builder.progress[1] += 1
                    yield builder.emit()

    def _bad(self, report, key, shard, error):
        if self.on_error == "fail":
            raise SampleError(f"{shard}: sample {key!r}: {error}")
        report.skipped.append(Skipped(key, shard, error))

    def _process(self, kind, payload, builder, rng, shard) -> Optional[str]:
        """Write one raw sample into the batch's next slot through its payload kind (with jpeg_decode="device",
        pack a JPEG for the device instead); the reason it failed, or None."""
        bbox = None
        if isinstance(payload, Boxed):
            payload, bbox = payload
        try:
            payload_type = payload_kind(kind)
            if builder.packer is not None and payload_type.device_jpeg and \
                    builder.packer.pack(payload, builder.count, shard, rng, bbox) is None:
                return None
            payload_type.into(self.pipeline, payload, builder.slot(), rng, bbox, self.source)
        except Exception as error:  # any decoder failure is this sample's problem, reported with it
            return f"{type(error).__name__}: {error}"
        return None

    def _raw_samples(self, items):
        """(item, shard, label, payload, kind, error) per item, in order, without decoding, from the
        source's kind (datasets/loader/source_kinds/); with verify, a payload that differs from its
        recorded checksum comes with that error."""
        return self.source_kind.raw_samples(self, items)


class ImageLoader:
    """Iterable of (images, labels) for one instance; `len()` is the batches per epoch.

    Each `for` over it is one epoch. The epoch number is the one given to `set_epoch`, or else one
    more than the previous iteration's (so forgetting set_epoch does not repeat the same order).
    After an iteration, `report` holds that epoch's `EpochReport`.
    """

    def __init__(self, dataset: ImageStream, workers: int, with_keys: bool = False, pin_memory: bool = False,
                 prefetch_factor: Optional[int] = None, timeout: float = 0, read_ahead: bool = True):
        self.dataset, self.workers, self.with_keys = dataset, workers, with_keys
        self.pin_memory, self.prefetch_factor, self.timeout = pin_memory, prefetch_factor, timeout
        # Per worker: the batches in flight (prefetch), the one the training step holds, the one
        # being filled, and one spare; beyond that a worker allocates fresh buffers (still correct).
        dataset.ring = BatchRing(workers, (prefetch_factor or 2) + 3 if workers else 3)
        # jpeg_decode="device": the byte buffers also wait in the decode thread's queue (DECODE_AHEAD)
        dataset.byte_ring = BatchRing(workers, (prefetch_factor or 2) + 3 + DECODE_AHEAD if workers else 3 + DECODE_AHEAD)
        self.report: Optional[EpochReport] = None
        self._loader = None
        self._runs = None  # the DataLoader iteration kept across epochs (datasets/loader/epoch_runs.py)
        dataset.spans_epochs = self.read_ahead = read_ahead
        self._live = None  # the epoch being iterated: its resume, and each worker's [batches, position]
        self._identity = None
        self.source_argument = None  # what get_data was given, named in ledgers
        self._device = None  # jpeg_decode="device": the main process's DeviceBatches, made at the first batch

    @property
    def instance(self) -> Instance:
        return self.dataset.instance

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    @property
    def classes(self) -> Optional[list]:
        """Class index -> class name (wnid) as the dataset records them, or None where it does not."""
        return self.dataset.source.classes

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    @property
    def batches_per_epoch(self) -> int:
        return self.dataset.plan().batches

    @property
    def samples_per_epoch(self) -> int:
        plan = self.dataset.plan()
        return min(len(plan.items), plan.batches * plan.batch_size)

    def __len__(self) -> int:
        return self.batches_per_epoch

    # -- resume and ledger (the arithmetic is in datasets/loader/resume.py)
    def _identity_and_segment(self):
        dataset = self.dataset
        if self._identity is None:
            self._identity = resume_identity(dataset)
        return self._identity, Segment(self.instance.count, max(self.workers, 1), dataset.batch_size,
                                       dataset.shuffle_buffer if dataset.shuffle else 0)

    def state_dict(self) -> dict:
        """Where this instance is in its epoch (torchdata's StatefulDataLoader convention): a JSON-able
        dict of a few hundred bytes, no sample list. Save it after each batch with the model."""
        identity, segment = self._identity_and_segment()
        live, index = self._live, self.instance.index
        if live is not None and not live["complete"]:
            progress = {"next": live["next"], "done": [list(d) for d in live["done"]]}
            return resume_state(identity, live["epoch"], live["resume"], segment, index, progress)
        pending = self.dataset.resume_for(self.epoch)  # loaded, not yet iterated
        if pending is not None:
            rotation, done = pending.start(index, segment.workers)
            return resume_state(identity, self.epoch, pending, segment, index, {"next": rotation, "done": done})
        return resume_state(identity, self.epoch, None, None, index, None)

    def load_state_dict(self, state) -> None:
        """Continue from `state_dict()`: this instance's own state (the same instance and worker
        counts, batch size: exactly the batches that followed), or the list of every instance's
        states (any instance or worker count: what was left, dealt anew). Sets the epoch. Raises
        ResumeError naming what differs (dataset, seed, split, policy...) or what is missing."""
        identity, segment = self._identity_and_segment()
        states = [state] if isinstance(state, dict) else list(state)
        resume = resume_load(states, identity, self.instance.index, segment)
        dataset = self.dataset
        dataset.set_epoch(int(states[0]["epoch"]))
        dataset.resume, dataset._plans, self._live = resume, {}, None
        dataset._resume_on.values[0] = int(resume is not None)
        self._loader = self._runs = None  # workers started before hold no resume: start new ones

    def write_ledger(self, path) -> dict:
        """Write (and return) the ledger of the epoch being or last iterated: the keys and labels
        each instance delivered, in order, per segment (the earlier ones of a resume included),
        derived from the plan and progress. `python -m datasets.ledger verify` checks a run's ledgers."""
        identity, segment = self._identity_and_segment()
        return write_ledger(path, self, identity, segment)

    def _dataloader(self) -> DataLoader:
        options = {}
        if self.workers > 0:
            # Persistent workers: no process start-up when an iteration starts afresh (a new
            # generation after an error); the iteration itself spans epochs (EpochRuns).
            options = {"prefetch_factor": self.prefetch_factor or 2, "timeout": self.timeout,
                       "persistent_workers": True}
        # pin_memory is done by the ring (its buffers page-locked once): DataLoader's pin thread
        # would copy every batch, and the ring would then keep serving that stale copy.
        # collate_fn: the worker's message as it is (the batch is built); the default would walk
        # it (64 keys) and turn the labels into a tensor, sent through shared memory.
        self._loader = DataLoader(self.dataset, batch_size=None, num_workers=self.workers, collate_fn=as_sent,
                                  **options)
        return self._loader

    def _batches_of(self, messages, ring, pin, report):
        """(message, Batch) in the workers' order; WorkerReports as (report, None). With
        jpeg_decode="device" each batch is assembled on the device in the decode thread, DECODE_AHEAD
        batches ahead of the one handed out (datasets/loader/device_decode.py)."""
        if not self.dataset.device_decode:
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
        if self._device is None:
            dataset = self.dataset
            self._device = DeviceBatches(dataset.pipeline.size, decode_device(), dataset.channels_last,
                                         dataset.batch_transform)
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
            if self.dataset.on_error == "fail":
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
        dataset = self.dataset
        epoch = dataset.epoch
        plan = dataset.plan(epoch)
        report = EpochReport(
            epoch, self.instance.index, self.instance.count, dataset.split, dataset.source.description,
            plan.policy, dataset.own_share.manifest if dataset.own_share else None,
            self.samples_per_epoch, plan.batches,
            padded=dataset.keys_of(plan.padded), policy_dropped=dataset.keys_of(plan.policy_dropped),
            last_batch_dropped=dataset.keys_of(plan.last_batch_dropped),
        )
        self.report = report
        resume, workers = dataset.resume_for(epoch), max(self.workers, 1)
        rotation, done = resume.start(self.instance.index, workers) if resume else (0, [[0, 0]] * workers)
        live = self._live = {"epoch": epoch, "resume": resume, "next": rotation, "done": list(done),
                             "complete": False}
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
                worker, batches, position = item.progress
                live["done"][worker], live["next"] = (batches, position), (worker + 1) % workers
                item = None
                ring.release_returned()
                dataset.byte_ring.release_returned()
                report.batches += 1
                report.samples += len(batch.keys)
                yield batch if self.with_keys else (batch.images, batch.labels)
                batch = None
        finally:
            dataset.set_epoch(epoch + 1)
        report.complete = live["complete"] = True
        dataset._resume_on.values[0] = 0  # a loaded state applies to its epoch only
        if report.skipped and not report.samples:
            first = report.skipped[0]
            raise SampleError(f"{dataset.source.description}: every sample of this instance's {dataset.split} share "
                              f"failed ({len(report.skipped)}; first: {first.key} in {first.shard}: {first.reason})")
        if report.skipped:
            warnings.warn(f"{len(report.skipped)} samples skipped: {report.summary()}", stacklevel=2)
        warn_cache_problems(report.cache)
        log.info("%s", report.summary())


DECODE_AHEAD = 2  # jpeg_decode="device": batches submitted to the decode thread before the one handed out


def as_sent(message):
    """DataLoader's collate_fn: a worker's RingMessage or WorkerReport, unchanged."""
    return message


def get_data(source, split: str = "train", batch_size: int = 64, workers: int = 0, *,
             normalization: str = "host", dtype="float32", instance=None, seed: int = 0, epoch: int = 0,
             policy: Optional[str] = None, train: Optional[bool] = None, shuffle: Optional[bool] = None,
             drop_last: Optional[bool] = None, on_error: str = "skip", image_size: Optional[int] = None,
             resize_size: Optional[int] = None, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), mean=IMAGENET_MEAN,
             std=IMAGENET_STD, shuffle_buffer: int = 1000, channels_last: bool = False, pin_memory: bool = False,
             prefetch_factor: Optional[int] = None, synthetic_length: Optional[int] = None,
             use_repartition: bool = True, use_draft: bool = True, with_keys: bool = False,
             label_offset: Optional[int] = None, jpeg_decode: Optional[str] = None,
             use_bbox_info: bool = False, verify: bool = True, cache_dir=None, cache_limit=None,
             cache_remote_paths: bool = False, cache_prefetch: int = 0, transform=None,
             batch_transform=None, read_ahead: bool = True) -> ImageLoader:
    """Batches of one split for this instance. See the module docstring and README for the rules.

    source          converted dataset dir or http(s) base URL; shard paths/URLs (brace patterns ok);
                    an ImageNet folder (holding train/ and validation/ or val/); "synthetic".
    split           "train" or "validation" (anything else is read like validation).
    normalization   "host" (float32, or float16 with dtype="float16") or "device"/"ipu" (uint8 NCHW;
                    wrap the model in datasets.normalization.NormalizeOnDevice).
    instance        a launcher.Instance or (index, count); default: detected from the launcher.
    policy          "drop" | "pad" | "spread"; default drop for train, spread otherwise.
    train           pipeline and defaults of training (default: split == "train").
    shuffle, drop_last  default: as `train`.
    on_error        "skip" (count, report, substitute for train) or "fail" (SampleError).
    image_size, resize_size  output side (224, or `transform`'s crop size) and the validation Resize (256/224 of it).
    transform, batch_transform  torchvision v2 transforms per sample (a leading RandomResizedCrop [+ flip] runs
                    fused in the decoder) and per batch (MixUp/CutMix); see datasets/loader/user_transforms.py.
    with_keys       yield Batch(images, labels, keys) instead of (images, labels).
    use_bbox_info   train: RandomResizedCrop prefers a crop whose overlap with the sample's bounding box
                    is at least 0.1 of the crop's area, up to 10 draws (the reference harness's option);
                    samples without a box are cropped as usual. The box comes from the sample index
                    (its bbox column); for indexes without it (older datasets, reference datasets not
                    adopted) from each sample's json "bbox", one extra member read a sample.
    label_offset    TFRecord shards without metadata (TF-slim stores labels 1..1000): subtract this;
                    default: detected from the labels (a warning says which), an error if they cannot tell.
    jpeg_decode     "crop" (decode only the JPEG region the train crop or center crop needs), "pil" (whole
                    images); default "crop" where native/jpeg_crop is built, unless DATASETS_JPEG_DECODE=pil.
                    "device": the accelerator decodes the JPEGs (nvJPEG; workers read, verify and draw the
                    crops), batches come as uint8 on the device (normalization="device"); without CUDA a CPU
                    stand-in decoder runs the same path. datasets/loader/device_decode.py.
    verify          check every indexed payload's CRC32C as it is read (a mismatch is a bad sample,
                    see on_error); False turns it off.
    cache_dir, cache_limit, cache_remote_paths, cache_prefetch: the node's shard cache, docs/shard-cache.md.
    read_ahead      workers go on into the next epoch while this one is finished (one DataLoader iteration
                    across epochs); False: each epoch its own iteration, nothing read before it is asked
                    for (what counting one epoch's requests or bytes needs).
    """
    if isinstance(instance, tuple):
        instance = detect_instance(*instance)
    elif instance is None:
        instance = detect_instance()
    train = (split == "train") if train is None else train
    policy = policy or (DEFAULT_POLICY["train"] if train else DEFAULT_POLICY["validation"])
    shuffle = train if shuffle is None else shuffle
    drop_last = train if drop_last is None else drop_last
    location = normalization_location(normalization)
    dtype = float_dtype(dtype)
    device_decode = jpeg_decode == DEVICE_DECODE
    if device_decode and location != "device":
        raise ValueError("jpeg_decode='device' hands out uint8 batches decoded on the device: use "
                         "normalization='device' (and datasets.normalization.NormalizeOnDevice)")
    resolved = resolve_source(source, split, instance.count, image_size or 224, synthetic_length, seed,
                              use_repartition, label_offset)
    resolved.cache = open_cache(cache_dir, resolved.metadata, resolved.description, cache_limit, cache_remote_paths,
                                cache_prefetch)
    pipeline, notes, torch_random, batch_transform = build_pipeline(
        transform, batch_transform, train, image_size, resize_size, resolved.stored_steps, scale, ratio, use_draft,
        None if device_decode else jpeg_decode, get_source_kind(resolved.kind).output_sized)
    if device_decode:
        check_device_pipeline(pipeline)
    for note in notes:
        warnings.warn(f"{resolved.description}: {note}", stacklevel=2)
    skipped_steps = resolved.stored_steps[:2 - len(pipeline.steps)] if len(pipeline.steps) < 2 else []
    dataset = ImageStream(resolved, split, batch_size, instance, train=train, policy=policy, seed=seed,
                          epoch=epoch, shuffle=shuffle, drop_last=drop_last, pipeline=pipeline,
                          normalization=location, dtype=dtype, mean=mean, std=std, on_error=on_error,
                          shuffle_buffer=shuffle_buffer, channels_last=channels_last,
                          use_repartition=use_repartition, use_bbox_info=use_bbox_info,
                          verify=verify, torch_random=torch_random, batch_transform=batch_transform,
                          device_decode=device_decode)
    loader = ImageLoader(dataset, workers, with_keys=with_keys, pin_memory=pin_memory,
                         prefetch_factor=prefetch_factor, read_ahead=read_ahead)
    loader.source_argument = str(source) if isinstance(source, (str, os.PathLike)) else None
    log.info("%s; %s; runtime steps %s%s; %d batches of %d per epoch", instance.describe(), resolved.description,
             " + ".join(pipeline.steps) or "none",
             f" (stored: {' + '.join(map(str, skipped_steps))})" if skipped_steps else "",
             len(loader), batch_size)
    return loader

