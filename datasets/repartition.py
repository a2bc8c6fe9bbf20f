"""Give every instance of a distributed job an equal share of a converted dataset, moving as little as possible.

A split of T samples in S shards, read by N instances, rarely divides evenly: S is not a multiple
of N, or the last shard is partial. This module plans and writes a repartition:

    DIR/distributed/<N>-instances/
        manifest.json                       written last: its presence means the repartition is complete
        <split>-remainder-0000.tar ...      per instance, the samples copied to balance it (or none)
        <split>-instance-0000.txt ...       per instance, the shards it reads, one path (relative to DIR) a line
        <split>-instance-0000.index.tsv     per instance, a sample index (datasets.index format) of exactly
                                            its samples in read order, `shard` relative to DIR
        <split>-000000.tar ...              img only, N > 1: what the reference harness's loader reads
        <split>-reference.index.tsv           (see `reference_remainders`); their sample index

Planning (pure functions, `plan_split`):
  1. Targets: the samples each instance ends with under the split's policy, as the loader deals
     them (datasets.balance: `spread` T//N each and the first T%N one more, `drop` T//N each,
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

Execution copies each planned sample's whole byte range (SampleRecord.record_offset/record_size)
verbatim into the instance's remainder shard: tar headers and TFRecord framing hold no offsets, so
the copy is valid as it is, and every payload stays byte-identical. Nothing is decoded or
re-encoded. Each copied payload's sha256 is checked against the index while copying. The writer is
chosen by the dataset's format through the registry (datasets.formats).

Safety:
  * The original shards, indexes and metadata.json are only read.
  * Input is checked before anything is written: metadata.json, the split's sample index (its
    sha256 against metadata), index against shard list, every shard's size (a stat, cheap), and
    the sha256 of every shard that samples are copied from (`verify="copied"`, the default: about
    one shard per instance is read twice, once to hash, once to copy). `verify="all"` hashes every
    shard of the selected splits: on ImageNet (~150 GB) that is ~80 s of sha256 per core at
    ~1.8 GB/s, and usually longer because the disk or NFS is slower than that. Whole shards that
    are not copied from are left to validate_dataset.py, which checks every shard.
  * Files are written atomically (datasets.fileio), the manifest last. A per-split plan stamp
    (`<split>.plan.json`, removed once the manifest is written) lets a re-run after a crash or
    SIGKILL keep the remainder shards it already finished for the same plan, and discard anything
    from another plan.
  * A re-run with the same N, splits and policies, over an unchanged metadata.json, is a no-op.
    A different N gets its own folder. Changing the policy of a split already repartitioned needs
    `overwrite=True`; a repartition made from an older metadata.json (the dataset was re-converted)
    is stale and is replaced. The manifest never points at a file that is being rewritten: entries
    about to change are removed from it first.
"""

from __future__ import annotations

import fcntl
import itertools
import hashlib
import json
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from datasets.metadata_digest import EDITED, MALFORMED, digest_status, sealed
from datasets.fileio import PARTIAL_SUFFIX, atomic_write_bytes, atomic_write_json, hash_file, sha256_bytes, sha256_file
from datasets.balance import UnknownPolicyError, check_policy, default_policy, instance_counts
from datasets.index import (
    METADATA_FILE,
    DatasetError,
    SampleRecord,
    ShardRecord,
    parse_metadata,
    payload_problem,
    write_sample_index,
)
from datasets.layout import DISTRIBUTED_DIR, REPARTITION_MANIFEST
from datasets.formats import ShardDataError, UnknownFormatError, get_format
from datasets.reference.remainders import LOADER_REMAINDERS, reference_remainders, write_loader_remainders
from datasets.sample_columns import SampleColumns, ShardGroups, columns_from_records, read_sample_columns

MANIFEST_VERSION = 1


class RepartitionUsageError(ValueError):
    """A wrong argument (bad N, unknown split or policy, a target that is not a dataset): exit code 2."""


