"""The loader's source kinds, by name: the one place where a Source's kind becomes reading code.

    from imagenet_shards.loader.source_kinds import get_source_kind
    kind = get_source_kind(source.kind)             # a imagenet_shards.loader.source_kinds.base.SourceKind
    for item, shard, label, payload, payload_kind, error in kind.raw_samples(context, items):
        ...
    kind.key(context, item), kind.labels(context, items), kind.epoch_sequence(source, seed, epoch, shuffle),
    kind.fingerprint(source)

Everything that differs by kind is asked of the kind: no code outside this package compares a
kind's name (tools/layout.py checks it).

loader/sources.py resolves what a `source` argument names into a Source whose `kind` is a key
here, asking each kind's `resolve` hook in RESOLVING's order (source_kinds/source.py: the Source, the kind's own
settings object in it); the loader reads each worker's items through that kind and decodes each payload through
imagenet_shards/loader/payloads/. Adding a source kind is a module with one `SourceKind` (see base.py
for the contract: its reading and its `resolve` hook) and one entry in `SOURCE_KINDS` and `RESOLVING`; no loader
change.
"""

from __future__ import annotations

from imagenet_shards.loader.source_kinds.base import Boxed, ReadContext, SourceKind
from imagenet_shards.loader.source_kinds.cifar10 import CIFAR10
from imagenet_shards.loader.source_kinds.folder import FOLDER
from imagenet_shards.loader.source_kinds.mix import MIX
from imagenet_shards.loader.source_kinds.shards import SHARDS
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


__all__ = ["Boxed", "CIFAR10", "FOLDER", "FORMER_NAMES", "MIX", "RESOLVING", "ReadContext", "SHARDS", "SOURCE_KINDS",
           "SYNTHETIC", "SourceKind", "UnknownSourceKindError", "get_source_kind", "keys_of"]
