"""The loader's source kinds, by name: the one place where a Source's kind becomes reading code.

    from imagenet_shards.loader.source_kinds import get_source_kind
    kind = get_source_kind(source.kind)             # a imagenet_shards.loader.source_kinds.base.SourceKind
    for item, shard, label, payload, payload_kind, error in kind.raw_samples(context, items):
        ...
    kind.key(context, item), kind.labels(context, items), kind.epoch_sequence(source, seed, epoch, shuffle),
    kind.fingerprint(source)

Everything that differs by kind is asked of the kind: no code outside this package compares a
kind's name (tools/layout.py checks it).

`resolve_source` resolves what a `source` argument names into a Source whose `kind` is a key here,
asking each kind's `resolve` hook in RESOLVING's order, then each `resolve_loose` hook, with no branch of its
own (source_kinds/source.py: the Source, the kind's own settings object in it):

    converted dataset,  what names shards: the shard kind's; its docstring (shards.py) says how each is
    TFRecord shards,    read (metadata.json and the sample index, a repartition when present; TF-slim shards
    shard list          indexed from their headers, the label offset given or detected; tar shards scanned).
    ImageNet folder     the extracted layout (<root>/<split>/<class>/<image>, `val` accepted for `validation`),
                        with torchvision ImageFolder semantics (sorted classes, sorted files, the same
                        extensions); groups = single images.
    CIFAR-10 batches    a folder holding cifar-10-batches-py/ (or the batches themselves): the reference
                        harness's --data cifar10, read by imagenet_shards.cifar10 (never downloaded).
    "synthetic"         generated uint8 images (also "generated"), deterministic from the seed.
    Mix(...)            several converted datasets with weights (imagenet_shards/loader/mix.py): the mix kind.

The loader reads each worker's items through the Source's kind and decodes each payload through
imagenet_shards/loader/payloads/. Adding a source kind is a module with one `SourceKind` (see base.py for the contract: its reading and its `resolve` hook) and one entry
in `SOURCE_KINDS` and `RESOLVING`; no loader change. (loader/sources.py, where resolve_source was before,
re-exports it for one release.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.loader.source_kinds.base import Boxed, ReadContext, SourceKind
from imagenet_shards.loader.source_kinds.cifar10 import CIFAR10
from imagenet_shards.loader.source_kinds.folder import FOLDER
from imagenet_shards.loader.source_kinds.mix import MIX
from imagenet_shards.loader.source_kinds.shards import SHARDS, load_own_share
from imagenet_shards.loader.source_kinds.source import ResolveRequest, Source, SourceError
from imagenet_shards.loader.source_kinds.synthetic import NAMES as SYNTHETIC_NAMES
from imagenet_shards.loader.source_kinds.synthetic import SYNTHETIC
from imagenet_shards.errors import Error

SOURCE_KINDS = {kind.name: kind for kind in (SHARDS, FOLDER, SYNTHETIC, CIFAR10, MIX)}
# The order resolve_source asks the kinds' `resolve` hooks (then their `resolve_loose` hooks) what a source names:
# a Mix, a synthetic name, then what names shards outright before a folder is taken as CIFAR-10 or ImageFolder.
RESOLVING = (MIX, SYNTHETIC, SHARDS, CIFAR10, FOLDER)
# Names a kind had before (a Source made by code of that time): the kind they name now.
FORMER_NAMES = {former: kind for kind in SOURCE_KINDS.values() for former in kind.former_names}


class UnknownSourceKindError(Error, ValueError):
    """A source kind name that no registered kind has."""


def get_source_kind(name) -> SourceKind:
    try:
        return SOURCE_KINDS[name] if name in SOURCE_KINDS else FORMER_NAMES[name]
    except (KeyError, TypeError):
        raise UnknownSourceKindError(f"unknown source kind {name!r} (known: {', '.join(SOURCE_KINDS)})") from None


def keys_of(context: ReadContext, items) -> list:
    """The keys of plan items (keys given as strings stay as they are)."""
    key = get_source_kind(context.source.kind).key
    return [item if isinstance(item, str) else key(context, item) for item in items]


def resolve_source(source, split: str, instance_count: int = 1, image_size: int = 224,
                   synthetic_length: Optional[int] = None, seed: int = 0, use_repartition: bool = True,
                   label_offset: Optional[int] = None) -> Source:
    """The Source that `source` names (see the module docstring), for `split` and these instances."""
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


# Besides the registry: resolve_source and what its callers outside loader/ use with it (the Source, its error,
# a repartition's share of an instance, the names of the synthetic source).
__all__ = ["Boxed", "CIFAR10", "FOLDER", "FORMER_NAMES", "MIX", "RESOLVING", "ReadContext", "SHARDS", "SOURCE_KINDS",
           "SYNTHETIC", "SYNTHETIC_NAMES", "Source", "SourceError", "SourceKind", "UnknownSourceKindError",
           "get_source_kind", "keys_of", "load_own_share", "resolve_source"]
