"""Where a sample's bytes are written to and read from a TFRecord shard.

A TFRecord file is a sequence of records, each framed as

    uint64 length | uint32 masked CRC32C of the length | data | uint32 masked CRC32C of the data

(little endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8 mod 2**32). The data of
each record here is a serialized `tf.train.Example` with the TF-slim ImageNet feature names
(`image/encoded`, `image/format`, `image/colorspace`, `image/channels`, `image/height`,
`image/width`, `image/class/label`, `image/class/synset`, `image/filename`) plus
`image/key`, the sample's key (TF-slim readers ignore features they do not ask for).

Labels: we store TF-slim's convention, 1..N (0 is TF-slim's "background" class), so our
shards drop into TF-slim and TF models code unchanged; metadata.json says
`"label_offset": 1` and readers subtract it. Existing TF-slim data without metadata is
detected from its labels (`decide_label_offset`); labels are never shifted silently.

Writing: `TFRecordShardWriter` is, like `tar_format.TarShardWriter`, a
`fileio.HashingAtomicWriter`: it hashes while it writes and publishes the shard atomically, together with an
index file (`<shard>.tfindex`, one "<offset> <length>" line per record, exactly what the
`tfrecord` package's `tfrecord2idx` writes). Examples are encoded here, not with the
package's `TFRecordWriter.serialize_tf_example`, for two reasons measured here: (1) it leaves
the feature map in hash order, which changes from one process to the next (protobuf's upb
backend), so shards would not be byte-reproducible; (2) `import tfrecord` imports torch
(2.6 s per process: a 48-image conversion took 7 s instead of 0.7 s with 2 workers). The
encoding is protobuf's deterministic serialization (features sorted by name); the tests
check it byte for byte against the package's protobuf classes (`SerializeToString(
deterministic=True)`), and check that the package's own reader and index tool read our
shards.

Reading: `iter_tfrecord_records` walks the framing itself and checks both CRCs of every
record (the `tfrecord` package never checks them), zero-copy through mmap for local files,
from any readable stream otherwise. `parse_example` decodes the Example's wire format
directly into memoryviews of the record, so the image bytes are never copied, and so that
reading needs neither protobuf nor `import tfrecord` (which imports torch: 2.6 s here).
`iter_tfrecord_samples` yields webdataset-style sample dicts like `tar_format`'s.
"""

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import crc32c

from datasets.formats.base import ShardDataError
from datasets.fileio import HashingAtomicWriter, atomic_write_bytes
from datasets.index import positional_key

LENGTH_SIZE = 8
CRC_SIZE = 4
HEADER_SIZE = LENGTH_SIZE + CRC_SIZE  # length + its CRC
FRAMING_SIZE = HEADER_SIZE + CRC_SIZE  # + the data's CRC
CRC_MASK_DELTA = 0xA282EAD8
INDEX_SUFFIX = ".tfindex"  # the name the tfrecord package's tfrecord2idx gives index files
LABEL_OFFSET = 1  # what we store: TF-slim's 1..N
TFSLIM_CLASSES = 1000  # ImageNet; TF-slim's label 0 is "background"

FEATURE_ENCODED = "image/encoded"
FEATURE_FORMAT = "image/format"
FEATURE_COLORSPACE = "image/colorspace"
FEATURE_CHANNELS = "image/channels"
FEATURE_HEIGHT = "image/height"
FEATURE_WIDTH = "image/width"
FEATURE_LABEL = "image/class/label"
FEATURE_SYNSET = "image/class/synset"
FEATURE_FILENAME = "image/filename"
FEATURE_KEY = "image/key"

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


def _reader_from_stream(stream, source):
    def read(n, position, number, record_offset, what):
        data = stream.read(n)
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
        read, end = _reader_from_stream(stream, source), stop_at
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


