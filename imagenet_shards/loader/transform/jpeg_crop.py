"""Decode only the part of a JPEG that a crop needs: the native `_jpeg_crop` module (native/jpeg_crop/).

scripts/setup_venv.sh builds `_jpeg_crop` against the system libjpeg-turbo, after pillow-simd.
When it is missing (build failed, not installed), `available()` is False and the loader decodes
whole images with PIL, as before. `DATASETS_JPEG_DECODE=pil` forces that path (benchmarks
compare both).

How a region is decoded (`decode_region`): libjpeg decodes, at 1/1, 1/2, 1/4 or 1/8 scale, the
rows and columns covering the region (columns widened to iMCU boundaries, rows above skipped,
decoding stopped after the last row) and writes them into a canvas the size of the WHOLE scaled
image, at the places a full decode would put them. The canvas is then resampled with the same
geometry as a full decode, so the arithmetic (box, filter bounds, weights) is the same as PIL's on
a fully decoded image; only pixels that the resize reads have to be decoded (`resample_span`).
Decoding settings equal PIL's default JPEG decode (JDCT_ISLOW, fancy upsampling, the colour
space libjpeg infers), so the decoded pixels are equal too, except in the outermost column and
row of a cut (fancy upsampling replicates the edge there): `resample_span` leaves a margin.

How it is resized (`Canvas.resize_into`): the native `resize_into` computes PIL's bilinear
`resize(size, box=...)` of the canvas, or of a cut of it (`crop(cut)` first, as a user's
torchvision RandomResizedCrop reads only the box's pixels), with pillow-simd 12's coefficients,
fixed-point precision and integer sums (native/jpeg_crop/resample.h), but only a window of its
output, written straight into the batch slot (any strides, mirrored for a flip). Train's
RandomResizedCrop is the resize of the crop box; validation's Resize + CenterCrop is one resize
of the whole scaled image of which the center window is computed: the crop's pixels of the full
resize, without resizing what the crop drops. tests/test_jpeg_crop.py and
tests/test_validation_decode.py compare both paths with PIL's whole outputs.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np
from PIL import Image

from imagenet_shards.errors import Error
from imagenet_shards.pixel_limit import check_pixels

try:
    from imagenet_shards import _jpeg_crop as _native
except ImportError as error:  # not built: the loader decodes whole images with PIL
    _native = None
    UNAVAILABLE_REASON = (f"{error}: `pip install .` builds it where libjpeg-turbo's headers are installed "
                          f"(libjpeg62-turbo-dev, libjpeg-turbo8-dev or libjpeg-turbo-devel); make builds it into .venv")
else:
    UNAVAILABLE_REASON = ""
_noted = False


def note_unavailable_once() -> None:
    """Say once per process, in one log line, that JPEGs decode whole with PIL because `_jpeg_crop` is missing."""
    global _noted
    if _native is None and not _noted:
        _noted = True
        logging.getLogger(__name__).warning(
            "imagenet_shards: JPEGs are decoded whole with PIL (slower): the native decoder is not built (%s)",
            UNAVAILABLE_REASON)

FORCE_ENV = "DATASETS_JPEG_DECODE"  # "pil": decode whole images with PIL even where _jpeg_crop is built
CROP, PIL_FULL = "crop", "pil"
BILINEAR_SUPPORT = 1.0  # PIL's bilinear filter support, scaled by max(1, downscale factor)
EDGE_MARGIN = _EDGE_MARGIN = 3  # px beyond what PIL reads: covers the cut's outermost pixel (fancy upsampling) with slack
_EOI_TAIL = 1024  # bytes at the end searched for the End Of Image marker
_CANVAS_LIMIT = 64 << 20  # bytes of canvas kept between calls (per thread); larger ones are freed


class JpegError(Error, OSError):
    """libjpeg could not decode the data (its message says why)."""


_NativeJpegError = _native.JpegError if _native is not None else JpegError
_SUPPORTED_SPACES = ((_native.JCS_GRAYSCALE, _native.JCS_RGB, _native.JCS_YCbCr) if _native is not None else ())


def available() -> bool:
    """Whether `_jpeg_crop` is built and importable."""
    return _native is not None


def decode_path() -> str:
    """The JPEG decode path this process uses: "crop" (region decode: train crops, validation's center
    crop) or "pil" (whole image)."""
    if _native is None or os.environ.get(FORCE_ENV, "").strip().lower() == PIL_FULL:
        return PIL_FULL
    return CROP


def jpeg_size(data, limit: Optional[int] = None) -> Optional[tuple]:
    """(width, height) of a JPEG (bytes or any buffer) this module decodes, else None (not a JPEG, CMYK/YCCK, unreadable
    header, or no End Of Image marker near the end: a truncated file is left to PIL, which reports it
    even where the crop would not reach the missing part)."""
    # bytes(): `in` on a memoryview (the shard readers' payloads) compares single items, not substrings
    if _native is None or bytes(data[:2]) != b"\xff\xd8" or b"\xff\xd9" not in bytes(data[-_EOI_TAIL:]):
        return None
    try:
        width, height, space = _native.header(data)
    except _NativeJpegError:
        return None
    check_pixels(width, height, limit)  # before any canvas is allocated (ImageTooLargeError: this sample's error)
    return (width, height) if space in _SUPPORTED_SPACES else None


def dct_scale(width: int, height: int, want_width: float, want_height: float) -> int:
    """The scale denominator PIL's `Image.draft(mode, (ceil(want_width), ceil(want_height)))` picks."""
    request = (max(1, math.ceil(want_width)), max(1, math.ceil(want_height)))
    ratio = min(width // request[0], height // request[1])
    return next(s for s in (8, 4, 2, 1) if ratio >= s)


def resample_span(start: float, end: float, out_size: int, limit: int) -> tuple:
    """[first, last) pixels to decode so that PIL's bilinear resample of [start, end) to `out_size`
    reads only decoded, full-decode-equal pixels (clamped to [0, limit))."""
    support = BILINEAR_SUPPORT * max(1.0, (end - start) / out_size)
    return (max(0, math.floor(start - support) - _EDGE_MARGIN),
            min(limit, math.ceil(end + support) + _EDGE_MARGIN))


_local = threading.local()


def _canvas(nbytes: int) -> np.ndarray:
    """A flat uint8 scratch buffer of at least `nbytes`, reused by this thread (no page faults per image)."""
    buffer = getattr(_local, "canvas", None)
    if buffer is None or buffer.size < nbytes:
        buffer = np.empty(max(nbytes, 1 << 20), np.uint8)
        if nbytes <= _CANVAS_LIMIT:
            _local.canvas = buffer
    return buffer[:nbytes]


@dataclass(frozen=True)
class Canvas:
    """A region decoded into a canvas of the whole scaled image (RGBX, `width` x `height`): only
    the pixels inside `written` = (xs, ys, xe, ye) are defined. Shares memory with a per-thread
    buffer unless given one: use it before the next decode on this thread."""

    buffer: np.ndarray
    width: int
    height: int
    written: tuple

    def image(self) -> Image.Image:
        return Image.frombuffer("RGBX", (self.width, self.height), self.buffer, "raw", "RGBX", 0, 1)

    def resize_into(self, out: np.ndarray, size: tuple, box: Optional[tuple] = None, offset: tuple = (0, 0),
                    flip: bool = False, cut: Optional[tuple] = None) -> None:
        """Write into `out` (an (h, w, 3) uint8 array, any strides) the window at `offset` = (left, top)
        of `self.image().resize(size, Image.BILINEAR, box=box)`, columns mirrored if `flip`: the same
        pixels, only the window computed (box None: the whole image). `cut` = (x0, y0, x1, y1): resize
        `self.image().crop(cut)` instead (box in the cut's coordinates), reading no pixel outside it;
        as PIL's crop, a cut past the right or bottom edge is black there."""
        x0, y0, x1, y1 = cut or (0, 0, self.width, self.height)
        if not (0 <= x0 < x1 and 0 <= y0 < y1 and x0 < self.width and y0 < self.height):
            raise ValueError(f"cut {cut} is not inside the {self.width}x{self.height} canvas")
        box = box or (0.0, 0.0, float(x1 - x0), float(y1 - y0))
        buffer, x, y, stride = self.buffer, x0, y0, self.width
        if x1 > self.width or y1 > self.height:
            # A train box whose DCT-scaled right/bottom edge rounds up past the image (right * scaled / width
            # just over an integer): PIL's crop pads with black, and the filter reads that column or row.
            padded = np.zeros((y1 - y0, x1 - x0, 4), np.uint8)
            inside = self.buffer[:self.width * self.height * 4].reshape(self.height, self.width, 4)[y0:y1, x0:x1]
            padded[:inside.shape[0], :inside.shape[1]] = inside
            buffer, x, y, stride = padded.reshape(-1), 0, 0, x1 - x0
        _native.resize_into(buffer, x1 - x0, y1 - y0, *box, size[0], size[1], offset[0], offset[1],
                            out, flip, x, y, stride)


def array_canvas(pixels: np.ndarray, region: tuple) -> Canvas:
    """A `Canvas` of an HWC uint8 array (any strides) with only `region` = (x0, y0, x1, y1) copied in (the
    pixels a resize reads): the native resize of decoded arrays (`tensor` payloads), as of decoded JPEGs."""
    height, width = pixels.shape[:2]
    x0, y0, x1, y1 = region
    buffer = _canvas(width * height * 4)
    buffer.reshape(height, width, 4)[y0:y1, x0:x1, :3] = pixels[y0:y1, x0:x1]
    return Canvas(buffer, width, height, region)


def decode_canvas(data, scale: int, x0: int, y0: int, x1: int, y1: int, size: Optional[tuple] = None,
                  canvas: Optional[np.ndarray] = None) -> Optional[Canvas]:
    """Decode the region [x0, x1) x [y0, y1) of the image scaled by 1/`scale` (1, 2, 4 or 8) into a
    `Canvas` of the whole scaled size (ceil(width / scale), ceil(height / scale)); its pixels inside
    `written`, a rectangle containing the region, equal a full decode's (up to the outermost
    column/row of a cut). The canvas is a per-thread buffer, or `canvas` (a uint8 array of at
    least that many RGBX pixels). None when the colour space is not decoded here (CMYK, YCCK).
    `size` = (width, height) saves reading the header twice. Raises JpegError for data libjpeg
    cannot decode or that ends early.
    """
    if _native is None:
        raise JpegError(f"_jpeg_crop is not available: {UNAVAILABLE_REASON}")
    try:
        if size is None:  # (a size given came from jpeg_size, which checked it)
            size = _native.header(data)[:2]
            check_pixels(*size)
        width, height = size
        out_width, out_height = -(-width // scale), -(-height // scale)
        nbytes = out_width * out_height * 4
        buffer = _canvas(nbytes) if canvas is None else canvas.reshape(-1)[:nbytes]
        written = _native.decode_into(data, buffer, scale, x0, y0, x1, y1)
    except _NativeJpegError as error:
        raise JpegError(str(error)) from None
    return None if written is None else Canvas(buffer, out_width, out_height, written)


def decode_region(data, scale: int, x0: int, y0: int, x1: int, y1: int, size: Optional[tuple] = None,
                  canvas: Optional[np.ndarray] = None):
    """`decode_canvas` as (image, written): `image` an RGBX PIL image of the whole scaled size sharing
    the canvas's memory. None when the colour space is not decoded here (CMYK, YCCK)."""
    decoded = decode_canvas(data, scale, x0, y0, x1, y1, size, canvas)
    return None if decoded is None else (decoded.image(), decoded.written)
