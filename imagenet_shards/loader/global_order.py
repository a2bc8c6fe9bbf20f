"""The global train order (get_data's order="global"): pure planning, no I/O.

Today's order (share_plan.py) deals each instance a contiguous range of the epoch's sequence, so the
sample sequence a run sees depends on its instance and worker counts. The global order fixes one
sequence of **global batches** per epoch, a function of the dataset, seed, epoch, P (partitions), G
(the global batch size) and the tail policy only; the instance count N, the worker count W and the
per-rank batch G/N may change, within a run and across a resume.

1. Partitions. The epoch's shard order (the source kind's `epoch_sequence`: shards permuted by
   (seed, epoch), samples in shard order) is cut into P contiguous partitions (Streaming's canonical
   nodes). Sizes: n//P each, one more for the n%P partitions first in the rotation order (3.).
2. Block shuffle. Each partition's samples are shuffled within consecutive blocks of `block` samples
   (Streaming's py1b; with the default block a partition of ImageNet is one block), with a generator
   seeded by (seed, epoch, partition).
3. Global batches. K = n//G ("drop") or ceil(n/G) ("pad") global batches of G samples. After k global
   batches, partition p has given c_p(k) = kG//P + (rho(p) < kG % P) of its samples: global batch k
   takes from partition p its next c_p(k+1) - c_p(k) samples, G/P where P divides G. Where it does not,
   the R = G % P samples left over go one each to R partitions in turn, a window sliding R places per
   global batch along the rotation order rho: the bit-reversal of p (P a power of two, which the
   default P is), so that every instance's partitions get the same number; a P that is not a power of
   two must divide G (refused in one line otherwise). "drop": a partition's samples beyond c_p(K)
   are left out (named dropped); "pad": a partition short of c_p(K) repeats its own first samples
   (named padded), so its instance still reads only its own shards.
4. The flat sequence is the global batches in order, each laid out partition by partition (partition
   0's share, then 1's, ...).

Ranks. Rank r of N (N dividing P and G) owns the P/N partitions r·P/N ... (r+1)·P/N - 1 (a contiguous
run of the shard order, not every N-th partition: a rank then shares at most two shards with its
neighbours whatever P is, which is what bounds the bytes a whole-shard cache fetches) and delivers, as
its batch of step k, the union of its partitions' shares of global batch k in partition order: the
flat positions kG + r·G/N ... kG + (r+1)·G/N - 1, since every run of P/N partitions gets G/N of each
global batch (the rotation above). So the ranks' batches are the flat sequence cut into batches of
b = G/N, dealt round-robin (`deal_batches`), and step k's global batch is the same set of samples for
every N. Inside a rank, worker w of W takes the rank's batches w, w + W, ... (InstancePlan.strided),
which DataLoader hands out round-robin: W changes nothing. Each rank reads its own partitions' shards
only: bytes read once in all.

Resume (imagenet_shards/loader/resume.py): a later segment deals the flat positions no earlier segment
delivered, in order, the same way with its own N (G kept: a state of another G is refused); after a
save at step k on every rank the next segment starts at global batch k + 1 exactly. Each sample is
augmented with a generator seeded by its flat position (InstancePlan.sample_ids, read_loop.FlatTag), so
the pixels, not only the keys, are the same at any N and across a resume; a batch transform
(MixUp/CutMix) mixes within a rank's batch, so its output differs with N.

Everything here is positions (ints), so the order of 1.28M samples is a few numpy calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import numpy as np

from imagenet_shards.balance import DROP, PAD
from imagenet_shards.loader.share_plan import InstancePlan, PlanError

MAX_DEFAULT_PARTITIONS = 64  # the default P: a power of two <= min(64, G, n); divides N = 1, 2, 4, ... 64
# Samples shuffled together inside a partition: Streaming's py1b/py1e default block, 2**18 (a
# partition of ImageNet's train split at P = 64 is ~20k samples: one block)
DEFAULT_BLOCK = 1 << 18
ORDER_NAMES = ("shards", "global")  # get_data's order: "shards" is today's (share_plan.py)


@dataclass(frozen=True)
class GlobalOrder:
    """get_data's order="global" settings: the global batch size G (None: batch_size x the instance
    count, so the sequence then depends on N), the partition count P (None: `default_partitions`)
    and the shuffle block."""

    partitions: Optional[int] = None
    block: int = DEFAULT_BLOCK
    global_batch_size: Optional[int] = None

    def __post_init__(self):
        for name in ("partitions", "global_batch_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, np.integer)) or int(value) < 1):
                raise PlanError(f"GlobalOrder's {name} must be an integer >= 1 (or None), got {value!r}")
        if int(self.block) < 1:
            raise PlanError(f"GlobalOrder's block must be >= 1, got {self.block!r}")


def default_partitions(total: int, global_batch: int) -> int:
    """The default P, from the split's size and G only: the largest power of two <= min(64, G, n)
    (1 at least). Every rank count that is a power of two up to it divides it (16 for ImageNet at
    G = 1,024 is within 64), every partition gives every global batch a sample, none is empty."""
    limit = max(1, min(MAX_DEFAULT_PARTITIONS, int(global_batch), int(total)))
    return 1 << (limit.bit_length() - 1)


def order_setting(order):
    """get_data's `order` as a GlobalOrder, or None for today's order ("shards" or None)."""
    if order is None or order == "shards":
        return None
    if order == "global":
        return GlobalOrder()
    if isinstance(order, GlobalOrder):
        return order
    raise PlanError(f"unknown order {order!r} (choose from {', '.join(ORDER_NAMES)}, or a "
                    f"GlobalOrder(global_batch_size=G, partitions=P))")


def per_rank_batch(order: GlobalOrder, batch_size, instances: int) -> int:
    """The per-rank batch under `order`: G/N where G is given (batch_size None, or checked against it),
    else batch_size (64 where None)."""
    if order is None or order.global_batch_size is None:
        return 64 if batch_size is None else int(batch_size)
    g = int(order.global_batch_size)
    if g % instances:
        raise PlanError(f"a global batch of {g} cannot be split among {instances} instances: give a global_batch_size "
                        f"that {instances} divides")
    if batch_size is not None and int(batch_size) != g // instances:
        raise PlanError(f"batch_size {batch_size} is not the global batch {g} / {instances} instances = "
                        f"{g // instances}: pass batch_size=None (derived) or {g // instances}")
    return g // instances


def bit_reversal(count: int) -> np.ndarray:
    """rho: p -> p with its log2(count) bits reversed (count a power of two); identity otherwise."""
    p = np.arange(count, dtype=np.int64)
    if count & (count - 1):
        return p
    bits, out = count.bit_length() - 1, np.zeros(count, dtype=np.int64)
    for bit in range(bits):
        out |= ((p >> bit) & 1) << (bits - 1 - bit)
    return out


@dataclass(frozen=True)
class FlatLayout:
    """The epoch-independent shape of the flat sequence: partition sizes, each global batch's share of
    every partition, the tail and the padded slots."""

    total: int  # samples of the split
    partitions: int
    global_batch: int
    policy: str  # "drop" or "pad"

    @cached_property
    def rotation(self) -> np.ndarray:
        return bit_reversal(int(self.partitions))

    def spread(self, count: int) -> np.ndarray:
        """`count` samples over the partitions: count//P each, one more for the first count%P in rotation order."""
        parts = int(self.partitions)
        return count // parts + (self.rotation < count % parts).astype(np.int64)

    @property
    def partition_sizes(self) -> list:
        return self.spread(int(self.total)).tolist()

    @property
    def global_batches(self) -> int:
        n, g = int(self.total), int(self.global_batch)
        return n // g if self.policy == DROP else -(-n // g)

    def __len__(self) -> int:
        return self.global_batches * int(self.global_batch)

    @cached_property
    def consumed(self) -> np.ndarray:
        """(K + 1, P): c_p(k), the samples partition p gave global batches 0..k-1 (module docstring, 3.)."""
        parts = int(self.partitions)
        given = np.arange(self.global_batches + 1, dtype=np.int64)[:, None] * int(self.global_batch)
        return given // parts + (self.rotation[None, :] < given % parts).astype(np.int64)

    def shares(self) -> np.ndarray:
        """(K, P): the samples global batch k takes from partition p."""
        return np.diff(self.consumed, axis=0)

    @cached_property
    def slots(self) -> list:
        """Per partition, the flat positions of its stream's samples 0 .. c_p(K) - 1."""
        consumed, shares = self.consumed, self.shares()
        offsets = np.cumsum(shares, axis=1) - shares  # a partition's first slot inside each global batch
        out = []
        for p in range(int(self.partitions)):
            j = np.arange(consumed[-1, p], dtype=np.int64)
            k = np.searchsorted(consumed[:, p], j, side="right") - 1
            out.append(k * int(self.global_batch) + offsets[k, p] + j - consumed[k, p])
        return out

    def flat(self, seed: int, epoch: int, block) -> "FlatSequence":
        return flat_sequence(self, seed, epoch, block)

    def padded_mask(self) -> np.ndarray:
        """True at the flat positions that repeat a sample of their partition ("pad")."""
        mask = np.zeros(len(self), dtype=bool)
        for slots, size in zip(self.slots, self.partition_sizes):
            mask[slots[size:]] = True
        return mask