def write_tfrecord_index(shard_path, entries=None) -> Path:
    """Write `<shard>.tfindex` atomically (from `entries`, or by scanning the shard)."""
    if entries is None:
        entries = index_entries(shard_path)
    path = tfrecord_index_path(shard_path)
    atomic_write_bytes(path, encode_tfrecord_index(entries))
    return path


def read_tfrecord_index(path):
    """[(offset, size)] from an index file, with a clear error for a malformed line."""
    path = Path(path)
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
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
# tf.train.Example wire format
#
# Example { Features features = 1; }   Features { map<string, Feature> feature = 1; }
# Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
# each *List { repeated value = 1; }  (floats and int64s packed, but unpacked is legal too)


class ExampleFormatError(ValueError):
    """The data of a record is not a valid tf.train.Example."""


def _varint(buf, pos, end):
    result = shift = 0
    while True:
        if pos >= end:
            raise ExampleFormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ExampleFormatError("varint longer than 10 bytes")


def _span(buf, pos, end):
    """(start, stop) of a length-delimited field's body whose length varint is at `pos`."""
    if pos >= end:
        raise ExampleFormatError("truncated length")
    size = buf[pos]
    if size < 0x80:  # the usual one-byte length, without a call
        pos += 1
    else:
        size, pos = _varint(buf, pos, end)
    stop = pos + size
    if stop > end:
        raise ExampleFormatError(f"{size} bytes announced, {end - pos} left")
    return pos, stop


def _skip(buf, pos, end, tag):
    """Position after a field we do not want (unknown fields are legal protobuf)."""
    if tag >= 0x80:  # a multi-byte tag: re-read it whole
        tag, pos = _varint(buf, pos - 1, end)
    wire = tag & 7
    if wire == 0:
        return _varint(buf, pos, end)[1]
    if wire == 2:
        return _span(buf, pos, end)[1]
    size = {1: 8, 5: 4}.get(wire)
    if size is None:
        raise ExampleFormatError(f"unsupported wire type {wire}")
    if pos + size > end:
        raise ExampleFormatError("truncated fixed-size field")
    return pos + size


# Tags are (field number << 3) | wire type; these are the one-byte tags of the fields we read.
_LEN_FIELD_1, _LEN_FIELD_2 = 0x0A, 0x12
_FEATURE_KINDS = {0x0A: "bytes", 0x12: "float", 0x1A: "int64"}
_VARINT_FIELD_1, _FIXED32_FIELD_1 = 0x08, 0x0D


def _signed64(value):
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature_values(buf, start, end):
    """(kind, values) of a Feature; bytes values as (start, end) spans of `buf`."""
    kind, values = None, []
    pos = start
    while pos < end:
        tag = buf[pos]
        pos += 1
        list_kind = _FEATURE_KINDS.get(tag)
        if list_kind is None:
            pos = _skip(buf, pos, end, tag)
            continue
        list_start, list_end = _span(buf, pos, end)
        pos = list_end
        if list_kind != kind:
            kind, values = list_kind, []  # oneof: the last kind written wins
        item = list_start
        while item < list_end:
            tag = buf[item]
            item += 1
            if tag == _LEN_FIELD_1:
                value_start, value_end = _span(buf, item, list_end)
                item = value_end
                if kind == "bytes":
                    values.append((value_start, value_end))
                elif kind == "int64":  # packed
                    while value_start < value_end:
                        number, value_start = _varint(buf, value_start, value_end)
                        values.append(_signed64(number))
                else:  # packed floats
                    if (value_end - value_start) % 4:
                        raise ExampleFormatError("packed floats not a multiple of 4 bytes")
                    values.extend(struct.unpack_from(f"<{(value_end - value_start) // 4}f", buf, value_start))
            elif tag == _VARINT_FIELD_1 and kind == "int64":
                number, item = _varint(buf, item, list_end)
                values.append(_signed64(number))
            elif tag == _FIXED32_FIELD_1 and kind == "float":
                if item + 4 > list_end:
                    raise ExampleFormatError("truncated float")
                values.append(struct.unpack_from("<f", buf, item)[0])
                item += 4
            else:
                item = _skip(buf, item, list_end, tag)
    return kind, values


