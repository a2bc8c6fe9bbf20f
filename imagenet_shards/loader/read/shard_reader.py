"""Read planned samples from tar shards, local or remote (http(s), s3; see imagenet_shards/storage.py), as
sequential byte ranges.

A worker's share is a list of SampleRecords. Consecutive records of one shard whose byte ranges
touch form a `Run`; each run is read with one sequential pass:
  * local files: `iter_tar_samples(path, offset=start, stop_at=stop)` over mmap (zero copy);
  * http(s) and s3: one GET with `Range: bytes=start-(stop-1)` (imagenet_shards/storage.py). A server that answers 206 sends just
    the range; one that ignores Range (200, e.g. `python -m http.server`) sends the whole
    shard, and the bytes before `start` are read and discarded (correct, slower: the log says so
    once per process).
Every sample read is checked against its record (key, and position in the shard), so a shard
that no longer matches its index is an error naming the shard and the key, never silent misuse.

Shards without a sample index (foreign webdataset shards) are indexed by `scan_shard`, which walks
the tar headers once (the payloads of a local shard are not even paged in).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Optional

from imagenet_shards.formats import ShardDataError, format_for_location
from imagenet_shards.formats.tar import BLOCK, iter_tar_members, split_key
from imagenet_shards.index import SampleRecord, is_positional_key
from imagenet_shards.storage import (  # noqa: F401  (the location helpers moved to imagenet_shards/storage.py; re-exported)
    ShardReadError,
    exists,
    expand_locations,
    is_url,
    join_location,
    open_byte_range,
    read_bytes,
)

log = logging.getLogger(__name__)
PAYLOAD_PREFERENCE = ("jpg", "jpeg", "png", "webp", "npy", "pth", "ppm", "bmp")  # pth: reference harness tensors
LABEL_EXTENSIONS = ("cls", "class", "label", "target", "cls2")


@dataclass(frozen=True)
class Run:
    """Consecutive records of one shard that touch: read with one sequential pass. `opener(location,
    start, stop)`, when set, opens the byte range instead of the location's transport (a shard being
    filled into the node's cache, imagenet_shards/shard_cache/)."""

    location: str
    start: int
    stop: int
    records: tuple
    opener: Optional[Callable] = field(default=None, compare=False)
    # Payloads copied out of the file, never lent from its map: a shard-cache entry can be damaged on its
    # disk (truncated) while a worker holds payloads in its shuffle buffer, and touching a mapped page
    # past a file's new end kills the process (SIGBUS). The copy's damage is found by the checks instead.
    copied: bool = field(default=False, compare=False)


def reads_locally(run: Run) -> bool:
    """Whether `run` is a local file read in place (a format's fast path may mmap it)."""
    return run.opener is None and not is_url(run.location)


def iter_samples(location: str, start: int, stop: Optional[int], stream=None, label_offset: int = 0, shard_format=None,
                 verify_crc: bool = True):
    """Sample dicts of a byte range, read by `shard_format` (by default the format that claims the
    location's name, else tar; see imagenet_shards.formats.format_for_location). verify_crc=False skips the
    format's own record checksums (TFRecord's CRCs)."""
    fmt = shard_format or format_for_location(location)
    return fmt.iter_samples(location, start, stop, stream, label_offset, verify_crc=verify_crc)


def iter_run(run: Run, label_offset: int = 0, shard_format=None, verify: bool = True) -> Iterator[tuple]:
    """Yield (record, sample dict, None) per record of `run`, or (record, None, reason) for each
    record that could not be read (a truncated or corrupt shard ends the run: every remaining
    record is reported, except after damage inside one record whose framing is intact, e.g. a TFRecord
    data CRC: only that sample is bad and the run goes on at the next record).
    `label_offset`: see `iter_samples`; verify=False skips the format's own record checksums."""
    while run is not None:
        run = yield from _iter_run_part(run, label_offset, shard_format, verify)


def _record_local(error, record) -> bool:
    """Whether `error` is damage inside `record`'s data alone (its framing intact)."""
    return getattr(error, "record_offset", None) == record.record_offset


