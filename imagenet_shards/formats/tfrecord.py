"""The TFRecord container: how records are framed, named, indexed, walked and checked.

A TFRecord file is a sequence of records, each framed as

    uint64 length | uint32 masked CRC32C of the length | data | uint32 masked CRC32C of the data

(little endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2**32). What the data of
our records are: imagenet_shards.formats.tf_example (the `tf.train.Example` wire format) and
imagenet_shards.formats.tfslim_imagenet (TF-slim's ImageNet features and labels). Shards are named as
TF-slim names them, `<split>-00000-of-01024`.

Writing: `TFRecordShardWriter` is, like `tar.TarShardWriter`, a `fileio.HashingAtomicWriter`:
it hashes while it writes and publishes the shard atomically, together with an index file
(`<shard>.tfindex`, one "<offset> <length>" line per record, exactly what the `tfrecord`
package's `tfrecord2idx` writes).

Reading: `iter_tfrecord_records` walks the framing itself and checks both CRCs of every
record (the `tfrecord` package never checks them), zero-copy through mmap for local files,
from any readable stream otherwise. `check_tfrecord_framing` goes on past damaged records (for
the validator); `header_entries` reads the record headers alone.
"""

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import crc32c

from imagenet_shards.formats.base import ShardDataError
from imagenet_shards.fileio import HashingAtomicWriter, atomic_write_bytes

LENGTH_SIZE = 8
CRC_SIZE = 4
HEADER_SIZE = LENGTH_SIZE + CRC_SIZE  # length + its CRC
FRAMING_SIZE = HEADER_SIZE + CRC_SIZE  # + the data's CRC
CRC_MASK_DELTA = 0xA282EAD8
INDEX_SUFFIX = ".tfindex"  # the name the tfrecord package's tfrecord2idx gives index files

_SHARD_NAME = re.compile(r"^(?P<split>.+)-(?P<number>\d{5,})-of-(?P<count>\d{5,})$")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


class TFRecordFormatError(ShardDataError):
    """A record that cannot be trusted: names the shard, the record number, the byte offset and the problem."""

    def __init__(self, source, record, offset, problem):
        where = f"record {record} (at byte {offset})" if record is not None else f"the record at byte {offset}"
        super().__init__(f"{source}: {where}: {problem}")
        self.source = str(source)
        self.record = record
        self.offset = offset
        self.problem = problem
        if problem.startswith(RECORD_LOCAL_PROBLEMS):
            self.record_offset = offset


# Damage inside one record's data: its length (and so where the next record starts) is intact.
RECORD_LOCAL_PROBLEMS = ("data CRC mismatch", "not a tf.train.Example")


def masked_crc32c(data) -> int:
    """TFRecord's masked CRC32C of `data` (bytes or a buffer)."""
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------
# Names


def tfrecord_shard_name(split: str, number: int, count: int) -> str:
    """TF-slim's shard names: train-00000-of-01024 (the count is known when the plan is made)."""
    if not 0 <= number < count:
        raise ValueError(f"shard number {number} is outside 0..{count - 1}")
    return f"{split}-{number:05d}-of-{count:05d}"


def parse_tfrecord_shard_name(name: str):
    """(split, number, count) of a TF-slim shard name, or None for any other name."""
    match = _SHARD_NAME.match(name)
    if not match:
        return None
    return match["split"], int(match["number"]), int(match["count"])


def tfrecord_index_path(shard_path) -> Path:
    shard_path = Path(shard_path)
    return shard_path.with_name(shard_path.name + INDEX_SUFFIX)


def find_tfrecord_shards(directory, split: str):
    """The complete, ordered list of `split`'s TF-slim shards in `directory`.

    Raises TFRecordFormatError naming what is wrong when shards disagree on their count or
    some are missing: a partial set would silently lose data.
    """
    directory = Path(directory)
    found = {}
    counts = set()
    for path in directory.iterdir():
        parsed = parse_tfrecord_shard_name(path.name)
        if parsed and parsed[0] == split and path.is_file():
            found[parsed[1]] = path
            counts.add(parsed[2])
    if not found:
        return []
    if len(counts) != 1:
        raise TFRecordFormatError(directory, None, 0, f"{split} shards disagree on the shard count: {sorted(counts)}")
    (count,) = counts
    missing = [tfrecord_shard_name(split, n, count) for n in range(count) if n not in found]
    if missing or len(found) != count:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise TFRecordFormatError(directory, None, 0, f"{len(missing)} of {count} {split} shards are missing: {shown}")
    return [found[n] for n in range(count)]


TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords")


def is_tfrecord_location(location) -> bool:
    """TFRecord shards are known by name: TF-slim's train-00000-of-01024, or a .tfrecord suffix."""
    name = str(location).rstrip("/").rsplit("/", 1)[-1]
    return parse_tfrecord_shard_name(name) is not None or name.endswith(TFRECORD_SUFFIXES)


# ---------------------------------------------------------------------------------------
# Framing


def frame_record(data) -> bytes:
    """One record as it is stored: length, its CRC, the data, the data's CRC."""
    length = _U64.pack(len(data))
    return b"".join((length, _U32.pack(masked_crc32c(length)), data, _U32.pack(masked_crc32c(data))))


def check_framed_record(record, source="<record>", number=None, offset=0) -> memoryview:
    """Check that `record` is exactly one framed record with valid CRCs; return its data."""
    view = memoryview(record)
    if len(view) < FRAMING_SIZE:
        raise TFRecordFormatError(source, number, offset, f"truncated: {len(view)} bytes, a record needs at least {FRAMING_SIZE}")
    length = _check_header(view[:HEADER_SIZE], source, number, offset, True)
    if len(view) != length + FRAMING_SIZE:
        raise TFRecordFormatError(source, number, offset, f"record of {length} data bytes framed in {len(view)} bytes (expected {length + FRAMING_SIZE})")
    data = view[HEADER_SIZE : HEADER_SIZE + length]
    _check_data(data, view[HEADER_SIZE + length :], source, number, offset, True)
    return data


def _check_header(header, source, number, offset, verify_crc) -> int:
    length_bytes = header[:LENGTH_SIZE]
    if verify_crc:
        stored = _U32.unpack(header[LENGTH_SIZE:])[0]
        computed = masked_crc32c(length_bytes)
        if stored != computed:
            raise TFRecordFormatError(
                source, number, offset, f"length CRC mismatch (stored {stored:#010x}, computed {computed:#010x}): the length field is corrupt"
            )
    return _U64.unpack(length_bytes)[0]


def _check_data(data, crc_field, source, number, offset, verify_crc):
    if verify_crc:
        stored = _U32.unpack(crc_field)[0]
        computed = masked_crc32c(data)
        if stored != computed:
            raise TFRecordFormatError(
                source, number, offset, f"data CRC mismatch (stored {stored:#010x}, computed {computed:#010x}): the record's bytes are corrupt"
            )


class TFRecordView(NamedTuple):
    offset: int  # shard offset of the record's first byte (its length field)
    data: memoryview  # the serialized Example: a view, no copy, for local files


def _reader_from_mmap(path):
    import mmap

    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise TFRecordFormatError(path, None, 0, "empty file (zero bytes)")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)

    def read(n, position, number, record_offset, what):
        if position + n > size:
            remain = max(size - position, 0)
            raise TFRecordFormatError(path, number, record_offset, f"truncated: {what} needs {n} bytes from byte {position}, only {remain} remain")
        return view[position : position + n]

    return read, size


def _reader_from_stream(stream, source, end=None):
    from imagenet_shards.formats.tar import read_exactly

    def read(n, position, number, record_offset, what):
        if end is not None and position + n > end:  # a claimed length past the range: never allocated
            remain = max(end - position, 0)
            raise TFRecordFormatError(source, number, record_offset,
                                      f"truncated: {what} needs {n} bytes from byte {position}, only {remain} remain")
        data = read_exactly(stream, n)
        if len(data) != n:
            raise TFRecordFormatError(source, number, record_offset, f"truncated: {what} needs {n} bytes from byte {position}, only {len(data)} remain")
        return memoryview(data)

    return read


