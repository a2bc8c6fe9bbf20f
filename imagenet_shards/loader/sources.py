"""What a `source` argument names, resolved into groups of samples the planner can deal.

    converted dataset   a directory or http(s) base URL holding metadata.json and
                        its sample indexes (made by create_webdataset.py); groups = shards.
                        A repartition for the instance count (distributed/<N>-instances/
                        manifest.json, made by distributed_webdataset.py) is used when present.
    TFRecord shards     a folder (or list) of TF-slim shards (train-00000-of-01024 ...) without
                        metadata: indexed from their record headers (or .tfindex files), and the
                        label offset (TF-slim stores 1..1000) given or detected, never silent.
    shard list          paths, URLs or brace patterns of tar shards. When the shards' folder holds
                        a converted dataset's metadata and index, those are used; otherwise each
                        shard's headers are scanned once to index it (exact balancing still holds,
                        at the cost of one pass over the headers: a warning says so).
    ImageNet folder     the extracted layout (<root>/<split>/<class>/<image>, `val` accepted for
                        `validation`), with torchvision ImageFolder semantics (sorted classes,
                        sorted files, the same extensions); groups = single images.
    CIFAR-10 batches    a folder holding cifar-10-batches-py/ (or the batches themselves): the
                        reference harness's --data cifar10, read by imagenet_shards.cifar10 (never downloaded).
    "synthetic"         generated uint8 images (also "generated"), deterministic from the seed.
    Mix(...)            several converted datasets with weights (imagenet_shards/loader/mix.py): the mix kind.

Each kind resolves what names it (its `resolve` hook in imagenet_shards/loader/source_kinds/: the first four above
are the shard kind's, source_kinds/shards.py); resolve_source asks them in the registry's RESOLVING order
and holds no branch of its own. A Source's `kind` is a key of SOURCE_KINDS: the loader reads its items through
that kind; its `settings` is the kind's own settings object.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.loader.source_kinds import RESOLVING
from imagenet_shards.loader.source_kinds.shards import REBUILD_REPARTITION, load_own_share
from imagenet_shards.loader.source_kinds.source import (FolderItem, OwnShare, ResolveRequest, ShardSettings, Source,
                                                        SourceError)
from imagenet_shards.loader.source_kinds.synthetic import LENGTH as SYNTHETIC_LENGTH
from imagenet_shards.loader.source_kinds.synthetic import NAMES as SYNTHETIC_NAMES


def resolve_source(source, split: str, instance_count: int = 1, image_size: int = 224,
                   synthetic_length: Optional[int] = None, seed: int = 0, use_repartition: bool = True,
                   label_offset: Optional[int] = None) -> Source:
    request = ResolveRequest(split, instance_count, image_size, synthetic_length, seed, use_repartition,
                             label_offset, resolve=_resolve)
    return _resolve(source, request)


def _resolve(source, request: ResolveRequest) -> Source:
    """The Source the first kind to claim `source` makes: each kind's `resolve`, then each `resolve_loose`."""
    if isinstance(source, Source):
        return source
    hooks = [kind.resolve for kind in RESOLVING] + [kind.resolve_loose for kind in RESOLVING]
    for hook in hooks:
        resolved = hook(source, request) if hook is not None else None
        if resolved is not None:
            return resolved
    raise SourceError(
        f"{Path(str(source))}: neither a converted dataset ({METADATA_FILE}), nor an ImageNet folder "
        f"({request.split}/<class>/<image>), nor a folder of .tar shards"
    )


__all__ = ["FolderItem", "OwnShare", "REBUILD_REPARTITION", "ResolveRequest", "SYNTHETIC_LENGTH", "SYNTHETIC_NAMES",
           "ShardSettings", "Source", "SourceError", "load_own_share", "resolve_source"]
