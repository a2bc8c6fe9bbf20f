"""The pure planner of a repartition: which shards each instance reads whole, and which samples are
copied into its remainder shard so that every instance ends with its share.

A split of T samples in S shards, read by N instances, rarely divides evenly: S is not a multiple
of N, or the last shard is partial. Planning (`plan_split`) reads and writes no file:
  1. Targets: the samples each instance ends with under the split's policy, as the loader deals
     them (imagenet_shards.balance: `spread` T//N each and the first T%N one more, `drop` T//N each,
     `pad` ceil(T/N) each; its docstring has the policies and their defaults).
  2. Whole shards, largest first, each to the instance with the most room left (ties: lowest index),
     if it fits under that instance's target. The shards that fit nowhere form the pool.
     Why this bounds the copying: a shard stays in the pool only if it is larger than every
     instance's remaining room at that moment, and room only shrinks; so at the end every
     instance lacks fewer samples than any pool shard holds (with an empty pool, only `pad` leaves
     room: its pad slots). At most one shard's worth is copied per instance, and nothing at all
     when the shards already divide evenly.
  3. The pool's samples (in dataset order) fill each instance's remaining room, in instance order;
     `drop` leaves out the pool's last T%N samples; `pad` first reserves pad slots (dealt one at a
     time over the instances with room) and fills them with distinct samples the receiving instance
     does not already read. Dropped samples belong to no instance; the manifest lists them at the
     split and, one each, at the first T%N instances (those `spread` would give one more sample).
  Planning is linear in the number of samples (plus a sort of the shards by size); see
  benchmarks/repartition_benchmark.py for ImageNet-sized figures.

Contract: `plan_split(split, shards, records_by_shard, N, policy)` takes the split's ShardRecords
and its records by shard (as imagenet_shards.repartition.source.group_records_by_shard returns them) and
returns a SplitRepartition; a wrong N or policy raises RepartitionUsageError (exit code 2).
`remainder_records` gives the index records that copied samples have in the remainder shard
imagenet_shards.repartition.write writes, byte for byte in plan order from offset 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from imagenet_shards.balance import UnknownPolicyError, check_policy, instance_counts
from imagenet_shards.index import SampleRecord
from imagenet_shards.errors import UsageError


class RepartitionUsageError(UsageError, ValueError):
    """A wrong argument (bad N, unknown split or policy, a target that is not a dataset): exit code 2."""


@dataclass(frozen=True)
class InstanceShare:
    instance: int
    shards: tuple  # names of the shards it reads whole, in dataset order
    whole_samples: int
    whole_bytes: int
    copied: tuple  # SampleRecords copied into its remainder shard, in read order (own samples, then pads)
    padded_keys: tuple = ()
    dropped_keys: tuple = ()

    @property
    def samples(self) -> int:
        return self.whole_samples + len(self.copied)

    @property
    def copied_bytes(self) -> int:
        return sum(record.record_size for record in self.copied)


@dataclass(frozen=True)
class SplitRepartition:
    split: str
    policy: str
    num_instances: int
    total_samples: int
    instances: tuple
    dropped_keys: tuple = ()
    padded_keys: tuple = ()

    @property
    def samples_per_instance(self):
        return [instance.samples for instance in self.instances]

    @property
    def copied_samples(self) -> int:
        return sum(len(instance.copied) for instance in self.instances)

    @property
    def copied_bytes(self) -> int:
        return sum(instance.copied_bytes for instance in self.instances)


def known_policy(policy) -> str:
    """`policy` if it is one of imagenet_shards.balance's, else a RepartitionUsageError naming it."""
    try:
        return check_policy(policy)
    except UnknownPolicyError as error:
        raise RepartitionUsageError(str(error)) from None


def instance_targets(total: int, num_instances: int, policy: str):
    """Samples each instance must end with under `policy` (imagenet_shards.balance.instance_counts)."""
    return instance_counts(total, num_instances, known_policy(policy))


def assign_whole_shards(shard_sizes, targets):
    """Owner instance of each shard (None: the shard goes to the pool). See the module docstring."""
    import heapq

    owners = [None] * len(shard_sizes)
    room = list(targets)
    heap = [(-r, i) for i, r in enumerate(room)]
    heapq.heapify(heap)
    for shard in sorted(range(len(shard_sizes)), key=lambda s: -shard_sizes[s]):
        size = shard_sizes[shard]
        most_room, instance = heap[0]
        if size <= -most_room:
            owners[shard] = instance
            room[instance] -= size
            heapq.heapreplace(heap, (-room[instance], instance))
    return owners, room


def _deal_pad_slots(room, pads: int):
    """Pad slots per instance: one at a time, round robin over the instances that still have room."""
    slots = [0] * len(room)
    while pads:
        placed = False
        for i, r in enumerate(room):
            if pads and slots[i] < r:
                slots[i] += 1
                pads -= 1
                placed = True
        if not placed:
            raise AssertionError("no room left for padding (planning bug)")
    return slots


def _choose_pads(receiver: int, count: int, candidates, owner_of, used: set):
    """`count` distinct samples that `receiver` does not read and no other pad repeats."""
    chosen = []
    for record in candidates():
        if len(chosen) == count:
            break
        if record.key in used or owner_of(record) == receiver:
            continue
        used.add(record.key)
        chosen.append(record)
    if len(chosen) < count:
        raise AssertionError("not enough distinct samples to pad with (planning bug)")
    return chosen