def output_dir(target, num_instances: int) -> Path:
    return Path(target) / DISTRIBUTED_DIR / f"{num_instances}-instances"


def remainder_format(fmt: str):
    """The dataset format (datasets.formats) that writes this dataset's remainder shards."""
    try:
        return get_format(fmt)
    except UnknownFormatError as error:
        raise DatasetError(f"format {fmt!r} cannot be repartitioned: {error}") from None


# ------------------------------------------------------------------------------------------ planning


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
    """`policy` if it is one of datasets.balance's, else a RepartitionUsageError naming it."""
    try:
        return check_policy(policy)
    except UnknownPolicyError as error:
        raise RepartitionUsageError(str(error)) from None


def instance_targets(total: int, num_instances: int, policy: str):
    """Samples each instance must end with under `policy` (datasets.balance.instance_counts)."""
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


def group_records_by_shard(shards, records, split="?", alignment=1) -> ShardGroups:
    """Check the index (SampleColumns, or SampleRecords) against the shard list and return
    {shard name: records in offset order} (a ShardGroups: one shard's records built when asked for).

    Raises DatasetError for an index that does not describe the shards (a sample in an unknown
    shard, a count that differs from the metadata, a duplicate key, overlapping or out-of-range
    byte ranges); the first problem in index order, then in the shard list's order.
    """
    columns = records if isinstance(records, SampleColumns) else columns_from_records(records, checksums=True)
    names = {shard.name: number for number, shard in enumerate(shards)}
    if len(names) != len(shards):
        raise DatasetError(f"{split}: metadata lists a shard twice")
    listed = np.array([names.get(name, -1) for name in columns.shard_names], dtype=np.int64)
    position = listed[columns.shard_ids] if len(columns) else np.zeros(0, dtype=np.int64)
    _check_keys_and_shards(columns, position, split)
    groups = ShardGroups(columns, by_offset=True)
    order = groups.order
    offsets, sizes = columns.record_offsets[order], columns.record_sizes[order].astype(np.int64)
    limit = np.array([shard.bytes for shard in shards], dtype=np.int64)[position[order]]
    ends = offsets + sizes
    previous = np.r_[0, ends[:-1]] if len(ends) else ends
    previous[groups.starts[:-1][groups.starts[:-1] < len(previous)]] = 0  # each shard starts afresh
    bad = (offsets < previous) | (sizes <= 0) | (offsets % alignment != 0) | (sizes % alignment != 0) | (ends > limit)
    bad_shards = set(columns.shard_ids[order[bad]].tolist())
    for shard in shards:
        count = groups.count(shard.name)
        if count != shard.samples:
            raise DatasetError(f"{shard.name}: metadata says {shard.samples} samples, the {split} index lists {count}")
        number = groups.ids.get(shard.name)
        if number in bad_shards:
            start, stop = groups.starts[number], groups.starts[number + 1]
            first = int(order[start + np.flatnonzero(bad[start:stop])[0]])
            raise DatasetError(
                f"{shard.name}: the index gives sample {columns.key(first)!r} the byte range "
                f"{int(columns.record_offsets[first])}+{int(columns.record_sizes[first])}, which is not a valid "
                f"record of a {shard.bytes}-byte shard"
            )
    return groups


