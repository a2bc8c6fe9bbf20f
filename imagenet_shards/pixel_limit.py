"""The one pixel limit of every decode path (issue 45): the native region decoder, PIL's whole-image decode,
the device path's header check and the converter all refuse an image whose header claims more pixels.

The setting: DATASETS_MAX_IMAGE_PIXELS in the environment (so DataLoader workers and subprocesses see it);
default PIL's Image.MAX_IMAGE_PIXELS (89,478,485, about 9459 x 9459). The check reads the header's
width and height only, before anything is allocated: O(1) per sample. A sample over the limit is an
ImageTooLargeError, which the loader reports per sample (skipped and named, or failing as on_error says)
and the converter skips and names (create_webdataset.py's --max-image-pixels, the same default).
"""

from __future__ import annotations

import os
from typing import Optional

from imagenet_shards.errors import DatasetError

VARIABLE = "DATASETS_MAX_IMAGE_PIXELS"
PIL_DEFAULT = 89_478_485  # PIL's Image.MAX_IMAGE_PIXELS, without importing PIL here


class ImageTooLargeError(DatasetError, ValueError):
    """An image whose header claims more pixels than the limit: not decoded."""


def max_pixels() -> int:
    """The limit in force: DATASETS_MAX_IMAGE_PIXELS, else PIL's default."""
    text = os.environ.get(VARIABLE)
    if text:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise DatasetError(f"{VARIABLE}={text!r}: not a positive number of pixels")
        return value
    return PIL_DEFAULT


def check_pixels(width: int, height: int, limit: Optional[int] = None) -> None:
    """ImageTooLargeError when `width` x `height` is over `limit` (None: max_pixels(); a decoder reads the setting
    once, off the per-sample path) in one line: the size and the limit."""
    limit = max_pixels() if limit is None else limit
    if width * height > limit:
        raise ImageTooLargeError(f"{width}x{height} = {width * height:,} pixels, over the limit of {limit:,} "
                                 f"({VARIABLE}): not decoded")
