"""`jpeg_decode="device"`, the worker's half: a batch's JPEG bytes packed for the accelerator's decoder.

A worker does what it does on the host path up to the decode: it reads the sample, checks its
CRC32C, follows the split, order and resume, and draws the crop box and flip with the same
generator calls, from the JPEG header's size alone. Then, instead of decoding, `JpegPacker.pack`
copies the bytes into a buffer of the byte ring (beside the image ring, page-locked with it
under pin_memory) and records the box and flip. A JPEG the device decoder does not take
(`jpeg_header.device_refusal`), a sample that is not a JPEG, or steps the device path does not
run are decoded on the host into the batch's image buffer as today, and counted.

The main process's half (decode, crop, resize, flip on the device): imagenet_shards/loader/device/device_decode.py.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple, Optional

import numpy as np
import torch

from imagenet_shards.loader.output.batch_ring import BatchRing
from imagenet_shards.loader.device.device_resample import center_crop_box, crop_box
from imagenet_shards.loader.device.jpeg_header import device_refusal, read_header
from imagenet_shards.pixel_limit import check_pixels
from imagenet_shards.loader.transform.pipeline import CENTER_CROP, RANDOM_RESIZED_CROP, RESIZE, center_crop_offsets, resized_size

DEVICE_DECODE = "device"  # get_data(jpeg_decode=...)
_EOI_TAIL = 1024  # bytes at the end searched for the End Of Image marker: a truncated JPEG is the host's to report
_MIN_CAPACITY = 1 << 20
NO_BUFFER = -2  # DeviceJpegs.slot of a batch whose every row was decoded on the host


class DeviceJpegs(NamedTuple):
    """The part of a batch the device decodes: rows, bytes, boxes, flips."""

    rows: np.ndarray  # int32: the batch rows the device fills
    offsets: np.ndarray  # int64, len(rows) + 1: row i's bytes are the buffer's [offsets[i], offsets[i + 1])
    boxes: np.ndarray  # float64 (len(rows), 4): (x0, y0, x1, y1) in the image's pixels
    flips: np.ndarray  # bool
    shards: list  # each row's shard, to name it if the device cannot decode it
    slot: int  # the byte ring's slot (-1: a fresh buffer, sent with the message)
    buffer: Optional[torch.Tensor]  # the byte buffer, sent the first time its slot is used
    clip: bool  # the resize reads only pixels inside the box (a user's torchvision crop)
    torch_state: Optional[np.ndarray]  # torch's generator after the batch's draws: the batch transform's, on the device
    host_decoded: int  # samples of this batch decoded on the host instead (counted in the report)


def device_box(pipeline, width: int, height: int, rng, bbox):
    """((x0, y0, x1, y1), flip) for the device, drawing from `rng` exactly as the host path does; None
    where the pipeline's steps are not the device's (the host decodes that sample)."""
    steps = pipeline.steps
    if RANDOM_RESIZED_CROP in steps:
        box = crop_box(*pipeline.crop_box(width, height, rng, bbox))
        return box, pipeline.flip_draw(rng)
    if steps == (RESIZE, CENTER_CROP):
        out_width, out_height = resized_size(width, height, pipeline.resize)
        if min(out_width, out_height) < pipeline.size:
            return None
        return center_crop_box(width, height, pipeline.resize, pipeline.size), False
    if steps == (CENTER_CROP,) and min(width, height) >= pipeline.size:
        top, left = center_crop_offsets(width, height, pipeline.size)
        return (float(left), float(top), float(left + pipeline.size), float(top + pipeline.size)), False
    return None


def check_device_pipeline(pipeline) -> None:
    """Refuse, at get_data time, a user transform whose steps cannot run per sample on the device.

    A leading RandomResizedCrop [+ RandomHorizontalFlip] (or Resize + CenterCrop) maps to the device's
    crop, drawn per sample in the worker as today. Anything after it would be a per-sample step on a
    decoded image, which only the host has: v2 transforms applied to a device batch draw one set of
    parameters for the whole batch. Batch transforms (MixUp, CutMix) are fine: they run on the batch."""
    rest, fused = getattr(pipeline, "rest", None), getattr(pipeline, "fused", True)
    if rest is not None or not fused:
        what = "steps after its leading RandomResizedCrop [+ RandomHorizontalFlip]" if fused else \
            "no leading RandomResizedCrop or Resize + CenterCrop"
        raise ValueError(f"jpeg_decode='device' runs a transform's leading RandomResizedCrop [+ RandomHorizontalFlip] "
                         f"(or Resize + CenterCrop) on the device, per sample; this transform has {what}, which "
                         f"would run on the host: use jpeg_decode='crop' for it, or move batch-level steps to "
                         f"batch_transform=")


def largest_batch_bytes(columns, batch_size: int) -> int:
    """The most payload bytes a batch can hold: its `batch_size` largest payloads (the sample index has
    every size); 0 without an index (the packer then grows its buffer as batches need)."""
    if columns is None or not len(columns):
        return 0
    sizes = columns.payload_sizes
    count = min(batch_size, len(sizes))
    return int(np.partition(sizes, len(sizes) - count)[-count:].astype(np.int64).sum())


def device_eligible(payload) -> Optional[str]:
    """Why this payload goes to the host decoder instead of the device's, or None."""
    if b"\xff\xd9" not in bytes(payload[-_EOI_TAIL:]):
        return "no End Of Image marker (truncated?)"
    return device_refusal(read_header(payload))