def _check_keys_and_shards(columns: SampleColumns, position, split):
    """The first line (in index order) whose key repeats an earlier one or whose shard metadata does not
    list, as a DatasetError."""
    unknown = np.flatnonzero(position < 0)
    first_unknown = int(unknown[0]) if len(unknown) else len(columns)
    repeats = columns.rows_with_keys(columns.duplicate_keys())
    second = min((rows[1] for rows in repeats.values()), default=len(columns))
    if second < first_unknown:
        raise DatasetError(f"{split}: sample key {columns.key(second)!r} appears twice in the index")
    if first_unknown < len(columns):
        raise DatasetError(f"{split}: the index places sample {columns.key(first_unknown)!r} in "
                           f"{columns.shard(first_unknown)!r}, which metadata does not list")


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

    # Deal the pool in order: each instance's copies come from few, consecutive source ranges.
    own_copies, cursor = [], 0
    pool_owner = {}
    for i in range(num_instances):
        take = room[i] - pad_slots[i]
        own_copies.append(pool[cursor : cursor + take])
        for record in own_copies[-1]:
            pool_owner[record.key] = i
        cursor += take
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
    return SplitRepartition(
        split=split,
        policy=policy,
        num_instances=num_instances,
        total_samples=total,
        instances=tuple(instances),
        dropped_keys=tuple(record.key for record in dropped),
        padded_keys=tuple(record.key for pad in pads for record in pad),
    )


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
                payload_sha256=record.payload_sha256,
                members=members,
                bbox=record.bbox,
            )
        )
        offset += record.record_size
    return out


# ------------------------------------------------------------------------------------------ loading


@dataclass
class SourceDataset:
    target: Path
    metadata: dict
    metadata_sha256: str
    format: str
    splits: dict = field(default_factory=dict)  # split -> (shards, records_by_shard)


def load_dataset(target) -> SourceDataset:
    target = Path(target)
    if not target.is_dir():
        raise RepartitionUsageError(f"{target}: no such directory")
    path = target / METADATA_FILE
    if not path.is_file():
        raise RepartitionUsageError(f"{target}: not a converted dataset ({METADATA_FILE} is missing)")
    data = path.read_bytes()
    metadata = parse_metadata(data, path)
    status, message = digest_status(metadata)
    if status in (EDITED, MALFORMED):  # its shard list is what the copies would be made from
        raise DatasetError(f"{path}: {message}")
    fmt = metadata["format"]
    remainder_format(fmt)
    if not isinstance(metadata["splits"], dict) or not metadata["splits"]:
        raise DatasetError(f"{path}: lists no splits")
    return SourceDataset(target, metadata, sha256_bytes(data), fmt)


def split_length(dataset: SourceDataset, split: str) -> int:
    entry = dataset.metadata["splits"][split]
    try:
        return sum(int(shard["samples"]) for shard in entry["shards"])
    except (KeyError, TypeError, ValueError):
        raise DatasetError(f"{dataset.target / METADATA_FILE}: the shard list of {split!r} is malformed") from None


def load_split(dataset: SourceDataset, split: str):
    """Shards and checked sample records of a split. Reads the index (checking its sha256) and stats shards."""
    entry = dataset.metadata["splits"][split]
    source = dataset.target / METADATA_FILE
    try:
        shards = [ShardRecord.from_json(s) for s in entry["shards"]]
        index_info = entry["index"]
        index_path = dataset.target / index_info["name"]
    except (KeyError, TypeError, ValueError):
        raise DatasetError(f"{source}: the entry of split {split!r} is malformed (shards or index missing)") from None
    try:
        index_sha256 = sha256_file(index_path)[0]
    except OSError as error:
        raise DatasetError(f"{index_path}: cannot read the sample index: {error.strerror or error}") from None
    if index_sha256 != index_info.get("sha256"):
        raise DatasetError(f"{index_path}: sha256 does not match metadata.json (the index changed since conversion)")
    records = read_sample_columns(index_path, hashes=True)  # read as a stream; records built per shard
    if "length" in entry and int(entry["length"]) != len(records):
        raise DatasetError(f"{index_path}: lists {len(records)} samples, metadata.json says {entry['length']}")
    for shard in shards:
        path = dataset.target / shard.name
        try:
            size = path.stat().st_size
        except OSError as error:
            raise DatasetError(f"{path}: cannot read the shard: {error.strerror or error}") from None
        if size != shard.bytes:
            raise DatasetError(
                f"{path}: {size} bytes, metadata.json says {shard.bytes} (the shard was truncated or replaced)"
            )
    by_shard = group_records_by_shard(shards, records, split, remainder_format(dataset.format).record_alignment)
    dataset.splits[split] = (shards, by_shard)
    return shards, by_shard


