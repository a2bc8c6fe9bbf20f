"""Crop, resize and flip a batch of decoded images on their device in two batched matrix products.

PIL's antialiased bilinear resize of a box (what the host path computes, `Image.resize(size,
BILINEAR, box=...)`) is separable: each output row is a weighted sum of input rows, each output
column a weighted sum of input columns, with the weights of a triangle filter whose support
widens with the downscale factor (PIL's `precompute_coeffs`). Written as matrices, one image's
result is `Wy @ image @ Wx.T`; a flip reverses the rows of `Wx`. For a batch, the pixels each
output reads (the box widened by the filter's support, "the window") are copied into one padded
tensor, and the whole batch is two `matmul`s: no kernel per output pixel row and no Python per pixel.

The weights are built on the device from a few numbers per sample (box, image size, flip), so
nothing of the size of an image crosses from the host. Arithmetic is float32 without PIL's
rounding between its two passes, so pixels differ from PIL's by rounding (tests bound it).
Validation's Resize + CenterCrop is the same operation: the center window of the whole resize
is the resize of the matching box (`center_crop_box`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from datasets.loader.pipeline import center_crop_offsets, resized_size

SUPPORT = 1.0  # PIL's bilinear filter support, scaled by max(1, downscale factor)


def center_crop_box(width: int, height: int, resize: int, size: int) -> tuple:
    """(x0, y0, x1, y1) in the image's pixels whose resize to `size` is Resize(resize) + CenterCrop(size)."""
    out_width, out_height = resized_size(width, height, resize)
    top, left = center_crop_offsets(out_width, out_height, size)
    fx, fy = width / out_width, height / out_height
    return left * fx, top * fy, (left + size) * fx, (top + size) * fy


def crop_box(top: int, left: int, h: int, w: int) -> tuple:
    """A RandomResizedCrop box (top, left, height, width) as (x0, y0, x1, y1)."""
    return float(left), float(top), float(left + w), float(top + h)


def _spans(starts: np.ndarray, ends: np.ndarray, firsts: np.ndarray, limits: np.ndarray, out_size: int):
    """Per sample, the first and last+1 input pixel any output pixel reads (PIL's xmin/xmax bounds),
    within [firsts, limits): the image, or the pixels enclosing the box where the crop is cut first."""
    scale = (ends - starts) / out_size
    support = SUPPORT * np.maximum(scale, 1.0)
    first_center = starts + 0.5 * scale
    last_center = starts + (out_size - 0.5) * scale
    low = np.maximum(np.trunc(first_center - support + 0.5), firsts).astype(np.int64)
    high = np.minimum(np.trunc(last_center + support + 0.5), limits).astype(np.int64)
    return low, np.maximum(high, low + 1)


def _weights(starts, ends, firsts, limits, window_starts, length: int, out_size: int, flips, device,
             dtype) -> torch.Tensor:
    """(B, out_size, length): PIL's bilinear coefficients of each output pixel over the window's
    input pixels (window_starts[b] + 0 .. length-1), rows reversed where flipped. PIL clamps each
    pixel's span to the image; `firsts`/`limits` are those bounds (a cut crop's, where clipped)."""
    as_tensor = lambda values: torch.as_tensor(values, dtype=torch.float64, device=device)[:, None, None]
    starts, ends, firsts, limits, window_starts = map(as_tensor, (starts, ends, firsts, limits, window_starts))
    scale = (ends - starts) / out_size
    widen = torch.clamp(scale, min=1.0)
    support = SUPPORT * widen
    outputs = torch.arange(out_size, dtype=torch.float64, device=device)[None, :, None]
    centers = starts + (outputs + 0.5) * scale
    # PIL: xmin = max(int(center - support + 0.5), 0) (relative to the cut when clipped: the same bound)
    low = torch.maximum(torch.trunc(centers - support + 0.5 - firsts) + firsts, firsts)
    high = torch.minimum(torch.trunc(centers + support + 0.5 - firsts) + firsts, limits)
    pixels = window_starts + torch.arange(length, dtype=torch.float64, device=device)[None, None, :]
    weights = torch.clamp(1.0 - ((pixels - centers + 0.5) / widen).abs(), min=0.0)
    weights = weights * ((pixels >= low) & (pixels < high))
    weights = weights / weights.sum(dim=2, keepdim=True).clamp(min=1e-12)
    flips = torch.as_tensor(np.asarray(flips, dtype=bool), device=device)
    weights = torch.where(flips[:, None, None], weights.flip(1), weights)
    return weights.to(dtype)


