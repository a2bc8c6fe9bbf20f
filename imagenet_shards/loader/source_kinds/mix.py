"""The mix kind (get_data's source a imagenet_shards.loader.mix.Mix): items are ints that name a source, a
row of its sample index and a pass over it (imagenet_shards/loader/mix.py); each run of one source's items
is read through that source's own kind, its labels mapped onto the mix's one label space."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import numpy as np

from imagenet_shards.loader.mix import Mix, MixError, decode_items, label_maps, largest_remainder, mix_groups
from imagenet_shards.loader.plan.share_plan import GroupedOrder
from imagenet_shards.loader.source_kinds.base import ReadContext, SourceKind, fingerprint_start
from imagenet_shards.loader.source_kinds.shards import SHARDS
from imagenet_shards.loader.source_kinds.source import Source, SourceError

log = logging.getLogger(__name__)


@dataclass
class MixParts:
    """The mix kind's settings: its sources (a Source each, of the shard kind), names, weights, this split's
    counts per epoch, item offsets and label maps (None: labels kept)."""

    parts: list
    names: list
    weights: list
    counts: list  # samples per epoch of each source (largest remainder)
    offsets: list  # first item of each source, then the sum of their sizes
    label_maps: list

    @property
    def length(self) -> int:
        return int(sum(self.counts))

    @property
    def total(self) -> int:  # Source.total: the samples of an epoch
        return self.length

    def repeats(self) -> list:
        """Each source's count over its size: > 1 repeated, < 1 subsampled."""
        return [count / len(part.columns) for count, part in zip(self.counts, self.parts)]


def mix_parts(source) -> "MixParts | None":
    """A mix source's MixParts (its sources, counts...), or None for a source of another kind."""
    settings = getattr(source, "settings", None)
    return settings if isinstance(settings, MixParts) else None


def source_runs(source, seed: int, epoch: int, shuffle: bool) -> GroupedOrder:
    """The mix's epoch sequence with its runs not permuted together: source 0's items, then source 1's...
    (the global order's view of a mix: imagenet_shards/loader/plan/global_mix.py)."""
    mix = source.settings
    ranges = [part.columns.group_ranges() for part in mix.parts]
    return GroupedOrder(*mix_groups(ranges, mix.counts, seed, epoch, shuffle)[:2])


def _part_context(context, k: int) -> ReadContext:
    part = context.source.settings.parts[k]
    return ReadContext(part, part.columns, context.verify, context.use_bbox_info, context.seed, context.positions)


def _runs(context, items):
    """(source, its rows, the mix items) per run of consecutive items of one source."""
    items = np.asarray(items, dtype=np.int64)
    if not len(items):
        return
    _, sources, rows = decode_items(items, context.source.settings.offsets)
    bounds = np.r_[0, np.flatnonzero(sources[1:] != sources[:-1]) + 1, len(items)]
    for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        yield int(sources[first]), rows[first:last], items[first:last]


def _raw_samples(context, items):
    maps = context.source.settings.label_maps
    for k, rows, mixed in _runs(context, items):
        mapping = maps[k]
        for item, (_, shard, label, payload, kind, error) in zip(
                mixed.tolist(), SHARDS.raw_samples(_part_context(context, k), rows)):
            yield item, shard, int(mapping[label]) if mapping is not None else label, payload, kind, error


def _key(context, item) -> str:
    mix = context.source.settings
    passes, sources, rows = decode_items([item], mix.offsets)
    k, row = int(sources[0]), int(rows[0])
    key = f"{mix.names[k]}/{mix.parts[k].columns.key(row)}"
    return key if not passes[0] else f"{key}#{int(passes[0])}"


def _labels(context, items) -> list:
    out = np.zeros(len(items), dtype=np.int64)
    start = 0
    for k, rows, _ in _runs(context, items):
        labels = context.source.settings.parts[k].columns.labels[rows].astype(np.int64)
        mapping = context.source.settings.label_maps[k]
        out[start:start + len(rows)] = mapping[labels] if mapping is not None else labels
        start += len(rows)
    return out.tolist()


def _epoch_sequence(source, seed: int, epoch: int, shuffle: bool):
    mix = source.settings
    ranges = [part.columns.group_ranges() for part in mix.parts]
    return GroupedOrder(*mix_groups(ranges, mix.counts, seed, epoch, shuffle))


def _fingerprint(source):
    mix = source.settings
    digest = fingerprint_start("mix", source)
    for name, weight, count, part in zip(mix.names, mix.weights, mix.counts, mix.parts):
        digest.update(f"{name}\n{weight!r}\n{count}\n{SHARDS.fingerprint(part).hexdigest()}\n".encode())
    return digest


def _resolve(source, request):
    """A Mix's sources resolved (converted datasets or shard lists: the shard kind), its counts per epoch
    (largest remainder of the weights) and one label space (imagenet_shards/loader/mix.py says how)."""
    if not isinstance(source, Mix):
        return None
    parts = [_part(part, number, request) for number, (part, _) in enumerate(source.sources)]
    names = [str(number) for number in range(len(parts))]
    first = parts[0]
    for part in parts:
        for field_name in ("stored_steps", "tensor_layout", "payload"):
            if getattr(part, field_name) != getattr(first, field_name):
                raise SourceError(f"{part.description}: its {field_name} {getattr(part, field_name)!r} differs from "
                                  f"{first.description}'s {getattr(first, field_name)!r}: a Mix reads its sources "
                                  f"through one pipeline")
    sizes = [len(part.columns) for part in parts]
    try:
        counts = largest_remainder([weight for _, weight in source.sources], source.length or sum(sizes))
        classes, maps = label_maps([part.classes for part in parts], [part.description for part in parts])
    except MixError as error:
        raise SourceError(str(error)) from None
    for part, mapping in zip(parts, maps):
        if mapping is not None:  # the map, once, in the log (and loader.classes is the union)
            log.info("mix: %s's labels remapped onto the mix's classes: %s", part.description,
                     {old: int(new) for old, new in enumerate(mapping.tolist()) if old != new})
    offsets = np.cumsum([0] + sizes).tolist()
    settings = MixParts(parts, names, [float(w) for _, w in source.sources], counts, offsets, maps)
    described = ", ".join(f"{part.description} x{count} ({repeat:.2f} of it)" for part, count, repeat in
                          zip(parts, counts, settings.repeats()))
    return Source(MIX.name, f"mix of {len(parts)} ({request.split}: {sum(counts)} samples an epoch: {described})",
                  [], first.payload, classes=classes, stored_steps=first.stored_steps,
                  tensor_layout=first.tensor_layout, settings=settings)


def _part(part, number: int, request) -> Source:
    """One of a Mix's sources, resolved as a whole dataset (no repartition: the mix deals its own shares)."""
    name = str(part) if isinstance(part, (str, os.PathLike)) else f"source {number}"
    if isinstance(part, Mix):
        raise SourceError(f"{name}: a Mix inside a Mix; list its sources in the outer one")
    resolved = request.resolve(part, dataclasses.replace(request, use_repartition=False))
    if resolved.columns is None:
        raise SourceError(f"{name}: a Mix mixes converted datasets and shard lists (a sample index each); this "
                          f"is {resolved.description}")
    return resolved


MIX = SourceKind("mix", _raw_samples, key=_key, labels=_labels, epoch_sequence=_epoch_sequence,
                 fingerprint=_fingerprint, bboxes=True, resolve=_resolve)