# ------------------------------------------------------------------------------------------ the request


@dataclass(frozen=True)
class Request:
    target: Path
    num_instances: int
    policies: dict  # split -> policy, for the splits to repartition, in order


def resolve_request(dataset: SourceDataset, num_instances: int, splits=None, policies=None) -> Request:
    """Check N, the splits and the policies against the dataset; a RepartitionUsageError otherwise.

    `policies` maps a split to a policy; the key None (or "*") applies to every split not named.
    """
    if not isinstance(num_instances, int) or num_instances < 1:
        raise RepartitionUsageError(f"the number of instances must be at least 1, got {num_instances}")
    available = list(dataset.metadata["splits"])
    splits = list(splits) if splits else available
    for split in splits:
        if split not in available:
            raise RepartitionUsageError(
                f"{dataset.target}: has no split {split!r} (it has {', '.join(available)})"
            )
    policies = dict(policies or {})
    for name in policies:
        if name not in (None, "*") and name not in available:
            raise RepartitionUsageError(f"--remainder names split {name!r}, which the dataset does not have")
    resolved = {}
    for split in dict.fromkeys(splits):
        policy = policies.get(split) or policies.get(None) or policies.get("*") or default_policy(split)
        known_policy(policy)
        length = split_length(dataset, split)
        if length < num_instances:
            raise RepartitionUsageError(
                f"{split} has {length} samples, fewer than the {num_instances} instances: some would get none"
            )
        resolved[split] = policy
    return Request(dataset.target, num_instances, resolved)


@dataclass
class Decision:
    build: list  # splits to (re)build
    keep: dict  # split -> existing manifest entry kept as it is
    drop_manifest_splits: list  # splits removed from the existing manifest before rebuilding them
    stale: bool  # the existing manifest was made from another metadata.json
    conflicts: list  # (split, existing policy, requested policy) that need overwrite


def decide(existing: Optional[dict], request: Request, source_sha256: str, fmt: str) -> Decision:
    """What to do given an existing manifest (pure)."""
    if existing is None:
        return Decision(list(request.policies), {}, [], False, [])
    if not isinstance(existing.get("splits"), dict):
        return Decision(list(request.policies), {}, [], True, [])  # unusable: replace it
    if (
        existing.get("source_metadata_sha256") != source_sha256
        or existing.get("num_instances") != request.num_instances
        or existing.get("format") != fmt
    ):
        return Decision(list(request.policies), {}, list(existing.get("splits", {})), True, [])
    old_splits = existing.get("splits", {})
    build, conflicts = [], []
    keep = {split: entry for split, entry in old_splits.items() if split not in request.policies}
    for split, policy in request.policies.items():
        if split in old_splits and old_splits[split].get("policy") == policy:
            keep[split] = old_splits[split]
        elif split in old_splits:
            conflicts.append((split, old_splits[split].get("policy"), policy))
            build.append(split)
        else:
            build.append(split)
    return Decision(build, keep, [s for s, _, _ in conflicts], False, conflicts)


# ------------------------------------------------------------------------------------------ execution


def _relative(num_instances: int, name: str) -> str:
    return f"{DISTRIBUTED_DIR}/{num_instances}-instances/{name}"


def instance_file_names(split: str, instance: int, suffix: str):
    stem = f"{split}-instance-{instance:04d}"
    return f"{split}-remainder-{instance:04d}{suffix}", f"{stem}.txt", f"{stem}.index.tsv"


def _plan_stamp(plan: SplitRepartition, source_sha256: str, fmt: str) -> dict:
    digest = hashlib.sha256()
    for instance in plan.instances:
        digest.update(f"{instance.instance}\0{','.join(instance.shards)}\0".encode())
        for record in instance.copied:
            digest.update(f"{record.key}\0{record.shard}\0{record.record_offset}\0{record.record_size}\n".encode())
    return {
        "split": plan.split,
        "policy": plan.policy,
        "num_instances": plan.num_instances,
        "format": fmt,
        "source_metadata_sha256": source_sha256,
        "plan_sha256": digest.hexdigest(),
    }