def example_feature_spans(data, wanted=None):
    """{feature name: (kind, values)} of a serialized Example, bytes values as (start, end) spans.

    `wanted`: a set of feature names to decode (the others are left out: about half the
    cost for a reader that needs the image, label and key of a TF-slim record).

    The spans let a writer find where its payload lies inside the record, and let a reader
    take views of it without copying. Written out as loops rather than a generic field
    walker: this runs once per sample in the loader (as fast as protobuf's own parse, which
    would also copy the image; README, "Design figures").
    """
    buf = memoryview(data)
    end = len(buf)
    features = {}
    pos = 0
    try:
        while pos < end:  # Example
            tag = buf[pos]
            pos += 1
            if tag != _LEN_FIELD_1:
                pos = _skip(buf, pos, end, tag)
                continue
            features_start, features_end = _span(buf, pos, end)
            pos = features_end
            entry = features_start
            while entry < features_end:  # Features: map entries
                tag = buf[entry]
                entry += 1
                if tag != _LEN_FIELD_1:
                    entry = _skip(buf, entry, features_end, tag)
                    continue
                entry_start, entry_end = _span(buf, entry, features_end)
                entry = entry_end
                name, value_span = "", None
                item = entry_start
                while item < entry_end:  # one entry: key, value
                    tag = buf[item]
                    item += 1
                    if tag == _LEN_FIELD_1:
                        start, item = _span(buf, item, entry_end)
                        name = str(buf[start:item], "utf-8")
                    elif tag == _LEN_FIELD_2:
                        value_span = _span(buf, item, entry_end)
                        item = value_span[1]
                    else:
                        item = _skip(buf, item, entry_end, tag)
                if wanted is None or name in wanted:  # a repeated map key: the last one wins, as in protobuf
                    features[name] = _feature_values(buf, *value_span) if value_span else (None, [])
    except UnicodeDecodeError as error:
        raise ExampleFormatError(f"a feature name is not UTF-8: {error}") from None
    return features


def parse_example(data, wanted=None) -> dict:
    """{feature name: list of values}: bytes values are memoryviews of `data` (no copy).

    `wanted`: only these features (see `example_feature_spans`)."""
    view = memoryview(data)
    result = {}
    for name, (kind, values) in example_feature_spans(view, wanted).items():
        result[name] = [view[start:end] for start, end in values] if kind == "bytes" else values
    return result


# ---------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class WrittenRecord:
    record_offset: int  # first byte of the record (its length field)
    record_size: int  # length field + CRC + data + CRC: copying this range copies the sample
    payload_offset: int  # the image bytes inside the record, as shard offsets
    payload_size: int
    label: int  # the label as stored (with LABEL_OFFSET added)


def _encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # protobuf int64: negative values as 10-byte two's complement
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = [bytes((n,)) for n in range(256)]


def _prefix(tag: int, size: int) -> bytes:
    """A length-delimited field's tag and length."""
    return _ONE_BYTE[tag] + _encode_varint(size)


def _feature_pieces(values, dtype: str):
    """(pieces, size) of one Feature message's body. Bytes values stay separate pieces, uncopied."""
    if dtype == "byte":
        pieces = []
        for value in values:
            pieces += (_prefix(_LEN_FIELD_1, len(value)), value)
        size = sum(map(len, pieces))
        return [_prefix(0x0A, size), *pieces], size + len(_prefix(0x0A, size))  # Feature.bytes_list
    if dtype == "int":
        packed = b"".join(_encode_varint(int(v)) for v in values)
    elif dtype == "float":
        packed = struct.pack(f"<{len(values)}f", *values)
    else:
        raise ValueError(f"feature dtype {dtype!r}: expected 'byte', 'int' or 'float'")
    body = _prefix(_LEN_FIELD_1, len(packed)) + packed if packed else b""
    piece = _prefix(0x1A if dtype == "int" else 0x12, len(body)) + body  # Feature.int64_list / float_list
    return [piece], len(piece)


