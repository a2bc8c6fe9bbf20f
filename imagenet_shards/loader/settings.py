"""get_data's arguments as one frozen, typed object, checked before any I/O (issue 46).

get_data builds a `LoaderSettings` from its arguments (the groups of imagenet_shards/loader/options.py, the
earlier keywords applied) and `checked()` refuses, one clear error each, whatever the arguments alone decide
(on_error, policy, batch_size, jpeg_decode="device" without device normalisation) before the source's
metadata or index is read; the checks that need the dataset (stored steps, the device pipeline) come right
after it is resolved, in image_loader.build_stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from imagenet_shards.launcher import Instance
from imagenet_shards.loader.device_batches import DEVICE_DECODE
from imagenet_shards.loader.global_order import order_setting
from imagenet_shards.loader.options import Cache, DataSource, Order
from imagenet_shards.loader.read_loop import ON_ERROR
from imagenet_shards.loader.share_plan import DEFAULT_POLICY, POLICIES, SPREAD
from imagenet_shards.normalization import Normalization, normalization_location

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoaderSettings:
    """What get_data was asked, its groups resolved to objects; the split's defaults follow from `train`."""

    source: DataSource
    transform: object  # the recipe (TrainCrop, ValidationCrop) or UserTransform: options.transform_setting
    normalization: Normalization
    cache: Optional[Cache]
    order: Order
    split: str
    batch_size: int
    instance: Instance
    seed: int = 0
    epoch: int = 0
    train: bool = True  # the split's defaults (recipe, policy, shuffle, drop_last) are train's
    on_error: str = "skip"
    jpeg_decode: Optional[str] = None
    batch_transform: object = None

    @property
    def policy(self) -> str:
        return self.order.policy or (DEFAULT_POLICY["train"] if self.train else DEFAULT_POLICY["validation"])

    @property
    def shuffle(self) -> bool:
        return self.train if self.order.shuffle is None else self.order.shuffle

    @property
    def drop_last(self) -> bool:
        return self.train if self.order.drop_last is None else self.order.drop_last

    @property
    def device_decode(self) -> bool:
        """Whether jpeg_decode asks for the device decoder (its batches are uint8, so normalised on the device)."""
        return self.jpeg_decode == DEVICE_DECODE

    def checked(self) -> "LoaderSettings":
        """Itself, or the first refusal the arguments alone decide (ValueError, one line each)."""
        if self.on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {', '.join(ON_ERROR)}, got {self.on_error!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; expected one of {', '.join(POLICIES)}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {self.batch_size}")
        if self.device_decode and normalization_location(self.normalization.location) != "device":
            raise ValueError("jpeg_decode='device' hands out uint8 batches decoded on the device: use "
                             "normalization='device' (and imagenet_shards.normalization.NormalizeOnDevice)")
        return self

    def train_order(self):
        """get_data's `order` as a global_order.GlobalOrder, or None: today's order, which validation ("spread",
        every sample exactly once per instance) keeps. The global order shuffles in its plan, so the
        workers' shuffle buffer is off under it (a buffer per worker would make the order depend on W)."""
        setting = order_setting(self.order.sequence)
        if setting is not None and self.policy == SPREAD:
            log.info("order=global applies to the train policies (drop, pad); policy spread keeps its exactly-once "
                     "order")
            return None
        return setting
