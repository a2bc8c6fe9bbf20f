"""Decoded pixels: `.npy` tensors (the tensor format), `.pth` tensors (the reference harness's),
and in-memory arrays (synthetic samples)."""

from __future__ import annotations

import numpy as np

from imagenet_shards.formats.npy import decode_npy
from imagenet_shards.reference.pth import decode_pth
from imagenet_shards.loader.payloads.base import PayloadKind


def _npy_into(pipeline, payload, slot, rng, bbox, source) -> None:
    pipeline.tensor_into(payload, source.tensor_layout, slot, rng, bbox)


def _pth_into(pipeline, payload, slot, rng, bbox, source) -> None:
    # reference harness tensors: torch.load(weights_only=True), CHW uint8 only
    pipeline.array_into(decode_pth(payload), slot, rng, bbox)


def _array_into(pipeline, payload, slot, rng, bbox, source) -> None:
    pipeline.array_into(payload, slot, rng)


def _npy_pixels(payload, tensor_layout: str) -> np.ndarray:
    array = decode_npy(payload)
    return np.ascontiguousarray(array.transpose(1, 2, 0) if tensor_layout == "CHW" else array)


def _pth_pixels(payload, tensor_layout: str) -> np.ndarray:
    return np.ascontiguousarray(decode_pth(payload))  # decode_pth gives HWC whatever the layout


NPY = PayloadKind("npy", ("npy",), _npy_into, _npy_pixels)
PTH = PayloadKind("pth", ("pth",), _pth_into, _pth_pixels)
ARRAY = PayloadKind("array", (), _array_into, lambda payload, tensor_layout: payload)  # HWC uint8 numpy arrays a source kind yields as they are
