"""The records that writer, reader, validator and repartitioner share.

A converted dataset directory holds:

    metadata.json                 written last: its presence means the dataset is complete
    <split>-000000.tar ...        shards, named by their format (datasets.formats; e.g. TF-slim's
                                  <split>-00000-of-01024 with a <shard>.tfindex each)
    samples-<split>.index.tsv     one line per sample, so any sample can be found and checked alone
                                  (named so that no side file starts with a split name: the reference
                                  loader takes every such name for a shard; datasets made before keep
                                  <split>.index.tsv, which metadata.json names)

metadata.json keeps the reference harness's keys (`train_length`, `validation_length`,
`format`, `shuffle`, `train_transform_pipeline`, `validation_transform_pipeline`,
`seed`, `image_quality`, `checksum`: checksumdir's md5 dirhash of the folder without metadata.json,
see datasets.reference.checksum) and adds:

    "format_version": 1,
    "classes": ["n01440764", ...],          class index -> class folder name
    "tensor_layout": "HWC" | null,
    "label_offset": 1,                      formats whose shards store label + 1 (TF-slim's 1..N);
                                            labels in the sample index are always 0-based
    "splits": {"train": {
        "length": samples written,
        "source_samples": samples found in the source (= length + len(skipped)),
        "skipped": [{"path": ..., "reason": ...}],
        "shards": [ShardRecord.to_json(), ...],
        "index": {"name": "samples-train.index.tsv", "bytes": ..., "sha256": ..., "md5": ...}}}
    "plan_fingerprint": "<sha256>",          the conversion plan (options, source listing): create_webdataset.py
                                            --resume with the same options and source finds the dataset complete
    "convert_state_removed": true,          .convert-state/ is outside `checksum` and was removed once this
                                            file was written (absent: made by an earlier version that kept it,
                                            inside the checksum)
    "payload_extension": "pth",             only where it differs from the format's (datasets.formats.payload_extension_of)
                                            (an adopted reference tensor dataset)
    "metadata_digest": "sha256:<hex>",      last: the sha256 of the canonical JSON of every other key
                                            (datasets.metadata_digest; absent: written before it existed)

A metadata.json written by another tool is recognised through `METADATA_RECOGNISERS`
(datasets.reference: its harness's own, its keys only, no "splits").

Each shard is described by a `ShardRecord` (name, samples, bytes, sha256, md5); each sample
by a `SampleRecord`, one tab-separated line of the split's index, under a header line naming the
columns: key shard label record_offset record_size payload_offset payload_size payload_crc32c members bbox.
Readers go by the header: indexes written before the bbox column (9 columns) and those of the
earlier version with payload_sha256 in place of payload_crc32c read too. format_version stays 1:
every addition is a column the header announces, and a dataset without it stays valid as it is.
"""

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple, Optional

import crc32c

from datasets.layout import METADATA_FILE, SPLITS  # noqa: F401  (re-exported: the records' readers use them)
from datasets.fileio import HashingAtomicWriter, atomic_write_json, sha256_bytes
from datasets.metadata_digest import sealed

FORMAT_VERSION = 1
# metadata.json key (see above): true when the converter's .convert-state/ is outside `checksum` and removed.
CONVERT_STATE_REMOVED = "convert_state_removed"


class DatasetError(Exception):
    """A dataset directory that cannot be used: names the file and the problem."""


def tar_shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.tar"


SAMPLE_INDEX_SUFFIX = ".index.tsv"
_INDEX_PREFIX = "samples-"


def sample_index_name(split: str) -> str:
    """The split's sample index file: the one place that names it."""
    return f"{_INDEX_PREFIX}{split}{SAMPLE_INDEX_SUFFIX}"


def split_of_index_name(name: str):
    """The split a sample index file name belongs to (this name or the earlier <split>.index.tsv), or None."""
    if not name.endswith(SAMPLE_INDEX_SUFFIX):
        return None
    stem = name[: -len(SAMPLE_INDEX_SUFFIX)]
    return stem.removeprefix(_INDEX_PREFIX) or None


# Hooks for metadata.json written by other tools: each takes (metadata, source) and returns the
# DatasetError (a subclass naming that tool) parse_metadata raises, or None. datasets.reference
# registers the one for the layout it reads and adopts.
METADATA_RECOGNISERS = []


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
    every read; None when unknown (an index of the earlier version, or a record built by scanning
    a shard without an index).
    members: "ext:header_offset" pairs joined by ";" (for tar), e.g. "cls:0;json:512;jpg:1536".
    payload_sha256: only in indexes of the earlier version, which recorded the payload's sha256
    instead of its CRC32C; "" otherwise. `payload_problem` checks whichever is there.
    bbox: the sample's bounding box as the index writes it (`bbox_text`): "x1,y1,x2,y2" (normalised
    floats, as in the sample's json), "" for a sample without one, None when not recorded (an index
    without the bbox column: written before it existed, or records built by scanning shards).
    Kept as text (parsed by `parse_bbox` where used): ~half the memory of a tuple of floats.

    A NamedTuple, not a dataclass: built per row from the index's columns (datasets.sample_columns)
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
    payload_sha256: str = ""
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
    if record.payload_crc32c is not None:
        return crc32c_problem(record.payload_crc32c, payload)
    elif record.payload_sha256 and sha256_bytes(payload) != record.payload_sha256:
        return "payload sha256 differs from the sample index"
    return None