def iter_tfrecord_records(source, offset=0, stop_at=None, verify_crc=True, stream=None, first_record=None):
    """Yield the records of a TFRecord shard as `TFRecordView(offset, data)`.

    `source` is a local path (mapped: the data are views, no copy) or, with `stream`
    given, the name used in messages for that readable stream, which starts at shard
    offset `offset` (an HTTP response, a byte range). `stop_at` ends the walk at that
    shard offset; `first_record` is the number of the record at `offset`, so messages
    name records by their number in the shard (None: 0 when `offset` is 0, else unknown, and
    messages name the record by its byte offset alone). Every record's length CRC and data CRC
    are checked unless `verify_crc` is False; a bad CRC or a truncated record raises
    TFRecordFormatError naming the shard, the record number and its byte offset.
    """
    number = first_record if first_record is not None or offset else 0
    for offset, number, length, body in _iter_frames(source, offset, stop_at, stream, number, verify_crc):
        data = body[:length]
        _check_data(data, body[length:], source, number, offset, verify_crc)
        yield TFRecordView(offset, data)


def _iter_frames(source, offset, stop_at, stream, number, verify_crc):
    """Yield (offset, number, data length, data + its CRC field) of each record from `offset`,
    its length CRC checked (unless `verify_crc` is False), its data CRC left to the caller.

    The one walk over the framing (see `iter_tfrecord_records` for the arguments); `number`
    None: the records' numbers are unknown.
    """
    if stream is None:
        read, size = _reader_from_mmap(source)
        end = size if stop_at is None else min(stop_at, size)
    else:
        read, end = _reader_from_stream(stream, source, stop_at), stop_at
    while end is None or offset < end:
        if end is None:  # a stream of unknown length may end only between records
            first = stream.read(HEADER_SIZE)
            if not first:
                return
            if len(first) != HEADER_SIZE:
                raise TFRecordFormatError(source, number, offset, f"truncated: the record header needs {HEADER_SIZE} bytes, only {len(first)} remain")
            header = memoryview(first)
        else:
            header = read(HEADER_SIZE, offset, number, offset, "the record header")
        length = _check_header(header, source, number, offset, verify_crc)
        body = read(length + CRC_SIZE, offset + HEADER_SIZE, number, offset, f"a record of {length} bytes (+{CRC_SIZE} CRC)")
        yield offset, number, length, body
        offset += FRAMING_SIZE + length
        number = None if number is None else number + 1


def index_entries(source, verify_crc=True):
    """[(offset, size)] of every record of a local shard, checking both CRCs of each."""
    entries = []
    for record in iter_tfrecord_records(source, verify_crc=verify_crc):
        entries.append((record.offset, FRAMING_SIZE + len(record.data)))
    return entries