def plan_split(split, shards, records_by_shard, num_instances: int, policy: str) -> SplitRepartition:
    """Plan one split (pure). `records_by_shard` as returned by group_records_by_shard."""
    known_policy(policy)
    if num_instances < 1:
        raise RepartitionUsageError(f"the number of instances must be at least 1, got {num_instances}")
    total = sum(shard.samples for shard in shards)
    if total < num_instances:
        raise RepartitionUsageError(
            f"{split} has {total} samples, fewer than the {num_instances} instances: some would get none"
        )
    targets = instance_targets(total, num_instances, policy)
    owners, room = assign_whole_shards([shard.samples for shard in shards], targets)

    pool = [record for shard, owner in zip(shards, owners) if owner is None for record in records_by_shard[shard.name]]
    pool, dropped, pad_slots = _split_pool(pool, room, policy, num_instances)
    own_copies, pool_owner = _deal_pool(pool, room, pad_slots, num_instances)
    pads = _choose_all_pads(shards, records_by_shard, owners, pool, pool_owner, pad_slots, num_instances)
    return SplitRepartition(
        split=split,
        policy=policy,
        num_instances=num_instances,
        total_samples=total,
        instances=_instance_shares(shards, owners, own_copies, pads, dropped, num_instances),
        dropped_keys=tuple(record.key for record in dropped),
        padded_keys=tuple(record.key for pad in pads for record in pad),
    )


def _split_pool(pool, room, policy: str, num_instances: int):
    """(the pool samples to copy, the samples `drop` leaves out, the pad slots of each instance)."""
    dropped = []
    pad_slots = [0] * num_instances
    missing = sum(room)
    if policy == "drop":
        leftover = len(pool) - missing
        dropped, pool = pool[len(pool) - leftover :], pool[: len(pool) - leftover]
    elif policy == "pad":
        pad_slots = _deal_pad_slots(room, missing - len(pool))
    if len(pool) != missing - sum(pad_slots):
        raise AssertionError("pool and room disagree (planning bug)")
    return pool, dropped, pad_slots


def _deal_pool(pool, room, pad_slots, num_instances: int):
    """Each instance's own copies, and {key: instance} of the pool's samples."""
    # Deal the pool in order: each instance's copies come from few, consecutive source ranges.
    own_copies, cursor = [], 0
    pool_owner = {}
    for i in range(num_instances):
        take = room[i] - pad_slots[i]
        own_copies.append(pool[cursor : cursor + take])
        for record in own_copies[-1]:
            pool_owner[record.key] = i
        cursor += take
    return own_copies, pool_owner


def _choose_all_pads(shards, records_by_shard, owners, pool, pool_owner, pad_slots, num_instances: int):
    """Each instance's pads: distinct samples it does not read itself (see _choose_pads)."""
    shard_owner = {shard.name: owner for shard, owner in zip(shards, owners)}

    def owner_of(record):
        return pool_owner.get(record.key, shard_owner[record.shard])

    def candidates():  # pool samples first: they are read (and verified) anyway
        yield from pool
        for shard in shards:
            yield from records_by_shard[shard.name]

    used, pads = set(), []
    for i in range(num_instances):
        pads.append(_choose_pads(i, pad_slots[i], candidates, owner_of, used) if pad_slots[i] else [])
    return pads


def _instance_shares(shards, owners, own_copies, pads, dropped, num_instances: int) -> tuple:
    """The InstanceShare of each instance: its whole shards, then its copies and pads, and the dropped
    keys listed at it."""
    # Dropped samples belong to no instance; they are listed at the instances that `spread`
    # would have given one more sample (the first T%N).
    dropped_by_instance = [[] for _ in range(num_instances)]
    for j, record in enumerate(dropped):
        dropped_by_instance[j % num_instances].append(record.key)

    whole = [[] for _ in range(num_instances)]
    for shard, owner in zip(shards, owners):
        if owner is not None:
            whole[owner].append(shard)
    instances = []
    for i in range(num_instances):
        mine = whole[i]
        instances.append(
            InstanceShare(
                instance=i,
                shards=tuple(shard.name for shard in mine),
                whole_samples=sum(shard.samples for shard in mine),
                whole_bytes=sum(shard.bytes for shard in mine),
                copied=tuple(own_copies[i]) + tuple(pads[i]),
                padded_keys=tuple(record.key for record in pads[i]),
                dropped_keys=tuple(dropped_by_instance[i]),
            )
        )
    return tuple(instances)


def remainder_records(copied, remainder_shard: str):
    """The index records of samples copied verbatim, in order, into `remainder_shard` from offset 0."""
    out, offset = [], 0
    for record in copied:
        shift = offset - record.record_offset
        members = ";".join(f"{ext}:{position + shift}" for ext, position in record.member_offsets().items())
        out.append(
            SampleRecord(
                key=record.key,
                shard=remainder_shard,
                label=record.label,
                record_offset=offset,
                record_size=record.record_size,
                payload_offset=record.payload_offset + shift,
                payload_size=record.payload_size,
                payload_crc32c=record.payload_crc32c,
                members=members,
                bbox=record.bbox,
            )
        )
        offset += record.record_size
    return out