class BatchResampler:
    """Resamples lists of decoded CHW uint8 images into (B, 3, size, size) uint8 batches on one
    device. Its staging buffer (the padded windows) grows to the largest batch seen and is then
    reused, so memory stays flat over an epoch."""

    def __init__(self, size: int, device):
        self.size = size
        self.device = torch.device(device)
        # float16 on a GPU (tensor cores): pixels 0..255 are exact in it and the weights keep 11
        # bits, a ~0.1-level error; float32 on the CPU, where half-precision products are slow.
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self._staging = torch.empty(0, dtype=self.dtype, device=self.device)

    def _windows(self, count: int, height: int, width: int) -> torch.Tensor:
        needed = count * 3 * height * width
        if self._staging.numel() < needed:
            self._staging = torch.empty(needed, dtype=self.dtype, device=self.device)
        return self._staging[:needed].view(count, 3, height, width)

    def __call__(self, images: Sequence[torch.Tensor], boxes: np.ndarray, flips: np.ndarray, clip: bool = False,
                 out: torch.Tensor = None) -> torch.Tensor:
        """`images`: CHW uint8 tensors (3 channels) on the device; `boxes`: (B, 4) float (x0, y0,
        x1, y1) in each image's pixels; `flips`: (B,) bool; `clip`: read only the pixels enclosing
        the box (torchvision's crop, then resize), else the filter may reach past it as PIL's
        `resize(box=)` does. Returns (B, 3, size, size) uint8 (or writes `out`, any strides)."""
        count = len(images)
        if out is None:
            out = torch.empty((count, 3, self.size, self.size), dtype=torch.uint8, device=self.device)
        if count == 0:
            return out
        boxes = np.asarray(boxes, dtype=np.float64).reshape(count, 4)
        widths = np.array([image.shape[2] for image in images], dtype=np.int64)
        heights = np.array([image.shape[1] for image in images], dtype=np.int64)
        if clip:
            x_first, y_first = np.floor(boxes[:, 0]), np.floor(boxes[:, 1])
            widths, heights = np.minimum(np.ceil(boxes[:, 2]), widths), np.minimum(np.ceil(boxes[:, 3]), heights)
        else:
            x_first = y_first = np.zeros(count)
        x_low, x_high = _spans(boxes[:, 0], boxes[:, 2], x_first, widths, self.size)
        y_low, y_high = _spans(boxes[:, 1], boxes[:, 3], y_first, heights, self.size)
        window_width, window_height = int((x_high - x_low).max()), int((y_high - y_low).max())
        windows = self._windows(count, window_height, window_width)
        windows.zero_()
        for index, image in enumerate(images):  # one strided copy (and uint8 -> float) per image
            x0, x1, y0, y1 = int(x_low[index]), int(x_high[index]), int(y_low[index]), int(y_high[index])
            windows[index, :, :y1 - y0, :x1 - x0].copy_(image[:, y0:y1, x0:x1])
        columns = _weights(boxes[:, 0], boxes[:, 2], x_first, widths, x_low, window_width, self.size, flips,
                           self.device, self.dtype)
        rows = _weights(boxes[:, 1], boxes[:, 3], y_first, heights, y_low, window_height, self.size,
                        np.zeros(count, bool), self.device, self.dtype)
        across = torch.matmul(windows, columns.transpose(1, 2).unsqueeze(1))  # (B, 3, window_height, size)
        result = torch.matmul(rows.unsqueeze(1), across)  # (B, 3, size, size)
        out.copy_(result.float().add_(0.5).clamp_(0, 255).to(torch.uint8))
        return out


def mean_absolute_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two uint8 images, in levels."""
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


