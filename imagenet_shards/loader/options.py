"""get_data's option groups (issue 34): the source, the per-sample transform, the normalisation, the
shard cache and the order are one object each, so that get_data's signature stays short.

    from imagenet_shards.loader import Cache, DataSource, Normalization, Order, TrainCrop, get_data

    train = get_data(DataSource("/data/imagenet-wds", verify=False), "train", 64, 8,
                     transform=TrainCrop(image_size=176), normalization=Normalization("device", channels_last=True),
                     cache=Cache("/local/cache", limit="200G"), order=Order(shuffle_buffer=5000))

Each group takes a short form as well: a path, URL, shard list, "synthetic" or Mix for the source; "host",
"device" or "ipu" for the normalisation (imagenet_shards/normalization.py); a directory for the cache;
"shards", "global" or a GlobalOrder for the order; a torchvision transform for the transform.

The built-in recipes, `TrainCrop` and `ValidationCrop`, are the loader's own pipeline (fused into the
decoder, boxes drawn from the loader's per-sample generator), so they crop exactly as the keywords
they replace did for the same seed. The keywords of the earlier signature (cache_dir=, image_size=,
dtype=, verify=, shuffle_buffer= ...) still work for one release: `with_keywords` maps them onto the
groups and warns (DeprecationWarning) with the new form.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Optional

from imagenet_shards.normalization import Normalization

__all__ = ["Cache", "DataSource", "Normalization", "Order", "TrainCrop", "UserTransform", "ValidationCrop",
           "with_keywords"]


@dataclass(frozen=True)
class DataSource:
    """What to read and the settings that belong to it (as MosaicML Streaming's `Stream`).

    location          converted dataset dir or http(s)/s3 base URL; shard paths/URLs (brace patterns ok);
                      an ImageNet folder (holding train/ and validation/ or val/); "synthetic"; a Mix.
    verify            check every indexed payload's CRC32C as it is read (a mismatch is a bad sample).
    label_offset      TFRecord shards without metadata (TF-slim stores labels 1..1000): subtract this;
                      default: detected from the labels (a warning says which), an error if they cannot tell.
    synthetic_length  "synthetic": images per split (default 50,000 for validation, more for train).
    use_repartition   use the repartition distributed_webdataset.py made for this instance count.
    use_bbox_info     train: RandomResizedCrop prefers a crop overlapping the sample's bounding box by at
                      least 0.1 of its area, up to 10 draws (the reference harness's option).
    """

    location: object
    verify: bool = True
    label_offset: Optional[int] = None
    synthetic_length: Optional[int] = None
    use_repartition: bool = True
    use_bbox_info: bool = False

    @classmethod
    def of(cls, value) -> "DataSource":
        return value if isinstance(value, cls) else cls(value)


@dataclass(frozen=True)
class TrainCrop:
    """The built-in train recipe: RandomResizedCrop(image_size, scale, ratio) + a horizontal flip, run
    in the decoder; `use_draft`: crops at least twice the output are decoded at 1/2..1/8 scale."""

    image_size: int = 224
    scale: tuple = (0.08, 1.0)
    ratio: tuple = (3 / 4, 4 / 3)
    use_draft: bool = True
    train = True  # the pipeline's kind (imagenet_shards/loader/pipeline.py runtime_steps)

    def resize(self) -> int:
        return int(round(self.image_size * 256 / 224))  # unused by a train crop; the pipeline records it


@dataclass(frozen=True)
class ValidationCrop:
    """The built-in validation recipe: Resize(resize_size, default 256/224 of image_size) + CenterCrop(image_size)."""

    image_size: int = 224
    resize_size: Optional[int] = None
    use_draft: bool = True
    train = False
    scale, ratio = TrainCrop.scale, TrainCrop.ratio  # not drawn from; the pipeline records them

    def resize(self) -> int:
        return self.resize_size or int(round(self.image_size * 256 / 224))


@dataclass(frozen=True)
class UserTransform:
    """A torchvision v2 transform with the loader's settings for it (imagenet_shards/loader/user_transforms.py):
    `image_size` must equal its fused crop's size (a check) or, for a whole-image transform, is its output
    side; `resize_size` the side of the blank image its whole-image form is tried on; `use_draft` as
    TrainCrop's for the fused prefix. A bare transform is `UserTransform(transform)`."""

    transform: object
    image_size: Optional[int] = None
    resize_size: Optional[int] = None
    use_draft: bool = True


RECIPES = (TrainCrop, ValidationCrop)


def transform_setting(transform, train: bool):
    """get_data's `transform` as a TrainCrop, ValidationCrop or UserTransform (None: the split's recipe)."""
    if transform is None:
        return TrainCrop() if train else ValidationCrop()
    if isinstance(transform, (*RECIPES, UserTransform)):
        return transform
    return UserTransform(transform)


@dataclass(frozen=True)
class Cache:
    """The node's shard cache (docs/shard-cache.md): its `directory`, a size `limit` (bytes or "200G"),
    `remote_paths` (cache shards read by path from a network file system too) and `prefetch` (shards
    fetched ahead of the one being read)."""

    directory: object
    limit: object = None
    remote_paths: bool = False
    prefetch: int = 0

    @classmethod
    def of(cls, value) -> Optional["Cache"]:
        return value if value is None or isinstance(value, cls) else cls(value)


@dataclass(frozen=True)
class Order:
    """Which samples come when, as FFCV's Loader(order=): each default follows the split (train or not).

    policy          how instances share an epoch: "drop" | "pad" | "spread" (default drop for train,
                    spread otherwise; imagenet_shards/loader/share_plan.py).
    shuffle         shards permuted per (seed, epoch) and samples through the buffer (default: train).
    drop_last       the last partial batch is dropped and its keys reported (default: train).
    shuffle_buffer  samples each worker shuffles among (train; 0 or 1: the plan's order).
    sequence        "shards" (the above; None says the same) or "global" / GlobalOrder(global_batch_size=G,
                    partitions=P): the same global batches whatever the instance and worker counts
                    (imagenet_shards/loader/global_order.py).
    """

    policy: Optional[str] = None
    shuffle: Optional[bool] = None
    drop_last: Optional[bool] = None
    shuffle_buffer: int = 1000
    sequence: object = None

    @classmethod
    def of(cls, value) -> "Order":
        """An Order from get_data's argument: one, None, or a sequence ("shards", "global", a GlobalOrder)."""
        return value if isinstance(value, cls) else cls(sequence=value)


# -- the earlier keywords -------------------------------------------------------------------------

# keyword of the earlier get_data -> (group, field)
KEYWORDS = {
    "verify": ("source", "verify"), "label_offset": ("source", "label_offset"),
    "synthetic_length": ("source", "synthetic_length"), "use_repartition": ("source", "use_repartition"),
    "use_bbox_info": ("source", "use_bbox_info"),
    "image_size": ("transform", "image_size"), "resize_size": ("transform", "resize_size"),
    "scale": ("transform", "scale"), "ratio": ("transform", "ratio"), "use_draft": ("transform", "use_draft"),
    "dtype": ("normalization", "dtype"), "mean": ("normalization", "mean"), "std": ("normalization", "std"),
    "channels_last": ("normalization", "channels_last"),
    "cache_dir": ("cache", "directory"), "cache_limit": ("cache", "limit"),
    "cache_remote_paths": ("cache", "remote_paths"), "cache_prefetch": ("cache", "prefetch"),
    "policy": ("order", "policy"), "shuffle": ("order", "shuffle"), "drop_last": ("order", "drop_last"),
    "shuffle_buffer": ("order", "shuffle_buffer"),
}
NONE_IS_DEFAULT = {"image_size", "resize_size"}  # the earlier get_data read None as "the default" there


def with_keywords(groups: dict, keywords: dict) -> dict:
    """`groups` ({"source": DataSource, "transform": ..., "normalization": Normalization, "cache": Cache or
    None, "order": Order}) with the earlier keywords applied; one DeprecationWarning per group naming its
    new form. TypeError for a keyword get_data never had, as Python gives."""
    unknown = sorted(set(keywords) - set(KEYWORDS))
    if unknown:
        raise TypeError(f"get_data() got an unexpected keyword argument {unknown[0]!r}")
    fields = {}
    for name, value in keywords.items():
        group, field = KEYWORDS[name]
        fields.setdefault(group, {})[field] = value
    groups = dict(groups)
    for group, values in fields.items():
        groups[group] = _applied(group, groups[group], values)
        old = ", ".join(f"{name}=" for name, (g, _) in KEYWORDS.items() if g == group and name in keywords)
        warnings.warn(f"get_data({old}) is deprecated and goes in the next release: use {_new_form(group, groups)}",
                      DeprecationWarning, stacklevel=3)
    return groups


def _applied(group: str, current, values: dict):
    """`current` (a group's object) with the earlier keywords' `values` as its fields."""
    if group == "transform":
        values = {k: v for k, v in values.items() if not (k in NONE_IS_DEFAULT and v is None)}
        # a keyword the recipe has no use for (scale for validation) is ignored, as it was
        names = {f.name for f in dataclasses.fields(current)}
        return dataclasses.replace(current, **{k: v for k, v in values.items() if k in names})
    if group == "cache":
        if current is None:
            return Cache(**values) if values.get("directory") is not None else None
        return dataclasses.replace(current, **values)
    return dataclasses.replace(current, **values)


def _new_form(group: str, groups: dict) -> str:
    """The group's new form in a warning: its class and the fields that differ from their defaults."""
    value = groups[group]
    if value is None:
        return "cache=Cache(directory, ...)"
    fields = [f for f in dataclasses.fields(value) if f.init]
    shown = [f"{f.name}={getattr(value, f.name)!r}" for f in fields[1:] if getattr(value, f.name) != f.default]
    if group == "source":
        return f"{type(value).__name__}(source, {', '.join(shown)}) as the first argument"
    if isinstance(value, UserTransform):
        return f"transform=UserTransform(transform, {', '.join(shown)})"
    first = fields[0]
    head = [f"{first.name}={getattr(value, first.name)!r}"] if getattr(value, first.name) != first.default else []
    return f"{group}={type(value).__name__}({', '.join(head + shown)})"
