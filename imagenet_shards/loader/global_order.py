"""The global train order (get_data's order="global"): pure planning, no I/O.

Today's order (share_plan.py) deals each instance a contiguous range of the epoch's sequence, so
the sample sequence a run sees depends on its instance and worker counts. The global order fixes
one flat sequence per epoch that does not:

1. Partitions. The epoch's shard order (the source kind's `epoch_sequence`: shards permuted by
   (seed, epoch), samples in shard order) is cut into P contiguous partitions of equal sample
   counts (n//P, the first n%P one more). P is the canonical partition count (Streaming's
   canonical nodes), fixed by the run and recorded in its resume state; a partition is whole
   shards but for the one or two at its ends.
2. Block shuffle. Each partition's samples are shuffled within consecutive blocks of `block`
   samples (Streaming's py1b; with the default block a partition of ImageNet/64 is one block),
   with a generator seeded by (seed, epoch, partition).
3. Tail, per partition (so that every partition has the same number of batches b):
   "drop"  m = (n//P)//b batches each; each partition's last samples are left out (named dropped);
   "pad"   M = ceil(ceil(n/P)/b) batches each; a partition's stream is extended by repeating its own
           first samples (named padded), so its instance still reads only its own shards.
4. Interleave. Flat batch j is partition (j mod P)'s batch (j // P). The flat sequence is these
   batches in order: a function of the dataset, seed, epoch, P, the policy and the per-rank batch
   size b (as Streaming's is of its batch size), and of nothing else.

Dealing (`deal_batches`). Instance i of N takes flat batches j = i, i + N, i + 2N...: step k's
global batch (rank 0's batch k, rank 1's, ...) is flat batches kN ... kN + N - 1, for every N.
With N dividing P, instance i reads partitions i, i + N, ... only: whole shards of its own, bytes
read once in all (never parts of every shard). Inside an instance, worker w of W takes the
instance's batches w, w + W, ... (InstancePlan.strided), which DataLoader hands out round-robin:
the instance's batch order does not depend on W. A resumed segment (imagenet_shards/loader/resume.py)
deals the flat positions no earlier segment delivered, in order, the same way; its tail (fewer
batches left than a multiple of the new instance count) is dropped ("drop") or padded with the
remaining sequence's first batches ("pad"), named in the report and ledger. Each batch is augmented
with a generator seeded by its flat batch number (InstancePlan.batch_ids, read_loop.FlatTag), so the
pixels, not only the keys, are the same at any scale and across a resume.

Everything here is positions (ints), so the order of 1.28M samples is a few numpy calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from imagenet_shards.balance import DROP, PAD, SPREAD, instance_counts
from imagenet_shards.loader.share_plan import InstancePlan, PlanError

DEFAULT_PARTITIONS = 64  # divides 1, 2, 4, 8, 16, 32 and 64 instances (x workers)
# Samples shuffled together inside a partition: Streaming's py1b/py1e default block, 2**18 (a
# partition of ImageNet's train split at P = 64 is ~20k samples: one block)
DEFAULT_BLOCK = 1 << 18
ORDER_NAMES = ("shards", "global")  # get_data's order: "shards" is today's (share_plan.py)


@dataclass(frozen=True)
class GlobalOrder:
    """get_data's order="global" settings: the canonical partition count and the shuffle block."""

    partitions: int = DEFAULT_PARTITIONS
    block: int = DEFAULT_BLOCK

    def __post_init__(self):
        if int(self.partitions) < 1 or int(self.block) < 1:
            raise PlanError(f"the global order needs partitions >= 1 and block >= 1, got {self.partitions}, "
                            f"{self.block}")

    def to_json(self) -> dict:
        return {"name": "global", "partitions": int(self.partitions), "block": int(self.block)}


def order_setting(order):
    """get_data's `order` as a GlobalOrder, or None for today's order ("shards" or None)."""
    if order is None or order == "shards":
        return None
    if order == "global":
        return GlobalOrder()
    if isinstance(order, GlobalOrder):
        return order
    raise PlanError(f"unknown order {order!r} (choose from {', '.join(ORDER_NAMES)}, or a GlobalOrder(partitions=...))")


