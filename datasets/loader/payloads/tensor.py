"""Decoded pixels: `.npy` tensors (the tensor format), `.pth` tensors (the reference harness's),
and in-memory arrays (synthetic samples)."""

from __future__ import annotations

from datasets.reference.pth import decode_pth
from datasets.loader.payloads.base import PayloadKind


def _npy_into(pipeline, payload, slot, rng, bbox, source) -> None:
    pipeline.tensor_into(payload, source.tensor_layout, slot, rng, bbox)


def _pth_into(pipeline, payload, slot, rng, bbox, source) -> None:
    # reference harness tensors: torch.load(weights_only=True), CHW uint8 only
    pipeline.array_into(decode_pth(payload), slot, rng, bbox)


def _array_into(pipeline, payload, slot, rng, bbox, source) -> None:
    pipeline.array_into(payload, slot, rng)


NPY = PayloadKind("npy", ("npy",), _npy_into)
PTH = PayloadKind("pth", ("pth",), _pth_into)
ARRAY = PayloadKind("array", (), _array_into)  # HWC uint8 numpy arrays a source kind yields as they are