def header_entries(source):
    """[(offset, size)] of every record of a local shard from its length fields alone.

    Only the 12-byte headers are read (and their length CRCs checked): on a large shard this
    touches a page per record instead of reading the images, so a loader can plan over
    TF-slim data that has no index files without reading the data set once first.
    """
    entries = []
    with open(source, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise TFRecordFormatError(source, None, 0, "empty file (zero bytes)")
        offset = 0
        while offset < size:
            number = len(entries)
            handle.seek(offset)
            header = handle.read(HEADER_SIZE)
            if len(header) != HEADER_SIZE:
                raise TFRecordFormatError(source, number, offset, f"truncated: the record header needs {HEADER_SIZE} bytes, only {len(header)} remain")
            length = _check_header(header, source, number, offset, True)
            if offset + FRAMING_SIZE + length > size:
                raise TFRecordFormatError(
                    source, number, offset, f"truncated: a record of {length} bytes needs {FRAMING_SIZE + length} bytes, only {size - offset} remain"
                )
            entries.append((offset, FRAMING_SIZE + length))
            offset += FRAMING_SIZE + length
    return entries


@dataclass
class ShardCheck:
    """What `check_tfrecord_framing` found: every record it could delimit, and every problem."""

    entries: list  # (offset, size) of each record delimited (including ones whose data CRC failed)
    problems: list  # TFRecordFormatError, one per bad record (and one for a truncated or unframed end)

    @property
    def ok(self):
        return not self.problems


def check_tfrecord_framing(source, stream=None) -> ShardCheck:
    """Check every record's length CRC and data CRC, going on past bad records where it can.

    A record whose data CRC fails still has a trustworthy length (its length CRC passed), so
    the walk goes on and names every corrupt record, not just the first. A bad length CRC or
    a truncation ends the walk: after it, record boundaries are unknown. For a validator.
    """
    entries, problems = [], []
    try:
        for offset, number, length, body in _iter_frames(source, 0, None, stream, 0, True):
            entries.append((offset, FRAMING_SIZE + length))
            try:
                _check_data(body[:length], body[length:], source, number, offset, True)
            except TFRecordFormatError as problem:
                problems.append(problem)
    except TFRecordFormatError as problem:
        problems.append(problem)
    return ShardCheck(entries, problems)


def encode_tfrecord_index(entries) -> bytes:
    """The `tfrecord` package's index format: "<offset> <length>\\n" per record."""
    return "".join(f"{offset} {size}\n" for offset, size in entries).encode()


def read_tfrecord_index(path):
    """[(offset, size)] from an index file, with a clear error for a malformed line."""
    path = Path(path)
    entries = []
    try:  # digits and spaces only: any other byte (a flipped bit, another file) is named, not a traceback
        text = path.read_bytes().decode("ascii")
    except UnicodeDecodeError as error:
        raise TFRecordFormatError(path, None, 0, f"the index holds a byte that is not text ({error.object[error.start]:#04x} "
                                                 f"at byte {error.start}): not a '<offset> <length>' index") from None
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if len(fields) != 2 or not all(f.isdigit() for f in fields):
            raise TFRecordFormatError(path, None, 0, f"line {number} of the index is not '<offset> <length>': {line!r}")
        entries.append((int(fields[0]), int(fields[1])))
    return entries


def describe_damage(source, limit=3) -> str:
    """What the records' CRCs say about a shard (e.g. one whose sha256 no longer matches): "" if nothing.

    For messages: "record 4 (at byte 1234): data CRC mismatch (...)", the first `limit` problems.
    """
    problems = check_tfrecord_framing(source).problems
    shown = [f"record {p.record} (at byte {p.offset}): {p.problem}" if p.record is not None else p.problem for p in problems[:limit]]
    more = f"; and {len(problems) - limit} more" if len(problems) > limit else ""
    return "; ".join(shown) + more


# ---------------------------------------------------------------------------------------
# Writing


class TFRecordShardWriter(HashingAtomicWriter):
    """Write one shard of framed records: `with TFRecordShardWriter(path) as w: w.add_record(data)`.

    On a clean exit the index file and then the shard are flushed, fsynced and renamed to
    their final names (so a shard under its final name always has its index); `w.sha256`
    and `w.bytes_written` then describe the shard. On an exception the partial files are
    removed. What the records hold is a subclass's (tfslim_imagenet.TFSlimShardWriter).
    """

    def __init__(self, path, write_index=True):
        super().__init__(path)
        self.index_path = tfrecord_index_path(self.path) if write_index else None
        self.samples = 0
        self.entries = []  # (offset, size) per record, as in the index file

    def add_record(self, data, payload_start=None, payload_size=0):
        """Frame and write one record; return (offset, size, payload offset, payload size).

        `payload_start`: where the sample's payload starts inside `data` (None: no payload, offset 0).
        """
        start = self.bytes_written
        length = _U64.pack(len(data))
        self.write(length + _U32.pack(masked_crc32c(length)))
        self.write(data)
        self.write(_U32.pack(masked_crc32c(data)))
        size = self.bytes_written - start
        self.entries.append((start, size))
        self.samples += 1
        return start, size, 0 if payload_start is None else start + HEADER_SIZE + payload_start, payload_size

    def add_raw_record(self, raw, source="<record>", number=None) -> int:
        """Copy one framed record byte for byte (CRCs included), after checking its CRCs.

        `raw` is a sample's whole byte range from another shard (a SampleRecord's
        record_offset/record_size); records hold no offsets, so the copy is valid as it is.
        Returns the shard offset it was written at (as TarShardWriter.add_raw_record).
        """
        check_framed_record(raw, source, number)
        start = self.bytes_written
        self.write(raw)
        self.entries.append((start, len(raw)))
        self.samples += 1
        return start

    @staticmethod
    def finished_size(record_bytes: int) -> int:
        """The size of a shard whose records total `record_bytes` (TFRecord adds no end marker)."""
        return record_bytes

    def _before_rename(self):
        if self.index_path is not None:
            atomic_write_bytes(self.index_path, encode_tfrecord_index(self.entries))

