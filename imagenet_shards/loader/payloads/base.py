"""The contract a payload kind fulfils (see imagenet_shards/loader/payloads/__init__.py for the registry).

A payload kind is how one sample's payload reaches its batch slot: which member extensions it
decodes, and `into`, which writes the processed image into the slot through the ImagePipeline
(`image_into` for encoded images, `array_into` for HWC uint8 arrays, `tensor_into` for stored
tensors); and, for kinds that store decoded pixels, `pixels`, the stored image as an HWC uint8
array (for tools that show or compare samples: inspect, --same-as). `into` raises on a payload it cannot decode; the loader reports that sample as bad
(its exception type and message are the reason), so a decoder never needs its own error handling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class PayloadKind:
    name: str  # the `kind` of the loader's raw sample tuples (what a source kind yields)
    extensions: tuple  # the member extensions it decodes; () where only a source kind names it
    # into(pipeline, payload, slot, rng, bbox, source) -> None: `slot` an HWC uint8 view of the batch,
    # `rng` the worker's random.Random, `bbox` a usable normalised box or None, `source` the loader's Source
    into: Callable
    # pixels(payload, tensor_layout) -> HWC uint8 numpy array; None for encoded images (PIL opens those)
    pixels: Optional[Callable] = None
    # True where a payload may be a JPEG for jpeg_decode="device" (imagenet_shards/loader/device/device_batches.py)
    device_jpeg: bool = False
