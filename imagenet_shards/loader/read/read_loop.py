"""What a DataLoader worker runs: `ReadLoop.batches` turns the worker's plan items into batches.

It reads the items through the source's kind (imagenet_shards/loader/source_kinds/), writes each payload
into its batch slot through the payload's kind (imagenet_shards/loader/payloads/), applies the error
policy (on_error: skip and report, or fail), fills the gap skipped samples leave with repeats of
samples the worker read well (policies drop and pad) and builds the batches in the worker's ring
(imagenet_shards/loader/output/batch_ring.py). The order follows the shuffle buffer's draws and each batch has
its own augmentation generator (imagenet_shards/loader/plan/shuffle_buffer.py), so a resumed worker yields what the
uninterrupted one would have.

This is the loader's hot path: per sample, a raw tuple from the kind, one payload decode and a
slot write; what is per batch (generators, emits) stays out of the per-sample loop.
"""

from __future__ import annotations

import random
from typing import NamedTuple, Optional

import numpy as np

from imagenet_shards.safe_names import redact_text
from imagenet_shards.formats.mapped_shards import release_payload
from imagenet_shards.loader.output.batch_ring import BatchBuilder
from imagenet_shards.loader.device.device_batches import JpegPacker, largest_batch_bytes
from imagenet_shards.loader.payloads import payload_kind
from imagenet_shards.loader.transform.pipeline import ImagePipeline
from imagenet_shards.loader.output.reports import Skipped
from imagenet_shards.loader.plan.shuffle_buffer import augment_rng, buffer_order, in_order, order_rng, pick, shuffled
from imagenet_shards.loader.source_kinds import Boxed, ReadContext, get_source_kind
from imagenet_shards.loader.source_kinds.mix import mix_parts
from imagenet_shards.normalization import Normalization, scale_and_bias
from imagenet_shards.shard_cache import merge_events
from imagenet_shards.errors import Error

ON_ERROR = ("skip", "fail")  # checked once, before any I/O, in LoaderSettings.checked (loader/settings.py)
# Substitutes for skipped samples are drawn from the first samples a worker read well; keeping
# only this many bounds the worker's memory over an epoch (one int per sample read would not).
GOOD_KEPT = 4096


class FlatTag(NamedTuple):
    """order="global": each sample is augmented by its flat position, not by (instance, worker, batch)."""

    seed: int
    epoch: int
    sample_ids: object  # the worker's items' flat positions, in its order

    def name(self, index: int) -> str:
        flat = int(self.sample_ids[index]) if index < len(self.sample_ids) else f"x{index}"  # x: past the plan
        return f"{self.seed}/{self.epoch}/g{flat}"


class SampleError(Error, RuntimeError):
    """A sample that cannot be read or decoded (on_error="fail"): names the shard and the key."""


