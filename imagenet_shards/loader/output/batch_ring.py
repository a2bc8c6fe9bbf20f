"""The loader's output buffers: each worker's batches are written into a few reused shared-memory
tensors (`BatchRing`), so a batch costs no fresh shared memory and sending it copies nothing.

`BatchBuilder` fills one batch sample by sample into such a buffer (normalising it for host
normalisation, applying a batch transform) and makes the message.

Used by imagenet_shards/loader/image_loader.py: a worker `acquire`s a slot's buffer and sends a
`RingMessage`; the main process `receive`s it and, as batches are let go, `release_returned`.

pin_memory: the main process page-locks each ring buffer once (cudaHostRegister), so a batch is
handed out already pinned and `.to("cuda", non_blocking=True)` copies it straight from the shared
memory the worker wrote. `pin_memory()` per batch instead costs a copy of the whole batch in the
training loop's thread (38.5 MB at batch 256, ~10 ms on an H200 host, 15% of a ResNet-50 step).
A pinned buffer goes back to its worker only after the copies enqueued from it have run: a CUDA
event recorded on the current stream when the batch is let go must have completed.
"""

from __future__ import annotations

import logging
import math
import os
from typing import NamedTuple, Optional

import numpy as np
import torch

log = logging.getLogger(__name__)


def _new_tensor(shape, dtype, shared: bool) -> torch.Tensor:
    """A tensor whose storage is created in shared memory when it will be sent to another process
    (as torch's default_collate does in workers), so sending it copies nothing."""
    if not shared:
        return torch.empty(shape, dtype=dtype)
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(math.prod(shape))
    return torch.empty(0, dtype=dtype).new(storage).view(shape)


class RingMessage(NamedTuple):
    """A batch as a worker sends it: the images travel only the first time a ring slot is used
    (or when no slot was free: slot -1); afterwards the slot number is enough. The labels travel
    as a numpy array (`labels_tensor` makes the batch's tensor): a tensor would be sent through
    a new shared-memory segment and file descriptor per batch, ~1 ms of CPU a batch on each side."""

    worker: int
    slot: int
    count: int
    images: Optional[torch.Tensor]
    labels: np.ndarray
    keys: list
    progress: tuple = ()  # (worker as planned, its batches handed over, its reading position): for resume
    run: tuple = ()  # (generation, epoch) the batch belongs to, see imagenet_shards/loader/read/epoch_runs.py
    jpegs: object = None  # jpeg_decode="device": the rows the device decodes (device_batches.DeviceJpegs)


class SharedFlags:
    """Integers in shared memory that forked (or spawned) workers and the main process all see,
    read and written through a numpy view (`values`): indexing the torch tensor costs ~5 us a call,
    the view ~0.1 us."""

    def __init__(self, shape, fill: int = 0, dtype=torch.int64):
        self.tensor = torch.full(shape if isinstance(shape, tuple) else (shape,), fill, dtype=dtype).share_memory_()
        self.values = self.tensor.numpy()

    def __getstate__(self):  # spawn: the tensor travels as shared memory; the view is made anew
        return {"tensor": self.tensor}

    def __setstate__(self, state):
        self.tensor = state["tensor"]
        self.values = self.tensor.numpy()


