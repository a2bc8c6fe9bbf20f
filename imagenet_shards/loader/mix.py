"""Weighted mixing of several converted datasets in one loader: `Mix`, and its epoch plan (pure).

    from imagenet_shards.loader import Mix, get_data
    train = get_data(Mix({"/data/imagenet": 0.7, "/data/extra": 0.3}), "train", 64, 8)

Epoch length: the sum of the sources' sizes (of the split), or `length=`. Per-epoch counts follow
the weights exactly: source k gets floor(w_k / sum(w) * length) samples, and the samples the floors
leave go one each to the largest fractional parts (ties: the earlier source): largest remainder.

Which samples: a source's shards are permuted by (seed, epoch, source) and its count is taken from
that order: a source with fewer samples than its count is repeated (whole passes over its shards,
then the first shards of the next pass: `repeats` says how many times, e.g. 1.4), one with more is
subsampled (the first shards of its order: a different subset each epoch). A repeated sample is
another item of the epoch: its key carries the pass (`#1`, `#2`...), so the ledger counts it once.

The epoch sequence the planner deals (today's order or the global one) is these runs of shards of
every source, permuted together by (seed, epoch), so every part of the epoch holds every source in
its proportion on average (the shuffle buffer or the global order's block shuffle mixes within).

Items are ints: pass * T + offset_k + row, T the sum of the sources' sizes, offset_k source k's first
(imagenet_shards/loader/source_kinds/mix.py reads them through each source's own kind).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from imagenet_shards.errors import UsageError


class MixError(UsageError, ValueError):
    """A mix that cannot be made: names the source and the problem."""


@dataclass(frozen=True)
class Mix:
    """Several converted datasets (any formats) with weights: get_data's `source`."""

    sources: tuple  # ((source, weight), ...): a converted dataset directory or URL each
    length: Optional[int] = None  # samples an epoch; default: the sum of the sources' sizes

    def __init__(self, sources, length: Optional[int] = None):
        pairs = tuple(sources.items()) if isinstance(sources, dict) else tuple(tuple(pair) for pair in sources)
        if not pairs:
            raise MixError("a Mix needs at least one source")
        for pair in pairs:
            if len(pair) != 2 or not isinstance(pair[1], (int, float)) or not pair[1] >= 0:
                raise MixError(f"a Mix source is (source, weight >= 0), got {pair!r}")
        if not sum(weight for _, weight in pairs) > 0:
            raise MixError("a Mix needs a positive weight")
        if length is not None and int(length) < 1:
            raise MixError(f"a Mix's length must be at least 1, got {length}")
        object.__setattr__(self, "sources", pairs)
        object.__setattr__(self, "length", None if length is None else int(length))

    @property
    def weights(self) -> list:
        return [float(weight) for _, weight in self.sources]


def largest_remainder(weights, length: int) -> list:
    """Integer counts summing to `length`, proportional to `weights` (largest-remainder rounding)."""
    weights = np.asarray(weights, dtype=np.float64)
    quotas = weights / weights.sum() * length
    counts = np.floor(quotas).astype(np.int64)
    rest = length - int(counts.sum())
    order = sorted(range(len(weights)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in order[:rest]:
        counts[k] += 1
    return counts.tolist()


def source_rng(seed: int, epoch: int, source: int) -> np.random.Generator:
    # 0x6d6978 ("mix"): apart from the other generators seeded by (seed, epoch)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [int(seed) & 0xFFFFFFFF, int(epoch), int(source), 0x6D6978])))


def mix_groups(ranges, counts, seed: int, epoch: int, shuffle: bool = True):
    """(starts, sizes, order) of the epoch's runs of items (see the module docstring): `ranges` per
    source (starts, sizes) of its shards' row ranges, `counts` its samples this epoch."""
    sizes_total = [int(np.sum(sizes)) for _, sizes in ranges]
    offsets = np.cumsum([0] + sizes_total)
    total = int(offsets[-1])
    starts_out, sizes_out = [], []
    for k, ((starts, sizes), count) in enumerate(zip(ranges, counts)):
        if count and not sizes_total[k]:
            raise MixError(f"source {k} has no samples but weight for {count}")
        order = source_rng(seed, epoch, k).permutation(len(starts)) if shuffle else np.arange(len(starts))
        left, passes = int(count), 0
        while left > 0:
            for group in order.tolist():
                take = min(int(sizes[group]), left)
                starts_out.append(passes * total + int(offsets[k]) + int(starts[group]))
                sizes_out.append(take)
                left -= take
                if not left:
                    break
            passes += 1
    starts_out, sizes_out = np.asarray(starts_out, dtype=np.int64), np.asarray(sizes_out, dtype=np.int64)
    order = source_rng(seed, epoch, 0xFFFF).permutation(len(starts_out)) if shuffle else None  # 0xFFFF: no source's
    return starts_out, sizes_out, order


def decode_items(items, offsets) -> tuple:
    """(pass, source, row) arrays of mix items; `offsets` the sources' first items (+ the total last)."""
    items = np.asarray(items, dtype=np.int64)
    offsets = np.asarray(offsets, dtype=np.int64)
    total = int(offsets[-1])
    passes, inside = np.divmod(items, total)
    source = np.searchsorted(offsets, inside, side="right") - 1
    return passes, source, inside - offsets[source]


def label_maps(class_lists, names) -> tuple:
    """(the one class list, per source an int array old label -> new label). Sources that name the
    same classes in the same order keep their labels; sources that disagree are remapped onto the
    union (the first source's order, then each later source's new classes in its order). A source
    without class names can only mix with sources that have none either (the labels as they are)."""
    if all(classes is None for classes in class_lists):
        return None, [None] * len(class_lists)
    unnamed = [name for name, classes in zip(names, class_lists) if classes is None]
    if unnamed:
        raise MixError(f"{unnamed[0]}: records no class names, so its labels cannot be matched with the other "
                       f"sources' (convert it with its class table, or mix only sources without one)")
    union, index = [], {}
    for classes in class_lists:
        for name in classes:
            if name not in index:
                index[name] = len(union)
                union.append(name)
    maps = []
    for classes in class_lists:
        mapping = np.asarray([index[name] for name in classes], dtype=np.int64)
        maps.append(None if (mapping == np.arange(len(classes))).all() else mapping)
    return union, maps
