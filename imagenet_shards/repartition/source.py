"""The input of a repartition: the converted dataset, checked before anything is written, and a reader
of its samples' bytes.

Checks, all before a file is written, each failure a DatasetError naming the file (exit code 1),
or a RepartitionUsageError for a target that is not a dataset (exit code 2):
  * metadata.json parses and its own digest holds (`load_dataset`);
  * the split's sample index: its sha256 against metadata, then against the shard list (counts,
    keys, byte ranges: `group_records_by_shard`), and every shard's size, a stat (`load_split`);
  * the sha256 of every shard that samples are copied from (`verify="copied"`, the default: about
    one shard per instance is read twice, once to hash, once to copy), or of every shard of the
    selected splits (`verify="all"`: on ImageNet (~150 GB) that is ~80 s of sha256 per core at
    ~1.8 GB/s, and usually longer because the disk or NFS is slower than that); `shards_to_verify`,
    `verify_shards`. Whole shards that are not copied from are left to validate_dataset.py, which
    checks every shard.
The original shards, indexes and metadata.json are only read. `SourceReader` reads one sample's
whole record (SampleRecord.record_offset/record_size) and checks its payload against the index.
The format that writes the remainder shards is the dataset's own, from the registry
(imagenet_shards.formats): `remainder_format`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from imagenet_shards.metadata_digest import EDITED, MALFORMED, digest_status
from imagenet_shards.fileio import OpenShard, sha256_bytes, sha256_file
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import SampleRecord, ShardRecord, parse_metadata, payload_problem
from imagenet_shards.formats import ShardDataError, UnknownFormatError, get_format
from imagenet_shards.reference.remainders import reference_remainders
from imagenet_shards.repartition.plan import RepartitionUsageError
from imagenet_shards.index import SampleColumns, ShardGroups, columns_from_records, read_sample_columns


def remainder_format(fmt: str):
    """The dataset format (imagenet_shards.formats) that writes this dataset's remainder shards."""
    try:
        return get_format(fmt)
    except UnknownFormatError as error:
        raise DatasetError(f"format {fmt!r} cannot be repartitioned: {error}") from None


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
    records = read_sample_columns(index_path)  # read as a stream; records built per shard
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


class SourceReader:
    """Reads sample byte ranges from the original shards, keeping each shard open while it is used."""

    def __init__(self, target: Path, shard_format):
        self.target = target
        self.shard_format = shard_format
        self.local = OpenShard()

    def read(self, record: SampleRecord) -> bytes:
        try:
            if not self.shard_format.records_are_byte_ranges:  # e.g. LMDB: a value looked up by key
                raw = self.shard_format.read_record(self.target / record.shard, record)
            else:
                raw = self.local.pread(self.target / record.shard, record.record_size, record.record_offset)
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
        self.local.close()


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