def _read_json_or_none(path: Path):
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except ValueError:
        return None  # written atomically, so this only happens if someone edited it: rebuild


def read_manifest(target, num_instances: int) -> Optional[dict]:
    """The complete repartition manifest for N instances, or None if there is none (yet)."""
    manifest = _read_json_or_none(output_dir(target, num_instances) / REPARTITION_MANIFEST)
    return manifest if isinstance(manifest, dict) else None


class _SourceReader:
    """Reads sample byte ranges from the original shards, keeping each shard open while it is used."""

    def __init__(self, target: Path, shard_format):
        self.target = target
        self.shard_format = shard_format
        self._name = None
        self._fd = None

    def read(self, record: SampleRecord) -> bytes:
        try:
            if not self.shard_format.records_are_byte_ranges:  # e.g. LMDB: a value looked up by key
                raw = self.shard_format.read_record(self.target / record.shard, record)
            else:
                if record.shard != self._name:
                    self.close()
                    self._fd = os.open(self.target / record.shard, os.O_RDONLY)
                    self._name = record.shard
                raw = os.pread(self._fd, record.record_size, record.record_offset)
        except OSError as error:
            raise DatasetError(f"{self.target / record.shard}: cannot read: {error.strerror or error}") from None
        except ShardDataError as error:
            raise DatasetError(f"{self.target / record.shard}: {error}") from None
        if len(raw) != record.record_size:
            raise DatasetError(
                f"{self.target / record.shard}: truncated: sample {record.key!r} needs bytes "
                f"{record.record_offset}+{record.record_size}"
            )
        start = record.payload_offset - record.record_offset
        problem = payload_problem(record, memoryview(raw)[start : start + record.payload_size])
        if problem:
            raise DatasetError(f"{self.target / record.shard}: sample {record.key!r}: {problem}")
        return raw

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
        self._fd = self._name = None


def shards_to_verify(dataset: SourceDataset, plans, verify: str):
    """(split, ShardRecord) pairs whose sha256 must be checked before writing."""
    if verify not in ("copied", "all"):
        raise RepartitionUsageError(f"verify must be 'copied' or 'all', got {verify!r}")
    out = []
    for plan in plans:
        shards, _ = dataset.splits[plan.split]
        if verify == "all":
            wanted = {shard.name for shard in shards}
        else:
            wanted = {record.shard for instance in plan.instances for record in instance.copied}
            if remainder_format(dataset.format).reference_loader_reads and plan.num_instances > 1:
                _, by_shard = dataset.splits[plan.split]
                wanted |= {record.shard for share in reference_remainders(shards, by_shard, plan.num_instances)
                           for record in share}
        out += [(plan.split, shard) for shard in shards if shard.name in wanted]
    return out


def verify_shards(dataset: SourceDataset, pairs, progress=None):
    for split, shard in pairs:
        path = dataset.target / shard.name
        try:
            digest, size = sha256_file(path)
        except OSError as error:
            raise DatasetError(f"{path}: cannot read the shard: {error.strerror or error}") from None
        if digest != shard.sha256 or size != shard.bytes:
            damage = remainder_format(dataset.format).describe_damage(path)
            raise DatasetError(
                f"{path}: sha256 {digest[:16]}... does not match metadata.json ({shard.sha256[:16]}...): the shard "
                f"changed since conversion{f' ({damage})' if damage else ''}; re-convert it "
                f"(create_webdataset.py --resume) or check it with validate_dataset.py"
            )
        if progress:
            progress("verified", split=split, name=shard.name, bytes=size)


def _remove_split_files(out: Path, split: str):
    for path in out.iterdir():
        name = path.name
        if (name.startswith((f"{split}-remainder-", f"{split}-instance-", f"{split}-reference."))
                or name.startswith(f"{split}.plan.json") or re.fullmatch(rf"{re.escape(split)}-\d{{6}}\.tar", name)):
            path.unlink(missing_ok=True)


