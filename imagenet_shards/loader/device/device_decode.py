"""`jpeg_decode="device"`, the main process's half: a batch's JPEGs decoded on the accelerator.

The workers send each batch's JPEG bytes with their crop boxes and flips (imagenet_shards/loader/
device_batches.py). Here one call decodes the batch on the device, nvJPEG through torchvision's
batched `decode_jpeg(list, device=...)` (the hardware JPEG engines where the GPU has them), and
`BatchResampler` crops, resizes and flips it in two batched matrix products. Rows the workers
decoded on the host (JPEGs the device decoder does not take) are copied in. The result is uint8
NCHW on the device, as `NormalizeOnDevice` expects; a batch transform (MixUp, CutMix) runs on it
with the torch generator state its worker would have used.

Decoding runs one batch ahead in a thread of its own, on a CUDA stream of its own, so the
decoder's work overlaps the training step that uses the batch before.

Without CUDA the same path runs with a CPU stand-in decoder (PIL, a full-scale decode like
nvJPEG's) on the CPU device, and says so once: CI tests the packing, boxes, order and assembly.
"""

from __future__ import annotations

import collections
import io
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Optional

import numpy as np
import torch
from PIL import Image

from imagenet_shards.loader.device.device_batches import NO_BUFFER, DeviceJpegs
from imagenet_shards.loader.device.device_resample import BatchResampler

log = logging.getLogger(__name__)
_said_stand_in = False


def decode_device(device=None) -> torch.device:
    """The device `jpeg_decode="device"` decodes on: `device`, else cuda:LOCAL_RANK under a launcher,
    else the current CUDA device; the CPU (the stand-in decoder) where there is no CUDA."""
    if device is not None:
        return torch.device(device)
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = os.environ.get("LOCAL_RANK")
    return torch.device("cuda", int(local_rank) if local_rank is not None else torch.cuda.current_device())


class JpegDecoder:
    """Decodes lists of JPEGs (1-D uint8 CPU tensors) into CHW uint8 RGB tensors on one device."""

    def __init__(self, device: torch.device):
        global _said_stand_in
        self.device = device
        self.on_cuda = device.type == "cuda"
        if self.on_cuda:
            from imagenet_shards.torchvision_cpu import torchvision
            self._decode_jpeg, self._rgb = torchvision.io.decode_jpeg, torchvision.io.ImageReadMode.RGB
        elif not _said_stand_in:
            _said_stand_in = True
            log.warning("jpeg_decode='device' without a CUDA device: JPEGs are decoded in the main process "
                        "by the CPU stand-in decoder (PIL), for testing; use a GPU for speed")

    def decode(self, jpegs: list) -> list:
        """One call for the batch; raises if any JPEG fails (`decode_each` finds which)."""
        if self.on_cuda:
            return self._decode_jpeg(jpegs, mode=self._rgb, device=self.device)
        return [self._stand_in(jpeg) for jpeg in jpegs]

    def decode_each(self, jpegs: list) -> list:
        """Each JPEG on its own: its image, or the exception that stopped it."""
        results = []
        for jpeg in jpegs:
            try:
                results.append(self.decode([jpeg])[0])
            except Exception as error:  # the decoder's own words name what is wrong with this sample
                results.append(error)
        return results

    @staticmethod
    def _stand_in(jpeg: torch.Tensor) -> torch.Tensor:
        with Image.open(io.BytesIO(jpeg.numpy().tobytes())) as image:
            pixels = np.array(image.convert("RGB"))
        return torch.from_numpy(pixels).permute(2, 0, 1)


class Assembled(NamedTuple):
    images: torch.Tensor  # uint8 NCHW on the device (rows of failed samples left out)
    labels: torch.Tensor
    keys: list
    failed: list  # (key, shard, reason) of samples the device could not decode