def check_layout(layout: FlatLayout, instances: int) -> None:
    """PlanError when the global order cannot serve `instances` (it must divide P and G), P cannot share
    G out, or the split is too small."""
    parts, g = int(layout.partitions), int(layout.global_batch)
    if layout.policy not in (DROP, PAD):
        raise PlanError(f"the global order deals train policies drop and pad, not {layout.policy!r} "
                        f"(validation keeps its exactly-once order)")
    if instances < 1 or parts % instances:
        raise PlanError(f"the global order with {parts} partitions needs an instance count that divides "
                        f"it, got {instances}: give order=GlobalOrder(partitions=...) a multiple of it")
    if g % instances:
        raise PlanError(f"a global batch of {g} cannot be split among {instances} instances: give a global_batch_size "
                        f"that {instances} divides")
    if g % parts and parts & (parts - 1):
        raise PlanError(f"{parts} partitions (not a power of two) cannot share a global batch of {g} equally: "
                        f"give partitions a power of two or a divisor of {g}")
    if layout.total < parts:  # "pad" would have an empty partition to repeat
        raise PlanError(f"{layout.total} samples cannot fill {parts} partitions: use fewer partitions")
    if len(layout) == 0:
        raise PlanError(f"{layout.total} samples leave no whole global batch of {g}: use a smaller global batch "
                        f"or policy 'pad'")


