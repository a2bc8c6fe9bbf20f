"""Crop, resize and flip a batch of decoded images on their device in two batched matrix products.

PIL's antialiased bilinear resize of a box (what the host path computes, `Image.resize(size,
BILINEAR, box=...)`) is separable: each output row is a weighted sum of input rows, each output
column a weighted sum of input columns, with the weights of a triangle filter whose support
widens with the downscale factor (PIL's `precompute_coeffs`). Written as matrices, one image's
result is `Wy @ image @ Wx.T`; a flip reverses the rows of `Wx`. For a batch, the pixels each
output reads (the box widened by the filter's support, "the window") are gathered into one padded
tensor, and the whole batch is two `matmul`s.

The decode thread shares the interpreter with the training loop, so the batch costs a fixed
handful of kernel launches, not a few per image: the images are concatenated into one flat buffer
(one `cat`), and every window row is one row of a sliding-window view of that buffer, picked by one
`index_select`. Window rows and columns past an image's window read neighbouring pixels, which the
weights (zero there) ignore. The weights are built on the device from a few numbers per sample
(box, image size, flip), sent in one copy, so nothing of the size of an image crosses from the host. Arithmetic is float32 without PIL's
rounding between its two passes, so pixels differ from PIL's by rounding (tests bound it).
Validation's Resize + CenterCrop is the same operation: the center window of the whole resize
is the resize of the matching box (`center_crop_box`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from imagenet_shards.loader.transform.pipeline import center_crop_offsets, resized_size

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


def _weights(bounds: torch.Tensor, flips: torch.Tensor, taps: int, length: int, out_size: int,
             dtype) -> torch.Tensor:
    """(B, out_size, length): PIL's bilinear coefficients of each output pixel over the window's
    input pixels (window start + 0 .. length-1), rows reversed where flipped. `bounds`: (5, B)
    float64 on the device, per sample the box's start and end, the first and last+1 pixel PIL
    clamps each span to (the image, or a cut crop's pixels), and the window's first pixel; `taps`:
    at least the most input pixels one output pixel reads (2 * support + 2).

    Each output pixel's `taps` coefficients are computed in float64 (PIL's arithmetic) from its
    first pixel, PIL's `xmin`; past PIL's `xmax` the triangle is zero anyway. They are then
    scattered into the dense rows the matrix product needs: a few small kernels and one pass over
    the dense matrix, not a dozen. Taps that fall outside the window (zero weights) go to a spare
    last column, which the returned view leaves out."""
    starts, ends, firsts, limits, window_starts = bounds[:, :, None, None].unbind(0)  # (B, 1, 1) each
    scale = (ends - starts) / out_size
    widen = torch.clamp(scale, min=1.0)
    outputs = torch.arange(out_size, dtype=torch.float64, device=bounds.device)[None, :, None]
    centers = starts + (outputs + 0.5) * scale  # (B, out_size, 1)
    centers = torch.where(flips[:, None, None], centers.flip(1), centers)
    first = torch.maximum(torch.floor(centers - SUPPORT * widen + 0.5), firsts)  # PIL's xmin
    pixels = first + torch.arange(taps, dtype=torch.float64, device=bounds.device)  # (B, out_size, taps)
    weights = torch.clamp(1.0 - ((pixels - centers + 0.5) / widen).abs(), min=0.0) * (pixels < limits)
    weights = weights / weights.sum(dim=2, keepdim=True).clamp(min=1e-12)
    columns = (pixels - window_starts).long()
    columns = torch.where((weights > 0) & (columns >= 0) & (columns < length), columns, length)
    dense = torch.zeros((len(weights), out_size, length + 1), dtype=dtype, device=bounds.device)
    return dense.scatter_(2, columns, weights.to(dtype))[:, :, :length]


def _row_starts(images: Sequence[torch.Tensor], x_low, y_low, window_height: int, device) -> torch.Tensor:
    """The flat offset of every window row, (B * window_height * 3,), the images end to end: row y
    of sample b's window, channel c, starts at its image's offset + (c * H + y_low + y) * W + x_low
    (rows past the image's last read its last row; the weights ignore them). Channels are the inner
    axis, so that both matrix products are plain batched ones: (B, rows * 3, columns)."""
    heights = np.array([image.shape[1] for image in images], dtype=np.int64)
    widths = np.array([image.shape[2] for image in images], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(3 * heights * widths)[:-1]))
    per_sample = torch.as_tensor(np.stack([offsets, heights, widths, y_low, x_low]), device=device)
    offset, height, width, first_row, first_column = per_sample[:, :, None, None].unbind(0)
    channels = torch.arange(3, device=device)[None, None, :]
    rows = torch.minimum(first_row + torch.arange(window_height, device=device)[None, :, None], height - 1)
    return (offset + (channels * height + rows) * width + first_column).view(-1)


class BatchResampler:
    """Resamples lists of decoded CHW uint8 images into (B, 3, size, size) uint8 batches on one
    device. Its staging buffers (the images end to end, the padded windows) grow to the largest batch seen
    and are then reused, so memory stays flat over an epoch."""

    def __init__(self, size: int, device):
        self.size = size
        self.device = torch.device(device)
        # float16 on a GPU (tensor cores): pixels 0..255 are exact in it and the weights keep 11
        # bits, a ~0.1-level error; float32 on the CPU, where half-precision products are slow.
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self._staging = torch.empty(0, dtype=self.dtype, device=self.device)  # the windows
        self._bytes = torch.empty(0, dtype=torch.uint8, device=self.device)  # the images, end to end
        self._flat = torch.empty(0, dtype=self.dtype, device=self.device)  # the same, in dtype

    def _grown(self, name: str, needed: int) -> torch.Tensor:
        buffer = getattr(self, name)
        if buffer.numel() < needed:
            buffer = torch.empty(needed, dtype=buffer.dtype, device=self.device)
            setattr(self, name, buffer)
        return buffer[:needed]

    def _windows(self, images, x_low, y_low, window_height: int, window_width: int) -> torch.Tensor:
        """(B, window_height * 3, window_width) in dtype: each sample's window, top-left aligned,
        row by row, the three channels of a row one after the other."""
        count = len(images)
        starts = _row_starts(images, x_low, y_low, window_height, self.device)
        total = sum(image.numel() for image in images)
        pixels = self._grown("_bytes", total)
        torch.cat([image.reshape(-1) for image in images], out=pixels)  # one kernel where dtypes agree
        flat = self._grown("_flat", total + window_width)  # the tail: the last rows may read past the end
        flat[:total].copy_(pixels)  # converted once, not once per padded window
        flat[total:].zero_()
        sliding = flat.as_strided((total + 1, window_width), (1, 1))  # row p: flat[p : p + window_width]
        windows = self._grown("_staging", starts.numel() * window_width).view(-1, window_width)
        torch.index_select(sliding, 0, starts, out=windows)
        return windows.view(count, window_height * 3, window_width)

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
        windows = self._windows(images, x_low, y_low, window_height, window_width)
        bounds = torch.as_tensor(np.stack([  # columns, then rows: one copy to the device
            np.stack([boxes[:, 0], boxes[:, 2], x_first, widths, x_low]),
            np.stack([boxes[:, 1], boxes[:, 3], y_first, heights, y_low])]), dtype=torch.float64, device=self.device)
        flips = torch.as_tensor(np.asarray(flips, dtype=bool), device=self.device)
        taps = 2 + int(np.ceil(2 * SUPPORT * max(1.0, ((boxes[:, 2:] - boxes[:, :2]) / self.size).max())))
        columns = _weights(bounds[0], flips, taps, window_width, self.size, self.dtype)
        rows = _weights(bounds[1], torch.zeros_like(flips), taps, window_height, self.size, self.dtype)
        across = torch.bmm(windows, columns.transpose(1, 2))  # (B, window_height * 3, size)
        result = torch.bmm(rows, across.view(count, window_height, 3 * self.size))  # (B, size, 3 * size)
        result = result.view(count, self.size, 3, self.size).permute(0, 2, 1, 3)  # (B, 3, size, size)
        out.copy_(result.add_(0.5).clamp_(0, 255))  # x + 0.5 is exact in float16 for 0..256; copy_ truncates
        return out


def mean_absolute_difference(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of two uint8 images, in levels."""
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


