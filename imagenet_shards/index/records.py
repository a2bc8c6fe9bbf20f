"""The records of the sample index and their text form: `SampleRecord` (one sample, one index line),
`ShardRecord` (one shard, as metadata.json lists it), the per-sample checksum and the bbox text.

Each sample is described by a `SampleRecord`, one tab-separated line of the split's index, in the
columns imagenet_shards.index.schema declares; the writer here streams records into that text, and
imagenet_shards.index.columns is its one reader.
"""

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import crc32c

from imagenet_shards.fileio import HashingAtomicWriter
from imagenet_shards.index.schema import CHECKSUM_COLUMN, COLUMNS, INDEX_CHUNK_LINES, header_columns


@dataclass(frozen=True)
class ShardRecord:
    """One shard as written. md5 is "" in metadata written before it was recorded (it is then
    left out of the JSON, so such metadata round-trips unchanged)."""

    name: str
    samples: int
    bytes: int
    sha256: str
    md5: str = ""

    def to_json(self) -> dict:
        obj = asdict(self)
        if not self.md5:
            del obj["md5"]
        return obj

    @classmethod
    def from_json(cls, obj) -> "ShardRecord":
        return cls(str(obj["name"]), int(obj["samples"]), int(obj["bytes"]), str(obj["sha256"]),
                   str(obj.get("md5", "")))


class SampleRecord(NamedTuple):
    """Where one sample lives and what its payload must checksum to.

    record_offset/record_size: the sample's whole byte range in the shard (for tar: from
    its first member header to the end of its last member's padding; for TFRecord:
    the length, CRCs and data of its record). Copying that range copies the sample
    byte for byte. payload_offset/payload_size: the image or tensor bytes themselves.
    payload_crc32c: CRC32C (Castagnoli, unmasked) of the payload bytes, cheap enough to check on
    every read; None when unknown (a record built by scanning a shard without an index).
    members: "ext:header_offset" pairs joined by ";" (for tar), e.g. "cls:0;json:512;jpg:1536".
    bbox: the sample's bounding box as the index writes it (`bbox_text`): "x1,y1,x2,y2" (normalised
    floats, as in the sample's json), "" for a sample without one, None when not recorded (an index
    without the bbox column: written before it existed, or records built by scanning shards).
    Kept as text (parsed by `parse_bbox` where used): ~half the memory of a tuple of floats.

    A NamedTuple, not a dataclass: built per row from the index's columns (imagenet_shards.index.columns)
    wherever code needs one, never one per sample held at once; a tuple is built ~2x faster.
    `record._replace(field=value)` makes a changed copy.
    """

    key: str
    shard: str
    label: int
    record_offset: int
    record_size: int
    payload_offset: int
    payload_size: int
    payload_crc32c: Optional[int]
    members: str = ""
    bbox: Optional[str] = None

    def member_offsets(self) -> dict:
        pairs = (item.split(":") for item in self.members.split(";") if item)
        return {ext: int(offset) for ext, offset in pairs}


def payload_crc32c(payload) -> int:
    """The per-sample checksum the index records: CRC32C of the payload bytes (hardware-accelerated)."""
    return crc32c.crc32c(payload)


def crc32c_problem(expected: int, payload) -> Optional[str]:
    """None if `payload`'s CRC32C is `expected` (the index's), else what differs."""
    return None if crc32c.crc32c(payload) == expected else "payload CRC32C differs from the sample index"


def payload_problem(record: SampleRecord, payload) -> Optional[str]:
    """None if `payload` has the checksum the index records for it (or it records none), else what differs."""
    return None if record.payload_crc32c is None else crc32c_problem(record.payload_crc32c, payload)


def bbox_text(box) -> str:
    """A box as the index column holds it: "" for None/empty, else its 4 numbers as Python writes
    floats (the shortest text that reads back to the same float, as in the sample's json)."""
    if not box:
        return ""
    values = [float(v) for v in box]
    if len(values) != 4 or not all(math.isfinite(v) for v in values):
        raise ValueError(f"a bounding box is 4 finite numbers [x1, y1, x2, y2], got {box!r}")
    return ",".join(map(repr, values))


def parse_bbox(text) -> Optional[list]:
    """[x1, y1, x2, y2] (floats) of a record's bbox text (str, or bytes as the columnar parser has it);
    None for "" (no box) or None (not recorded). Raises ValueError when it is not 4 finite numbers."""
    if not text:
        return None
    values = [float(v) for v in text.split(b"," if isinstance(text, bytes) else ",")]
    if len(values) != 4 or not all(map(math.isfinite, values)):
        raise ValueError(f"bbox {text[:60]!r} is not 4 finite numbers")
    return values


assert SampleRecord._fields[:len(COLUMNS)] == COLUMNS and CHECKSUM_COLUMN in COLUMNS  # one schema


def iter_sample_index(records):
    """The text index of `records` (any iterable, consumed once), as chunks of bytes: the header as the
    first record implies it (imagenet_shards.index.schema), then the lines. ValueError when the records mix
    records with and without their bbox (a writer in progress is then abandoned)."""
    records = iter(records)
    first = next(records, None)
    boxed = first is not None and first.bbox is not None
    lines = ["\t".join(header_columns(boxed))]
    for record in (() if first is None else _chain(first, records)):
        if (record.bbox is not None) != boxed:
            raise ValueError("a sample index cannot mix records with and without their bounding box")
        checksum = "" if record.payload_crc32c is None else f"{record.payload_crc32c:08x}"
        fields = [record.key, record.shard, str(record.label), str(record.record_offset), str(record.record_size),
                  str(record.payload_offset), str(record.payload_size), checksum, record.members]
        if boxed:
            fields.append(record.bbox)
        lines.append("\t".join(fields))
        if len(lines) >= INDEX_CHUNK_LINES:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def _chain(first, rest):
    yield first
    yield from rest


def encode_sample_index(records) -> bytes:
    return b"".join(iter_sample_index(records))


def write_sample_index(path, records) -> dict:
    """Write the index of `records` (any iterable: streamed, never held whole) atomically; return its
    {"name", "bytes", "sha256", "md5"} for metadata."""
    with HashingAtomicWriter(path) as writer:
        for chunk in iter_sample_index(records):
            writer.write(chunk)
    return {"name": Path(path).name, "bytes": writer.bytes_written, "sha256": writer.sha256, "md5": writer.md5}



# A record known only by its place in a shard (foreign shards whose records carry no key).
POSITIONAL_SEPARATOR = "#"


def positional_key(shard_name: str, number: int) -> str:
    """The key of a record known only by its place: "train-00003-of-01024#17" (record 17)."""
    return f"{shard_name}{POSITIONAL_SEPARATOR}{number}"


def is_positional_key(record) -> bool:
    """Whether a SampleRecord's key is positional (e.g. TFRecords indexed without metadata)."""
    return record.key.startswith(record.shard + POSITIONAL_SEPARATOR)