class JpegPacker:
    """In a worker: packs one batch's device-decodable JPEGs into a byte-ring buffer.

    `capacity`: the buffer size to start from (the split's largest batch of payload bytes, where
    the index knows it); a batch that needs more takes a larger buffer, so nothing overflows."""

    def __init__(self, pipeline, ring: BatchRing, worker: int, shared: bool, capacity: int = 0,
                 torch_random=None):
        # A user transform's pipeline (user_transforms.TransformedPipeline) draws through its fused prefix
        self.pipeline = getattr(pipeline, "base", pipeline)
        self.ring, self.worker, self.shared = ring, worker, shared
        self.capacity = int(capacity) or _MIN_CAPACITY
        self.torch_random = torch_random
        self.clip = bool(getattr(self.pipeline, "crop_edges", False))
        self.host_decoded = 0
        self._reset()

    def _reset(self):
        self.rows, self.offsets, self.boxes, self.flips, self.shards = [], [0], [], [], []
        self.slot, self.buffer, self.new = None, None, False

    def _room(self, extra: int) -> None:
        """A buffer with room for `extra` more bytes (the bytes packed so far kept)."""
        used = self.offsets[-1]
        if self.buffer is not None and used + extra <= self.buffer.numel():
            return
        if used + extra > self.capacity:
            self.capacity = 1 << (used + extra - 1).bit_length()
        old, old_slot = self.buffer, self.slot
        self.slot, self.buffer, self.new = self.ring.acquire(self.worker, (self.capacity,), torch.uint8, self.shared,
                                                             False)
        if old is not None:
            self.buffer[:used].copy_(old[:used])
            if old_slot >= 0:
                self.ring.free[self.worker, old_slot] = 1

    def pack(self, payload, row: int, shard: str, rng, bbox) -> Optional[str]:
        """Pack `payload` for the device as batch row `row`; None if packed, else why the host must decode it
        (nothing drawn from `rng` then: the host path draws as usual)."""
        refusal = device_eligible(payload)
        if refusal is None:
            header = read_header(payload)
            check_pixels(header.width, header.height, self.pipeline.pixel_limit)  # over the limit: this sample's error, never packed
            with self.torch_random if self.torch_random is not None else contextlib.nullcontext():
                drawn = device_box(self.pipeline, header.width, header.height, rng, bbox)
            if drawn is None:
                refusal = "steps the device path does not run"
        if refusal is not None:
            self.host_decoded += 1
            return refusal
        box, flip = drawn
        size = len(payload)
        self._room(size)
        start = self.offsets[-1]
        self.buffer[start:start + size].numpy()[:] = np.frombuffer(payload, np.uint8)
        self.rows.append(row)
        self.offsets.append(start + size)
        self.boxes.append(box)
        self.flips.append(flip)
        self.shards.append(shard)
        return None

    def drop(self, row: int) -> None:
        """Forget `row` if it was packed (its sample failed later and its row is reused)."""
        if self.rows and self.rows[-1] == row:
            self.rows.pop(), self.offsets.pop(), self.boxes.pop(), self.flips.pop(), self.shards.pop()

    def discard(self) -> None:
        """Forget the batch being packed; its buffer's slot is free again."""
        if self.slot is not None and self.slot >= 0:
            self.ring.free[self.worker, self.slot] = 1
        self.host_decoded = 0
        self._reset()

    def take(self) -> Optional[DeviceJpegs]:
        """The batch's device part (None if nothing was packed), and a fresh start for the next batch."""
        state = None
        if self.torch_random is not None:  # workers=0 keeps the stream's state aside (user_transforms.TorchRandom)
            state = self.torch_random.state if self.torch_random.swap else torch.get_rng_state()
            state = None if state is None else state.numpy().copy()
        jpegs = DeviceJpegs(np.array(self.rows, np.int32), np.array(self.offsets, np.int64),
                            np.array(self.boxes, np.float64).reshape(-1, 4), np.array(self.flips, bool),
                            list(self.shards), NO_BUFFER if self.slot is None else self.slot,
                            self.buffer if self.new else None, self.clip, state, self.host_decoded)
        self.host_decoded = 0
        self._reset()
        return jpegs