@dataclass(frozen=True)
class FlatSequence:
    """One epoch's flat sequence, in positions of the source kind's epoch sequence (shard order)."""

    positions: np.ndarray  # flat position -> position in the shard-order sequence
    dropped: np.ndarray  # shard-order positions no flat position holds ("drop": each partition's tail)
    layout: FlatLayout

    def __len__(self) -> int:
        return len(self.positions)


def partition_rng(seed: int, epoch: int, partition: int) -> np.random.Generator:
    # 0x676c6f62 ("glob"): a stream apart from the shard permutation's (seed, epoch)
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [int(seed) & 0xFFFFFFFF, int(epoch), int(partition), 0x676C6F62])))


def flat_sequence(layout: FlatLayout, seed: int, epoch: int, block=DEFAULT_BLOCK) -> FlatSequence:
    """The epoch's flat sequence (see the module docstring, steps 1-4); `block` None: no block shuffle
    (shuffle=False)."""
    positions, dropped, start = np.empty(len(layout), dtype=np.int64), [], 0
    for partition, (size, slots) in enumerate(zip(layout.partition_sizes, layout.slots)):
        stream = np.arange(start, start + size, dtype=np.int64)
        start += size
        if block:
            rng = partition_rng(seed, epoch, partition)
            for first in range(0, size, block):
                stream[first:first + block] = rng.permutation(stream[first:first + block])
        if len(slots) <= size:
            positions[slots] = stream[:len(slots)]
            dropped.append(stream[len(slots):])
        else:  # "pad": the partition's own first samples again
            positions[slots] = np.resize(stream, len(slots))
    dropped = np.concatenate(dropped) if dropped else np.zeros(0, dtype=np.int64)
    return FlatSequence(positions, np.sort(dropped), layout)


def deal_batches(count_positions: int, instance: int, count: int, batch_size: int, policy: str):
    """Instance `instance` of `count`'s share of a flat run of `count_positions` positions (indices
    0..count_positions-1), dealt batch by batch round-robin: (its indices in order, the indices it
    repeats ("pad"), the indices no instance gets ("drop")). Indices >= count_positions wrap."""
    if not 0 <= instance < count:
        raise PlanError(f"instance {instance} is out of range for {count} instances")
    batches = -(-count_positions // batch_size)
    each = batches // count if policy == DROP else -(-batches // count)
    flat_batches = np.arange(each, dtype=np.int64) * count + instance
    indices = (flat_batches[:, None] * batch_size + np.arange(batch_size, dtype=np.int64)).reshape(-1)
    if policy == DROP:
        indices = indices[indices < count_positions]
        dropped = np.arange(each * count * batch_size, count_positions, dtype=np.int64)
        return indices, np.zeros(0, dtype=np.int64), dropped
    padded = indices[indices >= count_positions]
    return indices % max(count_positions, 1), padded % max(count_positions, 1), np.zeros(0, dtype=np.int64)


def plan_flat(positions, layout: FlatLayout, instance: int, count: int, padded_mask=None) -> InstancePlan:
    """The plan of instance `instance` of `count` dealing `positions` (flat positions left to deliver,
    in order; all of them for a fresh epoch) in batches of G/count, in flat positions. `padded_mask`:
    layout.padded_mask(), passed when already made. The partitions' own tail (FlatSequence.dropped) is
    the caller's to add."""
    positions = np.asarray(positions, dtype=np.int64)
    b = int(layout.global_batch) // count
    indices, padded, dropped = deal_batches(len(positions), instance, count, b, layout.policy)
    items = positions[indices]
    if layout.policy == PAD:
        mask = layout.padded_mask() if padded_mask is None else padded_mask
        repeats = positions[padded].tolist() + items[mask[items]].tolist()
        padded = np.asarray(repeats, dtype=np.int64)
    else:
        padded = np.zeros(0, dtype=np.int64)
    counts = [len(deal_batches(len(positions), i, count, b, layout.policy)[0]) for i in range(count)]
    # each sample's flat position: its augmentation's seed (a resumed segment's samples keep theirs)
    return InstancePlan(items, b, False, layout.policy, counts, padded=padded, policy_dropped=positions[dropped],
                        strided=True, sample_ids=items)