class DeviceBatches:
    """Turns a worker's batch (host rows in the image buffer, JPEG bytes for the rest) into a device batch."""

    def __init__(self, size: int, device: torch.device, channels_last: bool = False, batch_transform=None):
        self.size, self.device, self.channels_last = size, device, channels_last
        self.decoder = JpegDecoder(device)
        self.resampler = BatchResampler(size, device)
        self.batch_transform = batch_transform  # user_transforms.BatchTransform or None
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.milliseconds = collections.deque(maxlen=10_000)  # the decode thread's time per batch
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="device-decode")

    def submit(self, host_images: torch.Tensor, labels: torch.Tensor, keys: list, jpegs: DeviceJpegs,
               buffer: Optional[torch.Tensor]):
        """Start assembling a batch in the decode thread; `.result()` of the returned future is `Assembled`."""
        return self._pool.submit(self._assemble_on_stream, host_images, labels, keys, jpegs, buffer)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _assemble_on_stream(self, *args) -> Assembled:
        started = time.perf_counter()
        if self.stream is None:
            result = self.assemble(*args)
        else:
            with torch.cuda.stream(self.stream):
                result = self.assemble(*args)
            self.stream.synchronize()  # the ring's buffers it read may go back to the workers after this
        self.milliseconds.append(1e3 * (time.perf_counter() - started))
        return result

    def _empty(self, count: int) -> torch.Tensor:
        shape = (count, self.size, self.size, 3) if self.channels_last else (count, 3, self.size, self.size)
        out = torch.empty(shape, dtype=torch.uint8, device=self.device)
        return out.permute(0, 3, 1, 2) if self.channels_last else out

    def assemble(self, host_images, labels, keys, jpegs: DeviceJpegs, buffer) -> Assembled:
        count = len(keys)
        out = self._empty(count)
        rows = jpegs.rows
        if len(rows) < count:  # some rows were decoded on the host: bring the whole batch, then overwrite
            out.copy_(host_images[:count], non_blocking=True)
        failed, keep = [], None
        if len(rows):
            offsets = jpegs.offsets  # one call splits the buffer into each JPEG's bytes (views)
            data = list(buffer[offsets[0]:offsets[-1]].tensor_split((offsets[1:-1] - offsets[0]).tolist()))
            try:
                decoded = self.decoder.decode(data)
            except Exception:  # find the sample(s) that failed; the others are decoded alone
                decoded = self.decoder.decode_each(data)
            bad = [i for i, image in enumerate(decoded) if isinstance(image, Exception)]
            if bad:
                failed = [(keys[rows[i]], jpegs.shards[i], f"device decode: {decoded[i]}") for i in bad]
                good = [i for i in range(len(rows)) if i not in set(bad)]
                decoded = [decoded[i] for i in good]
                rows, boxes, flips = rows[good], jpegs.boxes[good], jpegs.flips[good]
                keep = np.setdiff1d(np.arange(count), jpegs.rows[bad])
            else:
                boxes, flips = jpegs.boxes, jpegs.flips
            if len(rows) == count and not self.channels_last:
                self.resampler(decoded, boxes, flips, clip=jpegs.clip, out=out)
            elif len(rows):
                index = torch.as_tensor(rows.astype(np.int64), device=self.device)
                out.index_copy_(0, index, self.resampler(decoded, boxes, flips, clip=jpegs.clip))
        if keep is not None:
            out = out[torch.as_tensor(keep, device=self.device)]
            labels = labels[torch.as_tensor(keep)]
            keys = [keys[i] for i in keep]
        if self.batch_transform is not None and len(keys):
            labels = self._batch_transform(out, labels, jpegs.torch_state)
        return Assembled(out, labels, keys, failed)

    def _batch_transform(self, images, labels, state) -> torch.Tensor:
        """The batch transform with the generator state its worker had at the end of the batch."""
        saved = torch.get_rng_state()
        if state is not None:
            torch.set_rng_state(torch.from_numpy(state))
        try:  # as user_transforms.BatchTransform on a uint8 batch: in float, rounded back into the batch
            out, labels = self.batch_transform.transform(images.to(torch.float32), labels)
            images.copy_(out.round_().clamp_(0, 255))
            return labels
        finally:
            torch.set_rng_state(saved)


def buffer_of(jpegs: DeviceJpegs, ring) -> Optional[torch.Tensor]:
    """The byte buffer a batch's JPEGs are in, received through `ring` (a BatchRing) like an image buffer."""
    if jpegs.slot == NO_BUFFER:
        return None
    return ring.receive_buffer(jpegs.slot, jpegs.buffer)
