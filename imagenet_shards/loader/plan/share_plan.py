"""Who reads which samples: pure planning, no I/O.

Everything the loader does reduces to one ordered list per instance per epoch: the
samples this instance reads. The rules, identical on every instance (so no instance
needs to talk to another):

1. Epoch order: the shards (groups of samples) are permuted with a generator seeded by
   (seed, epoch), then concatenated into one global sequence. Samples keep their order
   inside a shard, so reading stays sequential.
2. Instance share: instance i of N takes a contiguous range of that sequence, as many
   samples as the policy gives it (imagenet_shards.balance, the repartitioner's counts too).
   - "spread": every sample exactly once, counts differ by at most 1 (validation).
   - "drop":   every instance gets floor(n/N); the last n mod N samples of the epoch's
               sequence are left out (which ones changes with the epoch).
   - "pad":    every instance gets ceil(n/N); the sequence is extended by repeating its
               first samples, which are named as padding.
3. Worker share: an instance's list is cut into batches, and each DataLoader worker gets
   a contiguous run of whole batches, so every worker reads sequential byte ranges and
   the instance's batch count does not depend on the worker count. With `drop_last`
   the final partial batch of the instance is left out (named in the report).

Positions are used instead of items so that the plan can be computed for 1.28M samples
in milliseconds and checked in tests on plain integers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# DEFAULT_POLICY and POLICIES: the loader takes the policies' names and defaults from here.
from imagenet_shards.balance import DEFAULT_POLICY, DROP, POLICIES, SPREAD, UnknownPolicyError, instance_counts  # noqa: F401
from imagenet_shards.errors import Error

TAKE_CHUNK = 1 << 16  # positions mapped to rows per step (GroupedOrder.take)


class PlanError(Error, ValueError):
    """A plan that cannot be made (bad policy, more instances than samples...)."""


def epoch_permutation(count: int, seed: int, epoch: int) -> list[int]:
    """A permutation of range(count) that depends only on (seed, epoch): same on every instance."""
    if count <= 1:
        return list(range(count))
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch)])))
    return rng.permutation(count).tolist()


def epoch_sequence(groups: Sequence[Sequence], seed: int, epoch: int, shuffle: bool = True) -> list:
    """Concatenate `groups` (e.g. one list of samples per shard) in the epoch's group order."""
    order = epoch_permutation(len(groups), seed, epoch) if shuffle else range(len(groups))
    sequence = []
    for number in order:
        sequence.extend(groups[number])
    return sequence


class GroupedOrder:
    """The epoch's global sequence over a columnar index, without building it: the groups are row
    ranges [start, start + size) (one per shard), concatenated in `order`. `take(positions)` gives
    the rows at those positions of the sequence, so an instance materialises only its own share
    (a worker holds an int array of its rows, never a list of records)."""

    def __init__(self, starts, sizes, order=None):
        starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
        if order is not None:
            order = np.asarray(order, dtype=np.int64)
            starts, sizes = starts[order], sizes[order]
        self.starts, self.sizes = starts, sizes
        self.ends = np.cumsum(sizes)
        # the largest row + 1 (a Mix's items pass one source's size: imagenet_shards/loader/mix.py)
        self.row_limit = int((starts + sizes).max()) if len(starts) else 0

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def take(self, positions) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        # int32 rows: a plan of 1.28M samples is 5 MB in each process that makes it
        rows = np.empty(len(positions), dtype=np.int32 if self.row_limit < 2**31 else np.int64)
        for first in range(0, len(positions), TAKE_CHUNK):  # the int64 temporaries of a chunk, not of the plan
            chunk = positions[first:first + TAKE_CHUNK]
            group = np.searchsorted(self.ends, chunk, side="right")
            rows[first:first + TAKE_CHUNK] = self.starts[group] + chunk - (self.ends[group] - self.sizes[group])
        return rows

    def __getitem__(self, position: int) -> int:
        return int(self.take([position])[0])


def epoch_order(starts, sizes, seed: int, epoch: int, shuffle: bool = True) -> GroupedOrder:
    """`epoch_sequence` for groups given as row ranges: the same group order, lazily."""
    order = np.asarray(epoch_permutation(len(starts), seed, epoch), dtype=np.int64) if shuffle else None
    return GroupedOrder(starts, sizes, order)


@dataclass(frozen=True)
class Balance:
    """How `total` samples are dealt to `count` instances under `policy`.

    `ranges[i]` are positions into the extended sequence (positions >= total stand for
    position - total, wrapping around: they are the repeats of "pad").
    """

    total: int
    count: int
    policy: str
    ranges: tuple  # ((start, stop), ...) per instance
    dropped: range  # positions left out by "drop"
    padded: range  # positions >= total: repeats made by "pad"

    def positions(self, instance: int) -> list[int]:
        start, stop = self.ranges[instance]
        return [p % self.total for p in range(start, stop)]

    def counts(self) -> list[int]:
        return [stop - start for start, stop in self.ranges]


def balance(total: int, count: int, policy: str) -> Balance:
    """Contiguous position ranges of the counts imagenet_shards.balance gives each instance."""
    try:
        counts = instance_counts(max(total, 0), max(count, 1), policy)
    except UnknownPolicyError as error:
        raise PlanError(str(error)) from None
    if count < 1:
        raise PlanError(f"the instance count must be at least 1, got {count}")
    if total < 1:
        raise PlanError("there are no samples to deal")
    if policy == DROP and counts[0] == 0:
        raise PlanError(
            f"policy 'drop' with {count} instances and {total} samples leaves every instance "
            f"with no sample; use 'pad' or fewer instances"
        )
    ends = np.cumsum(counts).tolist()
    ranges = tuple((end - n, end) for n, end in zip(counts, ends))
    dealt = ends[-1]
    return Balance(total, count, policy, ranges, range(min(dealt, total), total), range(total, max(dealt, total)))