class BatchRing:
    """Output buffers reused across batches, so a batch costs no fresh shared memory.

    Why: a new shared-memory tensor per batch (what DataLoader's default collate does) is paid in
    page faults when it is first written, costing as much as the whole tensor-format pipeline
    (docs/design-figures.md). Each worker owns `slots` buffers. A buffer is lent to the
    training code with the batch and is reused only after the main process has seen that nothing
    references it any more (torch's storage use count back to the ring's own), so batches a user
    keeps stay intact; when every slot is still lent, the worker allocates a fresh buffer instead.
    `free` (shared memory, made before the workers start) is 1 where a slot may be filled.
    """

    def __init__(self, workers: int, slots: int):
        self.slots = slots
        self._free = SharedFlags((max(workers, 1), slots), 1, torch.uint8)  # 1: the slot may be filled
        self.buffers = {}  # (worker, slot) -> full-size batch tensor; inherited by forked workers
        self.baseline = {}  # (worker, slot) -> storage use count when only the ring holds it
        self.lent = set()
        self.reused = self.fresh = 0  # batches received in a reused buffer / in a fresh one (no slot free)
        self.pin = False  # main process: page-lock the buffers for CUDA (ImageLoader sets it)
        self.lockable = True  # False once CUDA refused a page lock
        self.locked = {}  # (worker, slot) -> page-locked address (cudaHostRegister), main process
        self.locked_by = None  # the process that holds the locks
        self.draining = {}  # (worker, slot) -> CUDA event: let go, waiting for the copies enqueued from it

    @property
    def free(self):
        """(workers, slots) uint8, shared: 1 where a slot may be filled."""
        return self._free.values

    # -- in the worker
    def acquire(self, worker: int, shape, dtype, shared: bool, channels_last: bool):
        """(slot, tensor, is_new): a free slot's buffer, or (-1, fresh tensor, True)."""
        flags = self.free[worker]
        for slot in range(self.slots):
            if flags[slot]:
                flags[slot] = 0
                tensor = self.buffers.get((worker, slot))
                if tensor is not None and tensor.shape == shape and tensor.dtype == dtype:
                    return slot, tensor, False
                tensor = batch_tensor(shape, dtype, shared, channels_last)
                self.buffers[(worker, slot)] = tensor
                return slot, tensor, True
        return -1, batch_tensor(shape, dtype, shared, channels_last), True

    # -- in the main process
    def receive(self, message: RingMessage) -> torch.Tensor:
        """The batch's images; where `pin`, pinned: the ring's own page-locked buffer, else a copy."""
        if message.slot < 0:
            self.fresh += 1
            images = message.images[:message.count]
            return images.pin_memory() if self.pin else images
        key = (message.worker, message.slot)
        if message.images is None:
            self.reused += 1
        else:
            if key in self.locked:  # a new buffer for this slot (another shape): the old one's lock goes
                page_unlock(self.locked.pop(key))
            self.buffers[key] = message.images
            self.baseline[key] = self._use_count(key)
        if self.pin and key not in self.locked:
            address = page_lock(self.buffers[key]) if self.lockable else None
            if address is None:  # CUDA refused: a pinned copy, and the slot is free again at once
                self.lockable = False
                self.free[key] = 1
                return self.buffers[key][:message.count].pin_memory()
            self.locked[key], self.locked_by = address, os.getpid()
        self.lent.add(key)
        return self.buffers[key][:message.count]

    def _use_count(self, key) -> int:
        return torch._C._storage_Use_Count(self.buffers[key].untyped_storage()._cdata)

    def release_returned(self) -> None:
        """Mark free the lent buffers that nothing references any more (every view of a batch,
        including one kept by the training code or a pending copy, holds a storage reference);
        a page-locked one once the device work enqueued before it was let go has run."""
        for key in list(self.lent):
            if self._use_count(key) <= self.baseline[key]:
                self.lent.discard(key)
                if key in self.locked:
                    event = torch.cuda.Event()
                    event.record()  # after every copy the training code enqueued from it
                    self.draining[key] = event
                else:
                    self.free[key] = 1
        for key, event in list(self.draining.items()):
            if event.query():
                del self.draining[key]
                self.free[key] = 1

    def unlock(self) -> None:
        """Unlock every page-locked buffer, once the copies enqueued from them have run."""
        if self.locked_by != os.getpid():  # a forked worker's copy of the ring: the locks are not its own
            return
        for key, event in self.draining.items():
            event.synchronize()
            self.free[key] = 1
        self.draining.clear()
        for address in self.locked.values():
            page_unlock(address)
        self.locked.clear()

    def __getstate__(self):  # a worker started by spawn gets the ring without the main process's locks
        state = dict(self.__dict__)
        state.update(locked={}, draining={}, locked_by=None, pin=False)
        return state

    def __del__(self):
        try:
            if self.locked:
                self.unlock()
        except Exception:  # interpreter shutdown: CUDA may be gone already, and the process with it
            pass


def page_lock(tensor: torch.Tensor) -> Optional[int]:
    """Page-lock `tensor`'s storage for CUDA (cudaHostRegister); its address, or None if CUDA refused
    (logged once; the batches are then pinned by copying)."""
    storage = tensor.untyped_storage()
    address = storage.data_ptr()
    error = torch.cuda.cudart().cudaHostRegister(address, storage.nbytes(), 0)
    if error != 0:
        log.warning("cudaHostRegister of a %d-byte batch buffer failed (%s): batches are pinned by copying",
                    storage.nbytes(), error)
        return None
    return address


