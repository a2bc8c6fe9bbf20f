"""Encoded images (JPEG, PNG, WebP...): decoded by the ImagePipeline (the crop decode or PIL).

Also the kind of any member extension no other payload kind claims: PIL says what it cannot read.
"""

from __future__ import annotations

from imagenet_shards.loader.payloads.base import PayloadKind


def _image_into(pipeline, payload, slot, rng, bbox, source) -> None:
    pipeline.image_into(payload, slot, rng, bbox)


ENCODED = PayloadKind("encoded", ("jpg", "jpeg", "png", "webp", "ppm", "bmp"), _image_into, device_jpeg=True)
