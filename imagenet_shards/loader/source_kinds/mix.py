"""The mix kind (get_data's source a imagenet_shards.loader.mix.Mix): items are ints that name a source, a
row of its sample index and a pass over it (imagenet_shards/loader/mix.py); each run of one source's items
is read through that source's own kind, its labels mapped onto the mix's one label space."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from imagenet_shards.loader.mix import decode_items, mix_groups
from imagenet_shards.loader.share_plan import GroupedOrder
from imagenet_shards.loader.source_kinds.base import ReadContext, SourceKind, fingerprint_start
from imagenet_shards.loader.source_kinds.shards import SHARDS


@dataclass
class MixParts:
    """What a mix Source holds: its sources (loader.sources.Source each, of the shard kind), names,
    weights, this split's counts per epoch, item offsets and label maps (None: labels kept)."""

    parts: list
    names: list
    weights: list
    counts: list  # samples per epoch of each source (largest remainder)
    offsets: list  # first item of each source, then the sum of their sizes
    label_maps: list

    @property
    def length(self) -> int:
        return int(sum(self.counts))

    def repeats(self) -> list:
        """Each source's count over its size: > 1 repeated, < 1 subsampled."""
        return [count / len(part.columns) for count, part in zip(self.counts, self.parts)]


def _part_context(context, k: int) -> ReadContext:
    part = context.source.mix.parts[k]
    return ReadContext(part, part.columns, context.verify, context.use_bbox_info, context.seed)


def _runs(context, items):
    """(source, its rows, the mix items) per run of consecutive items of one source."""
    items = np.asarray(items, dtype=np.int64)
    if not len(items):
        return
    _, sources, rows = decode_items(items, context.source.mix.offsets)
    bounds = np.r_[0, np.flatnonzero(sources[1:] != sources[:-1]) + 1, len(items)]
    for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        yield int(sources[first]), rows[first:last], items[first:last]


def _raw_samples(context, items):
    maps = context.source.mix.label_maps
    for k, rows, mixed in _runs(context, items):
        mapping = maps[k]
        for item, (_, shard, label, payload, kind, error) in zip(
                mixed.tolist(), SHARDS.raw_samples(_part_context(context, k), rows)):
            yield item, shard, int(mapping[label]) if mapping is not None else label, payload, kind, error


def _key(context, item) -> str:
    mix = context.source.mix
    passes, sources, rows = decode_items([item], mix.offsets)
    k, row = int(sources[0]), int(rows[0])
    key = f"{mix.names[k]}/{mix.parts[k].columns.key(row)}"
    return key if not passes[0] else f"{key}#{int(passes[0])}"


def _labels(context, items) -> list:
    out = np.zeros(len(items), dtype=np.int64)
    start = 0
    for k, rows, _ in _runs(context, items):
        labels = context.source.mix.parts[k].columns.labels[rows].astype(np.int64)
        mapping = context.source.mix.label_maps[k]
        out[start:start + len(rows)] = mapping[labels] if mapping is not None else labels
        start += len(rows)
    return out.tolist()


def _epoch_sequence(source, seed: int, epoch: int, shuffle: bool):
    mix = source.mix
    ranges = [part.columns.group_ranges() for part in mix.parts]
    return GroupedOrder(*mix_groups(ranges, mix.counts, seed, epoch, shuffle))


def _fingerprint(source):
    mix = source.mix
    digest = fingerprint_start("mix", source)
    for name, weight, count, part in zip(mix.names, mix.weights, mix.counts, mix.parts):
        digest.update(f"{name}\n{weight!r}\n{count}\n{SHARDS.fingerprint(part).hexdigest()}\n".encode())
    return digest


MIX = SourceKind("mix", _raw_samples, key=_key, labels=_labels, epoch_sequence=_epoch_sequence,
                 fingerprint=_fingerprint, bboxes=True)