def _iter_run_part(run: Run, label_offset: int, shard_format, verify: bool):
    """`iter_run` up to the first record-local damage; returns the run after that record, or None."""
    position = 0
    stream = None
    try:
        if run.opener is not None:
            stream = run.opener(run.location, run.start, run.stop)
        elif is_url(run.location):
            stream = open_byte_range(run.location, run.start, run.stop)
        samples = iter_samples(run.location, run.start, run.stop, stream, label_offset, shard_format, verify)
        for sample in samples:
            if position >= len(run.records):
                break
            record = run.records[position]
            inside = record.record_offset <= sample["__offset__"] < record.record_offset + record.record_size
            # A TFRecord record indexed by its place only (TF-slim data without metadata) is identified by it.
            same = sample["__key__"] == record.key or (is_positional_key(record) and sample["__offset__"] == record.record_offset)
            if not same or not inside:
                raise ShardReadError(
                    f"at byte {sample['__offset__']} the shard holds sample {ascii(sample['__key__'])}, "
                    f"its index says {ascii(record.key)} at byte {record.record_offset}: the shard does not "
                    f"match its index"
                )
            position += 1
            yield record, sample, None
        if position < len(run.records):
            raise ShardReadError(f"the shard ends before sample {run.records[position].key!r}")
    except (ShardDataError, ShardReadError, OSError) as error:
        reason = f"{type(error).__name__}: {error}"
        if position < len(run.records) - 1 and _record_local(error, run.records[position]):
            yield run.records[position], None, reason
            rest = run.records[position + 1:]
            return replace(run, start=rest[0].record_offset, records=rest)
        for record in run.records[position:]:
            yield record, None, reason
    finally:
        if stream is not None:
            stream.close()
    return None


def read_member(location: str, record: SampleRecord, ext: str) -> Optional[bytes]:
    """The data of a sample's `<key>.<ext>` member in a local tar shard, or None if the sample has
    no such member. Walks the member headers inside the sample's byte range: a few small reads."""
    end = record.record_offset + record.record_size
    with open(location, "rb") as handle:
        offset, long_name = record.record_offset, None
        while offset + BLOCK <= end:
            header = os.pread(handle.fileno(), BLOCK, offset)
            try:
                size = int(header[124:136].strip(b"\0 ") or b"0", 8)
            except ValueError:  # not a tar header (another container): no member to find
                return None
            data_offset = offset + BLOCK
            if data_offset + size > end:  # a claimed size past the sample's range: never allocated nor read
                return None
            offset = data_offset + size + (-size % BLOCK)
            if header[156:157] == b"L":  # GNU long name of the next member
                long_name = os.pread(handle.fileno(), size, data_offset).rstrip(b"\0").decode("utf-8", "replace")
                continue
            name = long_name or header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            long_name = None
            if split_key(name)[1] == ext:
                return os.pread(handle.fileno(), size, data_offset)
    return None


def payload_extension(sample: dict) -> Optional[str]:
    for ext in PAYLOAD_PREFERENCE:
        if ext in sample:
            return ext
    return None


def sample_label(sample: dict, default: int = -1) -> int:
    for ext in LABEL_EXTENSIONS:
        if ext in sample:
            return int(bytes(sample[ext]).strip() or default)
    return default


def scan_shard(location: str, name: Optional[str] = None) -> list:
    """Index a shard that has no sample index: one SampleRecord per sample, from its headers.

    `name` is the shard name stored in the records (default: the location). A sample's byte
    range starts where the previous sample ended, so GNU long-name and pax headers that belong
    to it are inside its range. Payload hashes are not computed (left empty).
    """
    name = location if name is None else name
    stream = open_byte_range(location, 0, None) if is_url(location) else None
    records = []
    try:
        current = None  # [key, start, end, members, label, payload offset, payload size]
        sample_end = 0
        for member in iter_tar_members(location, stream=stream):
            key, ext = split_key(member.name)
            end = member.data_offset + len(member.data) + (-len(member.data) % BLOCK)
            if current is None or key != current[0]:
                if current is not None:
                    records.append(_scanned(name, current))
                    sample_end = current[2]
                current = [key, sample_end, end, [], -1, 0, 0, None]
            current[2] = end
            current[3].append(f"{ext}:{member.header_offset}")
            if ext in LABEL_EXTENSIONS and current[4] == -1:
                try:
                    current[4] = int(bytes(member.data).strip())
                except ValueError:
                    pass
            if ext in PAYLOAD_PREFERENCE and (current[7] is None
                                              or PAYLOAD_PREFERENCE.index(ext) < PAYLOAD_PREFERENCE.index(current[7])):
                current[5], current[6], current[7] = member.data_offset, len(member.data), ext
        if current is not None:
            records.append(_scanned(name, current))
    finally:
        if stream is not None:
            stream.close()
    return records


def _scanned(name, fields) -> SampleRecord:
    key, start, end, members, label, payload_offset, payload_size, _ = fields
    return SampleRecord(key, name, label, start, end - start, payload_offset, payload_size, None, ";".join(members))