def page_unlock(address: int) -> None:
    torch.cuda.cudart().cudaHostUnregister(address)


def labels_tensor(message: RingMessage) -> torch.Tensor:
    """The batch's labels as the training code gets them (int64, or a batch transform's soft labels)."""
    return torch.from_numpy(message.labels)


def batch_tensor(shape, dtype, shared, channels_last):
    """An NCHW tensor; with channels_last its memory is NHWC (torch.channels_last strides). Any
    other shape (the byte ring's flat buffers) as it is."""
    if len(shape) != 4:
        return _new_tensor(shape, dtype, shared)
    n, c, h, w = shape
    if channels_last:
        return _new_tensor((n, h, w, c), dtype, shared).permute(0, 3, 1, 2)
    return _new_tensor(shape, dtype, shared)


class BatchBuilder:
    """Fills a uint8 batch slot by slot; hands it out (normalised into a float buffer for host)."""

    def __init__(self, batch_size, size, channels_last, host, dtype, scale, bias, shared, ring: BatchRing,
                 worker: int, batch_transform=None, packer=None):
        self.batch_size, self.size, self.channels_last = batch_size, size, channels_last
        self.batch_transform = batch_transform  # user_transforms.BatchTransform: on the batch, labels in and out
        self.host, self.dtype, self.scale, self.bias, self.shared = host, dtype, scale, bias, shared
        self.ring, self.worker = ring, worker
        self.packer = packer  # jpeg_decode="device": device_batches.JpegPacker, the batch's JPEG bytes
        self.progress = [worker, 0, 0]  # sent with each batch: (worker as planned, batches, reading position)
        self.shape = (batch_size, 3, size, size)
        self.count = 0
        self.labels = [0] * batch_size
        self.keys = [None] * batch_size
        self.work = None
        if host:  # the uint8 batch never leaves the worker: one, reused
            self.images = batch_tensor(self.shape, torch.uint8, False, channels_last)
            self._set_views()
        else:
            self.images = None

    def _set_views(self):
        # HWC-shaped numpy views of each sample's slot: the pipeline writes pixels straight in.
        self.hwc = self.images.numpy().transpose(0, 2, 3, 1) if not self.channels_last else \
            self.images.permute(0, 2, 3, 1).numpy()

    def slot(self) -> np.ndarray:
        self._acquire()
        return self.hwc[self.count]

    def _acquire(self) -> None:
        if self.images is None:  # device: the next ring buffer is the batch itself
            self.slot_number, self.images, self.new = self.ring.acquire(
                self.worker, self.shape, torch.uint8, self.shared, self.channels_last)
            self._set_views()

    def add(self, label: int, key: str) -> bool:
        self.labels[self.count], self.keys[self.count] = label, key
        self.count += 1
        return self.count == self.batch_size

    def discard(self) -> None:
        """Drop the batch being filled (a partial last batch left out): its ring slots are free again."""
        if self.images is not None and not self.host and self.slot_number >= 0:
            self.ring.free[self.worker, self.slot_number] = 1
            self.images = self.hwc = None
        if self.packer is not None:
            self.packer.discard()
        self.count = 0

    def emit(self) -> RingMessage:
        n = self.count
        if self.host:
            slot, out, new = self.ring.acquire(self.worker, self.shape, self.dtype, self.shared, self.channels_last)
            images = self.images[:n]
            if self.dtype == torch.float32:
                out[:n].copy_(images).mul_(self.scale).add_(self.bias)
            else:  # computed in float32, rounded once, like NormalizeOnDevice
                if self.work is None:
                    self.work = torch.empty(self.images.shape, dtype=torch.float32)
                work = self.work[:n]
                work.copy_(images).mul_(self.scale).add_(self.bias)
                out[:n].copy_(work)
        else:
            self._acquire()  # where every sample went to the device decoder, the buffer stays unwritten
            slot, out, new = self.slot_number, self.images, self.new
            self.images = self.hwc = None  # hold no view of a lent buffer; the next batch takes another
        labels = np.array(self.labels[:n], dtype=np.int64)
        if self.batch_transform is not None:
            labels = self.batch_transform(out[:n], torch.from_numpy(labels)).numpy()
        message = RingMessage(self.worker, slot, n, out if new else None, labels, list(self.keys[:n]),
                              tuple(self.progress), jpegs=self.packer.take() if self.packer is not None else None)
        self.count = 0
        return message