def example_pieces(features: dict, locate=None):
    """A tf.train.Example as a list of byte strings to join (see `serialize_example`), and the
    index in that list of the first value of feature `locate` (a bytes feature), or None.

    Built with the sizes computed up front, so each bytes value (the image) is one piece of
    the list, copied once when the pieces are joined.
    """
    entries, located = [], None
    for name in sorted(features):
        value, dtype = features[name]
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if dtype == "byte":
            values = [v if isinstance(v, bytes) else bytes(v) for v in values]
        name_bytes = name.encode("utf-8")
        feature, feature_size = _feature_pieces(values, dtype)
        key = _prefix(_LEN_FIELD_1, len(name_bytes)) + name_bytes
        value_prefix = _prefix(_LEN_FIELD_2, feature_size)
        if name == locate and dtype == "byte" and values:
            # 1 (the Example's prefix) + entries so far + entry prefix, key, value prefix, bytes_list prefix, value prefix
            located = 1 + len(entries) + 5
        entries += (_prefix(_LEN_FIELD_1, len(key) + len(value_prefix) + feature_size), key, value_prefix, *feature)
    return [_prefix(_LEN_FIELD_1, sum(map(len, entries))), *entries], located  # Example.features


def serialize_example(features: dict) -> bytes:
    """Serialize {name: (value or list, "byte" | "int" | "float")} as a tf.train.Example.

    The datum format of the tfrecord package's `serialize_tf_example`; the bytes of
    protobuf's deterministic serialization (map entries sorted by name, lists packed).
    """
    return b"".join(example_pieces(features)[0])


def imagenet_example_features(key, label, synset, image_bytes, height, width, filename, colorspace="RGB", image_format="JPEG", label_offset=LABEL_OFFSET):
    """The TF-slim ImageNet features of one image (TF-slim's build_imagenet_data.py names)."""
    channels = {"RGB": 3, "L": 1, "CMYK": 4}.get(colorspace, 3)

    def text(value):
        return value.encode() if isinstance(value, str) else bytes(value)

    return {
        FEATURE_ENCODED: (image_bytes if isinstance(image_bytes, bytes) else bytes(image_bytes), "byte"),
        FEATURE_FORMAT: (text(image_format), "byte"),
        FEATURE_COLORSPACE: (text(colorspace), "byte"),
        FEATURE_CHANNELS: (channels, "int"),
        FEATURE_HEIGHT: (int(height), "int"),
        FEATURE_WIDTH: (int(width), "int"),
        FEATURE_LABEL: (int(label) + label_offset, "int"),
        FEATURE_SYNSET: (text(synset), "byte"),
        FEATURE_FILENAME: (text(filename), "byte"),
        FEATURE_KEY: (text(key), "byte"),
    }