def batches_in(samples: int, batch_size: int, drop_last: bool) -> int:
    if batch_size < 1:
        raise PlanError(f"the batch size must be at least 1, got {batch_size}")
    return samples // batch_size if drop_last else -(-samples // batch_size)


def worker_ranges(samples: int, batch_size: int, workers: int, drop_last: bool) -> list[tuple[int, int]]:
    """Contiguous sample ranges per worker, made of whole batches (the last may be partial).

    Workers with no batch get an empty range; `workers` 0 (no worker process) counts as 1.
    """
    workers = max(workers, 1)
    batches = batches_in(samples, batch_size, drop_last)
    ranges = []
    for w in range(workers):
        first, last = w * batches // workers, (w + 1) * batches // workers
        ranges.append((min(first * batch_size, samples), min(last * batch_size, samples)))
    return ranges


@dataclass
class InstancePlan:
    """The samples one instance reads in one epoch, and what the policy did to reach it."""

    items: list  # in reading order (an int array of rows for a columnar index)
    batch_size: int
    drop_last: bool
    policy: str
    instance_counts: list  # samples per instance (all instances), before drop_last
    padded: list = field(default_factory=list)  # this instance's items that are repeats ("pad")
    policy_dropped: list = field(default_factory=list)  # items no instance reads this epoch ("drop")
    last_batch_dropped: list = field(default_factory=list)  # this instance's partial last batch, with drop_last
    # False: worker w reads a contiguous run of whole batches; True (the global order,
    # imagenet_shards/loader/plan/global_order.py): the batches w, w + W, ..., so DataLoader's round-robin
    # hands them out in plan order whatever the worker count
    strided: bool = False
    sample_ids: object = None  # the global order: each item's flat position (its augmentation's seed)

    @property
    def batches(self) -> int:
        return batches_in(len(self.items), self.batch_size, self.drop_last)

    def worker_items(self, worker: int, workers: int) -> list:
        if self.strided:
            indices = self._strided_indices(worker, max(workers, 1))
            return self.items[indices] if isinstance(self.items, np.ndarray) else [self.items[i] for i in indices]
        start, stop = worker_ranges(len(self.items), self.batch_size, workers, self.drop_last)[worker]
        return self.items[start:stop]

    def worker_sample_ids(self, worker: int, workers: int):
        """The flat positions of worker `worker`'s items (global order), or None."""
        if self.sample_ids is None:
            return None
        return np.asarray(self.sample_ids)[self._strided_indices(worker, max(workers, 1))]

    def strided_batch_numbers(self, worker: int, workers: int) -> np.ndarray:
        return np.arange(worker, self.batches, workers, dtype=np.int64)

    def worker_batches(self, workers: int) -> list:
        """Batches per worker (`workers` 0 counts as 1)."""
        workers = max(workers, 1)
        if self.strided:
            return [len(range(w, self.batches, workers)) for w in range(workers)]
        return [batches_in(stop - start, self.batch_size, self.drop_last)
                for start, stop in worker_ranges(len(self.items), self.batch_size, workers, self.drop_last)]

    def _strided_indices(self, worker: int, workers: int) -> np.ndarray:
        size = self.batch_size
        batches = self.strided_batch_numbers(worker, workers)
        indices = (batches[:, None] * size + np.arange(size, dtype=np.int64)).reshape(-1)
        return indices[indices < len(self.items)]


def plan_instance(sequence: Sequence, instance: int, count: int, policy: str, batch_size: int,
                  drop_last: bool) -> InstancePlan:
    """Deal `sequence` (the epoch's global order) and return instance `instance`'s plan."""
    if not 0 <= instance < count:
        raise PlanError(f"instance {instance} is out of range for {count} instances")
    dealt = balance(len(sequence), count, policy)
    start, stop = dealt.ranges[instance]
    if hasattr(sequence, "take"):  # a GroupedOrder (rows of a columnar index, int arrays) or a resume's SubOrder
        def pick(first, last):
            return sequence.take(np.arange(first, last, dtype=np.int64) % dealt.total)
        items = pick(start, stop)
        padded = pick(max(start, dealt.total), stop)
        dropped = pick(dealt.dropped.start, dealt.dropped.stop)
    else:
        items = [sequence[p % dealt.total] for p in range(start, stop)]
        padded = [sequence[p % dealt.total] for p in range(max(start, dealt.total), stop)]
        dropped = [sequence[p] for p in dealt.dropped]
    plan = InstancePlan(
        items=items,
        batch_size=batch_size,
        drop_last=drop_last,
        policy=policy,
        instance_counts=dealt.counts(),
        padded=padded,
        policy_dropped=dropped,
    )
    if drop_last:
        plan.last_batch_dropped = items[plan.batches * batch_size:]
    return plan


def plan_own_share(items: Sequence, counts: Sequence[int], batch_size: int, drop_last: bool, policy: str,
                   padded: Sequence = ()) -> InstancePlan:
    """The plan for an instance whose share was fixed beforehand (a repartition's manifest)."""
    items = items if isinstance(items, np.ndarray) else list(items)
    plan = InstancePlan(items, batch_size, drop_last, policy, list(counts), padded=list(padded))
    if drop_last:
        plan.last_batch_dropped = plan.items[plan.batches * batch_size:]
    return plan