def has_payload_checksum(record: SampleRecord) -> bool:
    return record.payload_crc32c is not None or bool(record.payload_sha256)


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


# The index's columns. The earlier versions recorded the payload's sha256 where this one records its
# CRC32C (LEGACY), and had no bbox column; all are read (datasets.sample_columns, the one reader). The
# bbox column is written when the records carry their boxes (None: not recorded), and an index of legacy
# records keeps its checksum column.
_BASE_COLUMNS = ["key", "shard", "label", "record_offset", "record_size", "payload_offset", "payload_size",
                 "payload_crc32c", "members"]
_LEGACY_BASE = [name if name != "payload_crc32c" else "payload_sha256" for name in _BASE_COLUMNS]
BBOX_COLUMN = "bbox"
INDEX_CHUNK_LINES = 4096  # lines encoded per write: the writer never holds a whole index


def iter_sample_index(records):
    """The text index of `records` (any iterable, consumed once), as chunks of bytes: the header as the
    first record implies it, then the lines. ValueError when the records mix CRC32C and legacy sha256
    checksums, or records with and without their bbox (a writer in progress is then abandoned)."""
    records = iter(records)
    first = next(records, None)
    legacy = first is not None and first.payload_crc32c is None and bool(first.payload_sha256)
    boxed = first is not None and first.bbox is not None
    header = (_LEGACY_BASE if legacy else _BASE_COLUMNS) + ([BBOX_COLUMN] if boxed else [])
    lines = ["\t".join(header)]
    for record in (() if first is None else _chain(first, records)):
        if (record.payload_crc32c is None and bool(record.payload_sha256)) != legacy:
            raise ValueError("a sample index cannot mix CRC32C records with legacy sha256 records")
        if (record.bbox is not None) != boxed:
            raise ValueError("a sample index cannot mix records with and without their bounding box")
        checksum = record.payload_sha256 if record.payload_crc32c is None else f"{record.payload_crc32c:08x}"
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


def read_metadata(directory) -> dict:
    """Read and sanity-check `metadata.json`; a clear DatasetError if it is missing or malformed."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        raise DatasetError(f"{directory}: not a converted dataset ({METADATA_FILE} is missing)")
    return parse_metadata(path.read_bytes(), path)


def parse_metadata(data: bytes, source=METADATA_FILE) -> dict:
    try:
        metadata = json.loads(data)
    except ValueError as error:
        raise DatasetError(f"{source}: not valid JSON: {error}") from None
    if not isinstance(metadata, dict):
        raise DatasetError(f"{source}: expected a JSON object")
    for recognise in METADATA_RECOGNISERS:
        foreign = recognise(metadata, source)
        if foreign is not None:
            raise foreign
    for key in ("format", "splits", "classes"):
        if key not in metadata:
            raise DatasetError(f"{source}: the key {key!r} is missing")
    version = metadata.get("format_version", FORMAT_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise DatasetError(f"{source}: format_version {version!r} is not a version number")
    if version > FORMAT_VERSION:
        raise DatasetError(f"{source}: format_version {version} is newer than this tool")
    return metadata


def write_metadata(directory, metadata: dict) -> dict:
    """Write metadata.json atomically, sealed with the digest of its own content
    (datasets.metadata_digest); returns what was written. Every writer of a metadata.json goes here."""
    metadata = sealed(metadata)
    atomic_write_json(Path(directory) / METADATA_FILE, metadata)
    return metadata


def shard_records(metadata: dict, split: str):
    return [ShardRecord.from_json(s) for s in metadata["splits"][split]["shards"]]


# A record known only by its place in a shard (foreign shards whose records carry no key).
POSITIONAL_SEPARATOR = "#"


def positional_key(shard_name: str, number: int) -> str:
    """The key of a record known only by its place: "train-00003-of-01024#17" (record 17)."""
    return f"{shard_name}{POSITIONAL_SEPARATOR}{number}"


def is_positional_key(record) -> bool:
    """Whether a SampleRecord's key is positional (e.g. TFRecords indexed without metadata)."""
    return record.key.startswith(record.shard + POSITIONAL_SEPARATOR)