class TFRecordShardWriter(HashingAtomicWriter):
    """Write one shard: `with TFRecordShardWriter(path) as w: w.add_image(key, label, ...)`.

    On a clean exit the index file and then the shard are flushed, fsynced and renamed to
    their final names (so a shard under its final name always has its index); `w.sha256`
    and `w.bytes_written` then describe the shard. On an exception the partial files are
    removed. `label` is 0-based; the shard stores label + `label_offset` (TF-slim's 1..N).
    """

    def __init__(self, path, label_offset=LABEL_OFFSET, write_index=True):
        super().__init__(path)
        self.index_path = tfrecord_index_path(self.path) if write_index else None
        self.label_offset = label_offset
        self.samples = 0
        self.entries = []  # (offset, size) per record, as in the index file

    def add_example(self, data, payload_feature=FEATURE_ENCODED):
        """Frame and write one serialized Example; return (offset, size, payload offset, payload size)."""
        payload_start, payload_size = None, 0
        if payload_feature is not None:
            kind, values = example_feature_spans(data, {payload_feature}).get(payload_feature, (None, []))
            if kind != "bytes" or len(values) != 1:
                raise ValueError(f"the Example has no single bytes feature {payload_feature!r}")
            payload_start, payload_end = values[0]
            payload_size = payload_end - payload_start
        return self._add_record(data, payload_start, payload_size)

    def _add_record(self, data, payload_start, payload_size):
        start = self.bytes_written
        length = _U64.pack(len(data))
        self.write(length + _U32.pack(masked_crc32c(length)))
        self.write(data)
        self.write(_U32.pack(masked_crc32c(data)))
        size = self.bytes_written - start
        self.entries.append((start, size))
        self.samples += 1
        return start, size, 0 if payload_start is None else start + HEADER_SIZE + payload_start, payload_size

    def add_image(self, key, label, synset, image_bytes, height, width, filename, colorspace="RGB", image_format="JPEG") -> WrittenRecord:
        """Write one image as a TF-slim ImageNet Example. `label` is 0-based."""
        if int(label) < 0:
            raise ValueError(f"sample {key!r}: label {label} is negative")
        image_bytes = image_bytes if isinstance(image_bytes, bytes) else bytes(image_bytes)
        features = imagenet_example_features(key, label, synset, image_bytes, height, width, filename, colorspace, image_format, self.label_offset)
        pieces, index = example_pieces(features, locate=FEATURE_ENCODED)
        data = b"".join(pieces)
        offset, size, payload_offset, payload_size = self._add_record(data, sum(map(len, pieces[:index])), len(image_bytes))
        return WrittenRecord(offset, size, payload_offset, payload_size, int(label) + self.label_offset)

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


# ---------------------------------------------------------------------------------------
# Samples and labels


_PAYLOAD_EXTENSIONS = {"jpeg": "jpg", "jpg": "jpg", "png": "png"}
# What a sample dict is made of (the reader decodes only these features of each record).
SAMPLE_FEATURES = frozenset({FEATURE_ENCODED, FEATURE_FORMAT, FEATURE_LABEL, FEATURE_KEY, FEATURE_FILENAME})


def _text(values, default=""):
    return bytes(values[0]).decode("utf-8", "replace") if values else default


def example_key(features, source, number, offset=0):
    """The sample's key: image/key, else the stem of image/filename (TF-slim), else shard:record."""
    key = _text(features.get(FEATURE_KEY, []))
    if key:
        return key
    filename = _text(features.get(FEATURE_FILENAME, []))
    if filename:
        base = filename.rsplit("/", 1)[-1]
        return base.split(".", 1)[0] or base
    return positional_key(Path(str(source)).name, number) if number is not None else f"{Path(str(source)).name}@{offset}"


def example_to_sample(features, source, offset, number, label_offset):
    """A webdataset-style sample dict, like `tar_format.iter_tar_samples` gives.

    `jpg` (or `png`) holds the image bytes as a view, `cls` the 0-based label as text
    (b"17", as in our tar shards), `__label__` the same as an int. Raises
    TFRecordFormatError for a record that lacks the image or the label, or whose label
    falls below 0 once `label_offset` is taken off.
    """
    encoded = features.get(FEATURE_ENCODED)
    if not encoded or not isinstance(encoded[0], memoryview):
        raise TFRecordFormatError(source, number, offset, f"the Example has no {FEATURE_ENCODED} bytes")
    labels = features.get(FEATURE_LABEL)
    if not labels or isinstance(labels[0], (memoryview, float)):
        raise TFRecordFormatError(source, number, offset, f"the Example has no integer {FEATURE_LABEL}")
    label = labels[0] - label_offset
    if label < 0:
        raise TFRecordFormatError(source, number, offset, f"{FEATURE_LABEL} {labels[0]} minus label offset {label_offset} is negative")
    extension = _PAYLOAD_EXTENSIONS.get(_text(features.get(FEATURE_FORMAT, []), "jpeg").lower(), "jpg")
    return {
        "__key__": example_key(features, source, number, offset),
        "__url__": str(source),
        "__offset__": offset,
        "__record__": number,
        "__label__": label,
        extension: encoded[0],
        "cls": str(label).encode(),
    }