@contextmanager
def _writing(path):
    """Turn a failed write (a full disk, a read-only mount) into a DatasetError naming the file."""
    try:
        yield
    except OSError as error:
        raise DatasetError(
            f"{path}: cannot write: {error.strerror or error}; no manifest was written, so no loader uses this "
            f"repartition; re-run once fixed (finished remainder shards are kept)"
        ) from None


def _write_split(dataset: SourceDataset, plan: SplitRepartition, out: Path, progress=None) -> dict:
    """Write one split's remainder shards, shard lists and indexes; return its manifest entry."""
    fmt = remainder_format(dataset.format)
    n = plan.num_instances
    stamp = _plan_stamp(plan, dataset.metadata_sha256, dataset.format)
    stamp_path = out / f"{plan.split}.plan.json"
    if _read_json_or_none(stamp_path) != stamp:
        _remove_split_files(out, plan.split)  # anything here was made for another plan
        with _writing(stamp_path):
            atomic_write_json(stamp_path, stamp)
    for path in out.glob(f"{plan.split}-*{PARTIAL_SUFFIX}"):
        path.unlink(missing_ok=True)  # left by a killed run

    shards, records_by_shard = dataset.splits[plan.split]
    reader = _SourceReader(dataset.target, fmt)
    entries = []
    try:
        for instance in plan.instances:
            remainder_name, list_name, index_name = instance_file_names(plan.split, instance.instance, fmt.remainder_suffix)
            remainder_record, copied_records = None, []
            if instance.copied:
                remainder_record, copied_records = _write_remainder(out, plan, instance, remainder_name, fmt, reader,
                                                                    progress)
            read_order = itertools.chain((r for name in instance.shards for r in records_by_shard[name]),
                                         copied_records)  # streamed into the index, one shard at a time
            with _writing(out / index_name):
                write_sample_index(out / index_name, read_order)
            shard_list = list(instance.shards) + ([remainder_record.name] if remainder_record else [])
            with _writing(out / list_name):
                atomic_write_bytes(out / list_name, "".join(f"{name}\n" for name in shard_list).encode())
            entries.append(
                {
                    "instance": instance.instance,
                    "shards": list(instance.shards),
                    "remainder": remainder_record.name if remainder_record else None,
                    "remainder_record": remainder_record.to_json() if remainder_record else None,
                    "samples": instance.samples,
                    "bytes": instance.whole_bytes + (remainder_record.bytes if remainder_record else 0),
                    "copied_samples": len(instance.copied),
                    "copied_bytes": instance.copied_bytes,
                    "padded_keys": list(instance.padded_keys),
                    "dropped_keys": list(instance.dropped_keys),
                    "index": _relative(n, index_name),
                    "shard_list": _relative(n, list_name),
                }
            )
        loader_remainders = None
        if fmt.reference_loader_reads and n > 1:
            loader_remainders = write_loader_remainders(plan.split, n, shards, records_by_shard, out, fmt, reader,
                                                        progress, remainder_records, _writing)
    finally:
        reader.close()
    entry = {
        "policy": plan.policy,
        "total_samples": plan.total_samples,
        "samples_per_instance": plan.samples_per_instance,
        "copied_samples": plan.copied_samples,
        "copied_bytes": plan.copied_bytes,
        "padded_keys": list(plan.padded_keys),
        "dropped_keys": list(plan.dropped_keys),
        "instances": entries,
    }
    if loader_remainders is not None:
        entry[LOADER_REMAINDERS] = loader_remainders
    return entry


