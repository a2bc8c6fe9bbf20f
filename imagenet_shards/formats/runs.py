"""Reading rows of a shard, for every format: where the bytes come from (`ShardBytes`), how the rows come
(a run, or positions), and the stream reader every format has by default.

A format reads rows of a columnar sample index (imagenet_shards.index.columns) with two readers
(imagenet_shards/formats/base.py):
    read_run(shard, columns, rows, how)        rows that follow each other in one shard: one sequential read
    read_positions(shard, columns, rows, how)  rows of one shard in any order (the global order's positions)
Both yield one `RowRead` tuple per row, in the order given:

    (row, extension, payload, label, info, None)    or    (row, None, None, label, None, reason)

`shard` says where the bytes are: the local file (a format may map it), a URL (a ranged GET,
imagenet_shards/storage.py), or the node's shard cache (an entry on local disk, or a fetch being filled,
read through `opener`; imagenet_shards/shard_cache/). The reader does not know which: the cache is a
source of bytes beneath it, not a path of its own.

By default (`stream_rows`) a run is one byte range streamed through the format's `iter_samples`, each
sample checked against its record (`iter_run`); `positions_as_runs` reads positions as the runs they
happen to form. The tar formats read a local shard straight from its map instead (webdataset.py), LMDB
by cursor (lmdb_format.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, NamedTuple, Optional

import numpy as np

from imagenet_shards.formats.base import ShardDataError
from imagenet_shards.index import is_positional_key
from imagenet_shards.storage import ShardReadError, is_url, open_byte_range

PAYLOAD_PREFERENCE = ("jpg", "jpeg", "png", "webp", "npy", "pth", "ppm", "bmp")  # pth: reference harness tensors
LABEL_EXTENSIONS = ("cls", "class", "label", "target", "cls2")


@dataclass(frozen=True)
class ShardBytes:
    """Where one shard's bytes are read from. `opener(location, start, stop)`, when set, opens a byte range
    instead of the location's own transport (a shard being filled into the node's cache)."""

    location: str
    opener: Optional[Callable] = field(default=None, compare=False)
    # Payloads copied out of the file, never lent from its map: a shard-cache entry can be damaged on its
    # disk (truncated) while a worker holds payloads in its shuffle buffer, and touching a mapped page
    # past a file's new end kills the process (SIGBUS). The copy's damage is found by the checks instead.
    copied: bool = False

    @property
    def local(self) -> bool:
        """A local file read in place (a format may map it)."""
        return self.opener is None and not is_url(self.location)


class RowReading(NamedTuple):
    """What a reader is asked besides the rows."""

    label_offset: int = 0  # stored label - label_offset = class index (see iter_samples)
    payload: Optional[str] = None  # the payload member's extension, where the dataset names one
    verify: bool = True  # the format's own record checksums (TFRecord's CRCs); payload CRC32Cs are the caller's
    with_info: bool = False  # each row's info (its json member) as well: the sample's bounding box


PLAIN = RowReading()


class RowRead(NamedTuple):
    row: int
    ext: Optional[str]
    payload: object  # bytes or a memoryview of a shard's map; None with a reason
    label: int
    info: object  # the sample's json member (with_info), else None
    reason: Optional[str]


def run_bounds(columns, rows) -> list:
    """[(first, stop), ...]: the slices of `rows` that are runs: consecutive rows of one shard whose byte
    ranges touch, so that each is one sequential read."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return []
    shard, offset = columns.shard_ids[rows], columns.record_offsets[rows]
    end = offset + columns.record_sizes[rows]
    breaks = np.flatnonzero((shard[1:] != shard[:-1]) | (offset[1:] != end[:-1])) + 1
    bounds = np.r_[0, breaks, len(rows)].tolist()
    return list(zip(bounds[:-1], bounds[1:]))


def stream_rows(fmt, shard: ShardBytes, columns, rows, how: RowReading = PLAIN) -> Iterator[RowRead]:
    """The default run reader: the run's byte range streamed through `fmt.iter_samples`, each sample
    checked against the index's record of it (`iter_run`)."""
    records = tuple(columns.records(rows))
    if not records:
        return
    run = Run(shard.location, records[0].record_offset, records[-1].record_offset + records[-1].record_size,
              records, shard.opener, shard.copied)
    for row, (record, sample, error) in zip(np.asarray(rows).tolist(), iter_run(run, how.label_offset, fmt,
                                                                                  how.verify)):
        if error is not None:
            yield RowRead(row, None, None, record.label, None, error)
            continue
        ext = how.payload if how.payload in sample else payload_extension(sample)
        if ext is None:
            members = ", ".join(k for k in sample if not k.startswith("__"))
            yield RowRead(row, None, None, record.label, None, f"no image payload (members: {members})")
            continue
        try:
            label = sample_label(sample, record.label)
        except ValueError:
            yield RowRead(row, None, None, record.label, None, "the class label is not an integer")
            continue
        yield RowRead(row, ext, sample[ext], label, sample.get("json") if how.with_info else None, None)


def positions_as_runs(fmt, shard: ShardBytes, columns, rows, how: RowReading = PLAIN) -> Iterator[RowRead]:
    """The default positions reader: the rows as the runs they form (mostly one row each), each read by
    `fmt.read_run`."""
    rows = np.asarray(rows, dtype=np.int64)
    for first, stop in run_bounds(columns, rows):
        yield from fmt.read_run(shard, columns, rows[first:stop], how)


# ------------------------------------------------------------------ runs of records (the stream underneath)

@dataclass(frozen=True)
class Run:
    """Consecutive records of one shard that touch: read with one sequential pass. `opener` and `copied`:
    see ShardBytes."""

    location: str
    start: int
    stop: int
    records: tuple
    opener: Optional[Callable] = field(default=None, compare=False)
    copied: bool = field(default=False, compare=False)


def reads_locally(run: Run) -> bool:
    """Whether `run` is a local file read in place (a format's fast path may mmap it)."""
    return run.opener is None and not is_url(run.location)


def iter_samples(location: str, start: int, stop: Optional[int], stream=None, label_offset: int = 0, shard_format=None,
                 verify_crc: bool = True):
    """Sample dicts of a byte range, read by `shard_format` (by default the format that claims the
    location's name, else tar; see imagenet_shards.formats.format_for_location). verify_crc=False skips the
    format's own record checksums (TFRecord's CRCs)."""
    if shard_format is None:
        from imagenet_shards.formats import format_for_location  # the registry imports this module's users

        shard_format = format_for_location(location)
    return shard_format.iter_samples(location, start, stop, stream, label_offset, verify_crc=verify_crc)


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