def iter_tfrecord_samples(source, label_offset, offset=0, stop_at=None, verify_crc=True, stream=None, first_record=None):
    """Sample dicts (see `example_to_sample`) of the records of one shard.

    `label_offset` is required: 1 for our shards and TF-slim's, 0 for 0-based data;
    `resolve_label_offset` decides it once, before the workers start. `first_record`: as for
    `iter_tfrecord_records` (`__record__` is None when the numbers are unknown).
    """
    number = first_record if first_record is not None or offset else 0
    for record in iter_tfrecord_records(source, offset, stop_at, verify_crc, stream, number):
        try:
            features = parse_example(record.data, SAMPLE_FEATURES)
        except ExampleFormatError as error:
            raise TFRecordFormatError(source, number, record.offset, f"not a tf.train.Example: {error}") from None
        yield example_to_sample(features, source, record.offset, number, label_offset)
        number = None if number is None else number + 1


def scan_tfrecord_shard(source, label_offset, name=None, stream=None, verify_crc=True):
    """Index a shard that has no sample index: one SampleRecord per record, read from the records.

    `name` is the shard name stored in the records (default: `source`). Keys and labels come
    from the Examples (see `example_to_sample`), so every record is read; payload hashes are
    not computed (left empty), as `shard_reader.scan_shard` does for tar.
    """
    from datasets.index import SampleRecord

    name = str(source) if name is None else name
    records = []
    for number, record in enumerate(iter_tfrecord_records(source, verify_crc=verify_crc, stream=stream)):
        try:
            spans = example_feature_spans(record.data, SAMPLE_FEATURES)
        except ExampleFormatError as error:
            raise TFRecordFormatError(source, number, record.offset, f"not a tf.train.Example: {error}") from None
        view = record.data
        features = {k: ([view[a:b] for a, b in v] if kind == "bytes" else v) for k, (kind, v) in spans.items()}
        sample = example_to_sample(features, source, record.offset, number, label_offset)
        payload_start, payload_end = spans[FEATURE_ENCODED][1][0]
        records.append(
            SampleRecord(
                sample["__key__"], name, sample["__label__"], record.offset, FRAMING_SIZE + len(view),
                record.offset + HEADER_SIZE + payload_start, payload_end - payload_start, None,
            )
        )
    return records


TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords")


def is_tfrecord_location(location) -> bool:
    """TFRecord shards are known by name: TF-slim's train-00000-of-01024, or a .tfrecord suffix."""
    name = str(location).rstrip("/").rsplit("/", 1)[-1]
    return parse_tfrecord_shard_name(name) is not None or name.endswith(TFRECORD_SUFFIXES)


def index_tfrecord_shard(path, name=None):
    """SampleRecords of a local shard without a sample index, from its record framing alone.

    For existing TF-slim data: the planner needs each record's byte range, not its content, so
    only the 12-byte record headers are read (or the shard's `.tfindex`, when it exists and
    accounts for the whole file). Keys are positional ("<shard>#<n>", see `positional_key`),
    labels -1 (read from each record when it is loaded), payload ranges and hashes unknown.
    """
    from datasets.index import SampleRecord

    path = Path(path)
    name = str(path) if name is None else name
    entries = None
    index_path = tfrecord_index_path(path)
    if index_path.is_file():
        try:
            listed = read_tfrecord_index(index_path)
        except (OSError, TFRecordFormatError):
            listed = None
        contiguous = listed and listed[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(listed, listed[1:]))
        if contiguous and listed[-1][0] + listed[-1][1] == path.stat().st_size:
            entries = listed
    if entries is None:
        entries = header_entries(path)
    return [SampleRecord(positional_key(name, n), name, -1, offset, size, 0, 0, None) for n, (offset, size) in enumerate(entries)]