def _write_remainder(out: Path, plan: SplitRepartition, instance: InstanceShare, remainder_name: str, fmt, reader,
                     progress):
    """Copy an instance's planned samples into its remainder shard (kept when an earlier run of this plan
    finished it); return (its ShardRecord, the copied samples' index records)."""
    n = plan.num_instances
    remainder_path = out / remainder_name
    expected_size = fmt.finished_size(instance.copied_bytes)
    copied_records = remainder_records(instance.copied, _relative(n, remainder_name))
    if remainder_path.is_file() and remainder_path.stat().st_size == expected_size:
        # Finished by an earlier run of this same plan (it has its final name, so it is whole).
        (digest, md5), size = hash_file(remainder_path, ("sha256", "md5"))
        if progress:
            progress("kept", split=plan.split, name=remainder_name, bytes=size)
    else:
        with _writing(remainder_path), fmt.open_writer(remainder_path) as writer:
            for record, placed in zip(instance.copied, copied_records):
                offset = writer.add_raw_record(reader.read(record))
                if offset != placed.record_offset:
                    raise AssertionError("remainder offsets disagree with the plan")
                if progress:
                    progress("copied", split=plan.split, key=record.key, bytes=record.record_size)
        digest, md5, size = writer.sha256, writer.md5, writer.bytes_written
        if progress:
            progress("written", split=plan.split, name=remainder_name, bytes=size)
    return ShardRecord(_relative(n, remainder_name), len(instance.copied), size, digest, md5), copied_records


@dataclass
class RepartitionResult:
    output: Path
    plans: list  # SplitPlans built (or, in a dry run, that would be built)
    kept_splits: list  # splits already up to date
    dry_run: bool
    no_op: bool
    stale_replaced: bool
    verified_shards: int
    verified_bytes: int
    elapsed: float
    manifest: Optional[dict] = None
    format: str = "img"
    conflicts: list = field(default_factory=list)  # (split, existing policy, requested policy)


def repartition(
    target,
    num_instances: int,
    splits=None,
    policies=None,
    dry_run: bool = False,
    overwrite: bool = False,
    verify: str = "copied",
    progress=None,
) -> RepartitionResult:
    """Plan and (unless dry_run) write the repartition of `target` for `num_instances` instances.

    Raises RepartitionUsageError for wrong arguments and DatasetError for bad data; in both cases
    before anything is written. `progress(event, **info)` is called as work is done (events:
    "verified", "copied", "written", "kept", "written_reference"), e.g. to drive a progress bar.
    """
    started = time.perf_counter()
    dataset = load_dataset(target)
    request = resolve_request(dataset, num_instances, splits, policies)
    out = output_dir(dataset.target, num_instances)
    existing = read_manifest(dataset.target, num_instances)
    decision = decide(existing, request, dataset.metadata_sha256, dataset.format)
    if decision.conflicts and not overwrite and not dry_run:
        details = "; ".join(f"{s}: made with {old!r}, asked for {new!r}" for s, old, new in decision.conflicts)
        raise RepartitionUsageError(
            f"{out / REPARTITION_MANIFEST} already repartitions these splits with other policies ({details}); "
            f"pass --overwrite to replace them"
        )
    kept = [split for split in request.policies if split in decision.keep]
    if not decision.build:
        result = RepartitionResult(
            out, [], kept, dry_run, True, False, 0, 0, time.perf_counter() - started, existing, dataset.format
        )
        if not dry_run:
            for path in out.glob("*.plan.json"):
                path.unlink(missing_ok=True)  # left if a run was killed right after its manifest
        return result

    plans = []
    for split in decision.build:
        shards, by_shard = load_split(dataset, split)
        plans.append(plan_split(split, shards, by_shard, num_instances, request.policies[split]))
    if dry_run:
        return RepartitionResult(
            out, plans, kept, True, False, decision.stale, 0, 0, time.perf_counter() - started, None,
            dataset.format, decision.conflicts,
        )

    to_verify = shards_to_verify(dataset, plans, verify)
    verify_shards(dataset, to_verify, progress)  # before anything is written

    out.mkdir(parents=True, exist_ok=True)
    lock = os.open(out, os.O_RDONLY)  # lock the folder itself: no lock file left behind
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RepartitionUsageError(f"{out}: another repartition for {num_instances} instances is running") from None
        # Decide again under the lock: another run may have finished since the first look.
        existing = read_manifest(dataset.target, num_instances)
        decision = decide(existing, request, dataset.metadata_sha256, dataset.format)
        if not decision.build:
            return RepartitionResult(out, [], kept, False, True, False, len(to_verify),
                                     sum(shard.bytes for _, shard in to_verify), time.perf_counter() - started,
                                     existing, dataset.format)
        manifest_path = out / REPARTITION_MANIFEST
        if decision.stale:
            manifest_path.unlink(missing_ok=True)
            for split in set(existing.get("splits") or {}) - set(decision.build):
                _remove_split_files(out, split)  # made from the old metadata.json and not rebuilt now
        elif existing is not None and decision.drop_manifest_splits:
            # The manifest must never point at files that are about to be rewritten.
            trimmed = dict(existing, splits=dict(decision.keep))
            with _writing(manifest_path):
                atomic_write_json(manifest_path, sealed(trimmed))
        entries = dict(decision.keep)
        for plan in plans:
            entries[plan.split] = _write_split(dataset, plan, out, progress)
        if sha256_file(dataset.target / METADATA_FILE)[0] != dataset.metadata_sha256:
            raise DatasetError(
                f"{dataset.target / METADATA_FILE}: changed while repartitioning; the manifest was not written, re-run"
            )
        ordered = {split: entries[split] for split in dataset.metadata["splits"] if split in entries}
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "created_by": "distributed_webdataset.py",
            "num_instances": num_instances,
            "format": dataset.format,
            "source_metadata_sha256": dataset.metadata_sha256,
            "verified_shards": verify,
            "splits": ordered,
        }
        with _writing(manifest_path):
            atomic_write_json(manifest_path, sealed(manifest))  # its own digest, as metadata.json
        for path in out.glob("*.plan.json"):
            path.unlink(missing_ok=True)
    finally:
        os.close(lock)
    return RepartitionResult(
        out,
        plans,
        kept,
        False,
        False,
        decision.stale,
        len(to_verify),
        sum(shard.bytes for _, shard in to_verify),
        time.perf_counter() - started,
        manifest,
        dataset.format,
    )