class ReadLoop:
    """A worker's reading of its items into batches (see the module docstring). Made by image_loader.build_stream
    from checked LoaderSettings: `on_error` is one of ON_ERROR already."""

    def __init__(self, context: ReadContext, pipeline: ImagePipeline, batch_size: int, instance_index: int, *,
                 on_error: str, shuffle_buffer: int, drop_last: bool, normalization: Normalization,
                 batch_transform=None, torch_random=None, device_decode: bool = False):
        self.context, self.source, self.kind = context, context.source, get_source_kind(context.source.kind)
        self.pipeline, self.batch_size, self.instance_index = pipeline, batch_size, instance_index
        self.on_error, self.shuffle_buffer, self.drop_last = on_error, shuffle_buffer, drop_last
        # unpacked once here: the per-batch code reads plain attributes, as before the group (issue 34)
        self.host_normalization, self.dtype = normalization.on_host, normalization.torch_dtype
        self.channels_last = normalization.channels_last
        self.scale, self.bias = scale_and_bias(normalization.mean, normalization.std)
        self.batch_transform, self.torch_random = batch_transform, torch_random  # see user_transforms.py
        # jpeg_decode="device": JPEGs are packed for the device decoder (imagenet_shards/loader/device/device_batches.py)
        # into buffers sized from the split's largest batch of payload bytes; the batch transform then runs
        # on the device batch
        self.device_decode = device_decode
        self.byte_capacity = largest_batch_bytes(context.columns, batch_size) if device_decode else 0

    def take_cache_events(self) -> dict:
        """What the source's shard cache (a Mix's sources' caches) did since last asked (for the worker's report)."""
        mix = mix_parts(self.source)
        caches = [part.cache for part in mix.parts] if mix is not None else [self.source.cache]
        events = {}
        for cache in caches:
            events = merge_events(events, cache.take_events() if cache is not None else {})
        return events

    def batches(self, items, plan, epoch, workers, segment, start, report, shared, ring, byte_ring=None,
                sample_ids=None):
        """Batches of `items` from reading position start[1] (start[0] batches handed over): in the
        shuffle buffer's order (0: none), computed on indices (resume.buffer_order), each batch
        augmented with its own generator, so a resumed worker yields what the uninterrupted one would have.
        `sample_ids` (order="global"): each of the worker's items' flat position, which then seeds its
        augmentation, so that a sample is augmented alike whatever the instance and worker counts."""
        logical, worker = workers
        tag = (self.context.seed, epoch, segment, self.instance_index, logical)
        if sample_ids is not None:
            tag = FlatTag(self.context.seed, epoch, sample_ids)
        size, first_batch, position = self.shuffle_buffer, int(start[0]), int(start[1])
        if position == 0:
            raw = self._raw_samples(items)
            raw = shuffled(raw, size, order_rng(*tag)) if size > 1 else raw
        else:  # resumed: read only what is left, emit it in the order the buffer would have
            todo = buffer_order(len(items), size, order_rng(*tag) if size > 1 else None)[position:]
            inputs = np.sort(todo)
            raw = in_order(self._raw_samples(pick(items, inputs)), inputs, todo)
        packer = JpegPacker(self.pipeline, byte_ring, worker, shared, self.byte_capacity, self.torch_random) \
            if self.device_decode else None
        builder = BatchBuilder(self.batch_size, self.pipeline.size, self.channels_last, self.host_normalization,
                               self.dtype, self.scale, self.bias, shared, ring, worker,
                               None if packer else self.batch_transform, packer)
        progress = builder.progress = [logical, first_batch, position]
        per_sample = isinstance(tag, FlatTag)
        rng = self._augment_rng(tag, first_batch * self.batch_size if per_sample else first_batch)
        good = []
        context, key = self.context, self.kind.key
        for item, shard, label, payload, kind, error in raw:
            if per_sample:
                rng = self._augment_rng(tag, progress[2])
            progress[2] += 1
            if error is None:
                error = self._process(kind, payload, builder, rng, shard)
            release_payload(payload)  # its shard pages go where keeping them does not pay (a bad one's too)
            if error is not None:
                self._bad(report, key(context, item), shard, error)
                continue
            if len(good) < GOOD_KEPT:
                good.append(item)
            report.samples += 1
            if builder.add(label, key(context, item)):
                report.batches += 1
                progress[1] += 1
                yield builder.emit()
                if not per_sample:
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
        """The generator of one batch's augmentation (of one sample's, item index `batch`, under the global
        order); a user transform's torch draws are seeded alike, so that a resumed worker draws what the
        uninterrupted one did."""
        if isinstance(tag, FlatTag):
            name = tag.name(batch)
            if self.torch_random is not None:
                self.torch_random.begin(name)
            return random.Random(name)
        if self.torch_random is not None:
            self.torch_random.begin("/".join(map(str, (*tag, batch))))
        return augment_rng(*tag, batch)

    def _substitute(self, good, deficit, builder, report, rng, worker):
        """Keep the batch count: repeat samples this worker read well in place of the skipped ones."""
        if not good:
            raise SampleError(
                f"instance {self.instance_index}, worker {worker}: every sample of its share failed "
                f"(first: {report.skipped[0].key} in {report.skipped[0].shard}: {report.skipped[0].reason}); "
                f"there is no sample to repeat in their place"
            )
        missing = [s.key for s in report.skipped][-deficit:]
        context, key = self.context, self.kind.key
        for n in range(deficit):
            item = good[n % len(good)]
            for _, shard, label, payload, kind, error in self._raw_samples([item]):
                error = error or self._process(kind, payload, builder, rng, shard)
                if error is not None:
                    raise SampleError(f"{shard}: sample {key(context, item)!r} failed when read again: {error}")
                report.substituted.append((missing[n], key(context, item)))
                report.samples += 1
                if builder.add(label, key(context, item)):
                    report.batches += 1
                    builder.progress[1] += 1
                    yield builder.emit()

    def _bad(self, report, key, shard, error):
        shard, error = redact_text(str(shard)), redact_text(str(error))  # no signature or token is printed
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
        source's kind (imagenet_shards/loader/source_kinds/); with verify, a payload that differs from its
        recorded checksum comes with that error."""
        return self.kind.raw_samples(self.context, items)