@dataclass(frozen=True)
class FlatLayout:
    """The epoch-independent shape of the flat sequence: lengths, the tail, the padded slots."""

    total: int  # samples of the split
    partitions: int
    batch_size: int
    policy: str  # "drop" or "pad"

    @property
    def partition_sizes(self) -> list:
        return instance_counts(self.total, self.partitions, SPREAD)

    @property
    def batches_per_partition(self) -> int:
        sizes, b = self.partition_sizes, self.batch_size
        return min(sizes) // b if self.policy == DROP else -(-max(sizes) // b)

    def __len__(self) -> int:
        return self.partitions * self.batches_per_partition * self.batch_size

    def padded_mask(self) -> np.ndarray:
        """True at the flat positions that repeat a sample of their partition ("pad")."""
        per, b, parts = self.batches_per_partition, self.batch_size, self.partitions
        stream = np.arange(per * b, dtype=np.int64)  # a position inside its partition's stream
        beyond = stream[None, :] >= np.asarray(self.partition_sizes, dtype=np.int64)[:, None]  # (P, per*b)
        return _interleave(beyond, per, b).astype(bool)


def check_layout(layout: FlatLayout, instances: int) -> None:
    """PlanError when the global order cannot serve `instances` (it must divide P) or the split is too small."""
    if layout.policy not in (DROP, PAD):
        raise PlanError(f"the global order deals train policies drop and pad, not {layout.policy!r} "
                        f"(validation keeps its exactly-once order)")
    if instances < 1 or layout.partitions % instances:
        raise PlanError(f"the global order with {layout.partitions} partitions needs an instance count that divides "
                        f"it, got {instances}: give order=GlobalOrder(partitions=...) a multiple of it")
    if layout.total < layout.partitions:  # "pad" would have an empty partition to repeat
        raise PlanError(f"{layout.total} samples cannot fill {layout.partitions} partitions: use fewer partitions")
    if len(layout) == 0:
        raise PlanError(f"{layout.total} samples in {layout.partitions} partitions leave no whole batch of "
                        f"{layout.batch_size} per partition: use fewer partitions or policy 'pad'")


def _interleave(streams: np.ndarray, per: int, b: int) -> np.ndarray:
    """(P, per*b) partition streams -> the flat sequence: batch j is partition j % P's batch j // P."""
    parts = streams.shape[0]
    return streams.reshape(parts, per, b).transpose(1, 0, 2).reshape(-1)


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
    sizes, b = layout.partition_sizes, layout.batch_size
    per = layout.batches_per_partition
    length = per * b
    streams, dropped, start = np.empty((layout.partitions, length), dtype=np.int64), [], 0
    for partition, size in enumerate(sizes):
        stream = np.arange(start, start + size, dtype=np.int64)
        start += size
        rng = partition_rng(seed, epoch, partition)
        for first in range(0, size, block or size or 1):
            if block:
                stream[first:first + block] = rng.permutation(stream[first:first + block])
        if length <= size:
            streams[partition], tail = stream[:length], stream[length:]
            dropped.append(tail)
        else:  # "pad": the partition's own first samples again
            streams[partition] = np.resize(stream, length)
    dropped = np.concatenate(dropped) if dropped else np.zeros(0, dtype=np.int64)
    return FlatSequence(_interleave(streams, per, b), np.sort(dropped), layout)


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
    in order; all of them for a fresh epoch), in flat positions. `padded_mask`: layout.padded_mask(),
    passed when already made. The partitions' own tail (FlatSequence.dropped) is the caller's to add."""
    positions = np.asarray(positions, dtype=np.int64)
    b = layout.batch_size
    indices, padded, dropped = deal_batches(len(positions), instance, count, b, layout.policy)
    items = positions[indices]
    if layout.policy == PAD:
        mask = layout.padded_mask() if padded_mask is None else padded_mask
        repeats = positions[padded].tolist() + items[mask[items]].tolist()
        padded = np.asarray(repeats, dtype=np.int64)
    else:
        padded = np.zeros(0, dtype=np.int64)
    counts = [len(deal_batches(len(positions), i, count, b, layout.policy)[0]) for i in range(count)]
    # each batch's flat number: its first position's batch (a resumed segment's batches stay whole)
    return InstancePlan(items, b, False, layout.policy, counts, padded=padded, policy_dropped=positions[dropped],
                        strided=True, batch_ids=items[::b] // b)