# ------------------------------------------------------------------------------------------ reports


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _shard_summary(names, limit=4):
    names = list(names)
    if not names:
        return "(no whole shard)"
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[: limit - 1]) + f", ... {names[-1]} ({len(names)} shards)"


def describe_plan(plan: SplitRepartition, fmt: str = "img") -> str:
    """A table: per instance, the shards read whole, the samples copied, the samples and bytes read."""
    finished = remainder_format(fmt).finished_size
    lines = [
        f"{plan.split}: {plan.total_samples} samples over {plan.num_instances} instances, policy {plan.policy}: "
        f"{min(plan.samples_per_instance)}..{max(plan.samples_per_instance)} samples each, "
        f"{plan.copied_samples} copied ({_size(plan.copied_bytes)}), "
        f"{len(plan.dropped_keys)} dropped, {len(plan.padded_keys)} padded",
        f"  {'instance':>8}  {'samples':>8}  {'whole':>6}  {'copied':>6}  {'padded':>6}  {'bytes':>10}  shards",
    ]
    for instance in plan.instances:
        read_bytes = instance.whole_bytes + (finished(instance.copied_bytes) if instance.copied else 0)
        remainder = " + remainder" if instance.copied else ""
        lines.append(
            f"  {instance.instance:>8}  {instance.samples:>8}  {len(instance.shards):>6}  {len(instance.copied):>6}  "
            f"{len(instance.padded_keys):>6}  {_size(read_bytes):>10}  {_shard_summary(instance.shards)}{remainder}"
        )
    if plan.dropped_keys:
        lines.append(f"  dropped: {_key_summary(plan.dropped_keys)}")
    if plan.padded_keys:
        lines.append(f"  padded (repeated): {_key_summary(plan.padded_keys)}")
    return "\n".join(lines)


def _key_summary(keys, limit=8):
    keys = list(keys)
    return ", ".join(keys[:limit]) + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")
