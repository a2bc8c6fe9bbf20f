"""order="global" over a Mix (imagenet_shards/loader/mix.py): every global batch takes each source's share
to within one sample of its weight, and each epoch each source's exact count. Pure planning, no I/O.

The mix's epoch sequence is, here, its sources' runs of shards unpermuted: source i's c_i items (its
count this epoch, largest remainder; its shards permuted by (seed, epoch, i), repeated or subsampled)
are positions off_i ... off_i + c_i - 1. The partitions, their shares of every global batch and the
ranks' slices are those of global_order.FlatLayout over L = sum(c_i) samples; what differs is which
source fills each slot:

1. Per global batch k, source i gets g_i(k) = floor(G c_i / L), or one more: the R = G - sum(floor)
   samples left over go to the sources by largest remainder over the epoch (e_i of the K R, each at
   most K), dealt one per global batch (extra t goes to global batch t mod K). So |g_i(k) - G c_i / L|
   < 1 for every k and i, and source i delivers t_i = K floor(G c_i / L) + e_i samples: t_i <= c_i
   under "drop" (its last c_i - t_i items are left out, named dropped: delivered + dropped = c_i
   exactly); under "pad" a source with t_i > c_i repeats its own first items (named padded).
2. A global batch's G source labels are permuted (by a generator seeded by k alone: the layout does not
   change with the epoch) over its slots, partition by partition.
3. Partition p's n_{p,i} slots of source i take the next n_{p,i} items of source i's sequence: source
   i's sequence is cut into P contiguous pieces in partition order, so a rank (a contiguous run of
   partitions) reads one contiguous run of each source's shards; each piece is block-shuffled.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from imagenet_shards.loader.global_order import FlatLayout, FlatSequence, partition_rng
from imagenet_shards.loader.mix import largest_remainder


@dataclass(frozen=True)
class MixLayout:
    """FlatLayout's shape over a mix of sources with per-epoch counts `counts`."""

    counts: tuple  # c_i per source
    partitions: int
    global_batch: int
    policy: str

    @property
    def total(self) -> int:
        return int(sum(self.counts))

    @cached_property
    def base(self) -> FlatLayout:
        return FlatLayout(self.total, self.partitions, self.global_batch, self.policy)

    @property
    def global_batches(self) -> int:
        return self.base.global_batches

    def __len__(self) -> int:
        return len(self.base)

    def source_counts(self) -> np.ndarray:
        """(K, S): g_i(k), each source's samples in global batch k (module docstring, 1.)."""
        counts, g, total, k = np.asarray(self.counts, dtype=np.int64), int(self.global_batch), self.total, \
            self.global_batches
        floors = g * counts // total
        rest = g - int(floors.sum())
        out = np.repeat(floors[None, :], k, axis=0)
        if rest and k:
            extras = np.repeat(np.arange(len(counts)), largest_remainder(g * counts - floors * total, k * rest))
            np.add.at(out, (np.arange(k * rest) % k, extras), 1)
        return out

    @cached_property
    def labels(self) -> np.ndarray:
        """The source of every flat position (module docstring, 2.)."""
        per_batch, g = self.source_counts(), int(self.global_batch)
        out = np.empty(len(self), dtype=np.int64)
        for k, counts in enumerate(per_batch):
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([k, 0x6D6978])))
            out[k * g:(k + 1) * g] = rng.permutation(np.repeat(np.arange(len(counts)), counts))
        return out

    @cached_property
    def pieces(self) -> list:
        """Per partition, per source: (its slots, in stream order; the first index into the source's
        sequence, extended by repetition for "pad")."""
        labels, sources = self.labels, len(self.counts)
        taken, out = np.zeros(sources, dtype=np.int64), []
        for slots in self.base.slots:
            mine = []
            for i in range(sources):
                own = slots[labels[slots] == i]
                mine.append((own, int(taken[i])))
                taken[i] += len(own)
            out.append(mine)
        return out

    def padded_mask(self) -> np.ndarray:
        mask = np.zeros(len(self), dtype=bool)
        for mine in self.pieces:
            for i, (slots, first) in enumerate(mine):
                mask[slots[max(0, int(self.counts[i]) - first):]] = True
        return mask

    def flat(self, seed: int, epoch: int, block) -> FlatSequence:
        """The epoch's flat sequence in positions of the unpermuted mix sequence (module docstring, 3.)."""
        offsets = np.cumsum([0] + list(self.counts))
        positions, used = np.empty(len(self), dtype=np.int64), np.zeros(len(self.counts), dtype=np.int64)
        for partition, mine in enumerate(self.pieces):
            rng = partition_rng(seed, epoch, partition)
            for i, (slots, first) in enumerate(mine):
                count = int(self.counts[i])
                own = np.arange(first, min(first + len(slots), count), dtype=np.int64)
                if block:
                    for start in range(0, len(own), block):
                        own[start:start + block] = rng.permutation(own[start:start + block])
                repeats = np.arange(first + len(own), first + len(slots), dtype=np.int64) % max(count, 1)
                positions[slots] = offsets[i] + np.concatenate([own, repeats])
                used[i] = max(used[i], first + len(slots))
        # a source's items past what its slots take: left out ("drop"; under "pad" a source the shares
        # round down can leave some too), named dropped
        dropped = np.concatenate([np.arange(offsets[i] + min(used[i], self.counts[i]), offsets[i + 1], dtype=np.int64)
                                  for i in range(len(self.counts))])
        return FlatSequence(positions, dropped, self)