def example_label(data):
    """The stored image/class/label of a serialized Example (None when it has none)."""
    kind, values = example_feature_spans(data, {FEATURE_LABEL}).get(FEATURE_LABEL, (None, []))
    return values[0] if kind == "int64" and values else None


def iter_stored_labels(paths, verify_crc=True, open_stream=None):
    """The stored labels of the records of shards, in order (lazily, so a scan can stop early).

    Local paths are mapped; with `open_stream`, other locations (URLs) are read through the
    stream it returns (closed when the scan moves on or stops).
    """
    for path in paths:
        stream = open_stream(path) if open_stream is not None and not Path(str(path)).is_file() else None
        try:
            for number, record in enumerate(iter_tfrecord_records(path, verify_crc=verify_crc, stream=stream)):
                label = example_label(record.data)
                if label is None:
                    raise TFRecordFormatError(path, number, record.offset, f"the Example has no integer {FEATURE_LABEL}")
                yield label
        finally:
            if stream is not None:
                stream.close()


@dataclass(frozen=True)
class LabelOffset:
    offset: int  # subtract this from stored labels to get 0-based class indices
    reason: str  # one line for the user: which offset, and why

    def __str__(self):
        return self.reason


class LabelOffsetError(ValueError):
    """The labels do not say whether they start at 0 or at 1."""


def decide_label_offset(labels, num_classes=None) -> LabelOffset:
    """Tell 0-based labels from TF-slim's 1-based ones, reading `labels` only as far as needed.

    A label 0 means 0-based (TF-slim never stores its background class 0 in ImageNet data);
    a label equal to the class count (`num_classes`, else TF-slim's 1000) means 1-based,
    since 0-based labels stop at count - 1. If neither ever appears, the labels cannot tell
    and LabelOffsetError asks for an explicit offset: a wrong guess would shift every label.
    """
    top = num_classes or TFSLIM_CLASSES
    count, low, high = 0, None, None
    for label in labels:
        count += 1
        low = label if low is None else min(low, label)
        high = label if high is None else max(high, label)
        if label < 0 or label > top:
            raise LabelOffsetError(f"stored label {label} is outside 0..{top}: not {top}-class data; give the class count or the label offset explicitly")
        if label == 0:
            return LabelOffset(0, f"label offset 0: a stored label is 0, so the labels are already 0-based (after {count} records)")
        if label == top:
            return LabelOffset(
                1, f"label offset 1 (TF-slim convention): a stored label is {top} = the class count and none is 0, so labels 1..{top} become 0..{top - 1} (after {count} records)"
            )
    if count == 0:
        raise LabelOffsetError("no records to read labels from; give the label offset explicitly")
    raise LabelOffsetError(
        f"cannot tell whether the labels start at 0 or at 1: the {count} records hold labels {low}..{high}, "
        f"never 0 and never the class count {top}; give the label offset explicitly (1 for TF-slim data, 0 for 0-based)"
    )


def resolve_label_offset(paths=(), metadata=None, explicit=None, num_classes=None, verify_crc=True, open_stream=None) -> LabelOffset:
    """The label offset to apply, and why: explicit > metadata.json's `label_offset` > detection.

    Callers print `.reason`, so which offset was applied is never silent.
    """
    if explicit is not None:
        if explicit not in (0, 1):
            raise LabelOffsetError(f"label offset {explicit} is neither 0 nor 1")
        stored = (metadata or {}).get("label_offset")
        note = f" (metadata.json says {stored})" if stored is not None and stored != explicit else ""
        return LabelOffset(int(explicit), f"label offset {explicit}: given explicitly{note}")
    if metadata is not None and "label_offset" in metadata:
        return LabelOffset(int(metadata["label_offset"]), f"label offset {metadata['label_offset']}: from metadata.json")
    if num_classes is None and metadata is not None and metadata.get("classes"):
        num_classes = len(metadata["classes"])
    return decide_label_offset(iter_stored_labels(paths, verify_crc, open_stream), num_classes)
