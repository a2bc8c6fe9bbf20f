"""The sample index as columns (numpy arrays): what the loader keeps in memory.

The text index (datasets.index, one tab-separated line per sample) stays the readable, hashed
form on disk. A loader reading ImageNet holds 1.28M samples in every process: as SampleRecord
tuples that was ~600 MB per process, and because every DataLoader worker is forked, reference
counting dirtied those pages and copied them into every worker. Columns hold the same facts in
~80 bytes a sample, in a few large arrays that nobody writes after the parse: forked workers share
their pages (no object, no reference count per sample), so a worker's private memory does not grow
with the index.

Columns (row i = sample i):
    keys, key_offsets       one joined utf-8 buffer; key i is keys[key_offsets[i]:key_offsets[i + 1]]
    shard_ids               int32 into `shard_names` (one string per shard)
    labels                  int32 (0-based; -1 when unknown)
    record_offsets/sizes    int64 / uint32: the sample's whole byte range in its shard
    payload_offsets/sizes   int64 / uint32: the image or tensor bytes
    payload_headers         int64: the tar header offset of the payload member (-1: no members, TFRecord)
    payload_exts            uint8 into `exts` ("jpg", "npy", ...; 0 = "" when there are no members)
    checksums               uint32 crc32c of the payload when the index carries one (`has_checksums`);
                            an index with payload_sha256 loads too (the loader never checks payloads)
    box_ids, boxes          when the index has the bbox column (`has_boxes`): int32 row into `boxes`
                            (float64 [n, 4], normalised x1, y1, x2, y2), -1 for a sample without a box.
                            Sparse (4 bytes a sample + 32 a box) and float64, so a box is the very
                            float its json holds. Without the column both are None (no memory)

Rows are in shard order (shards in order of first appearance, samples by offset inside a shard), so
every shard is one contiguous row range: `group_ranges()` gives them for the planner.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from datasets.index import BBOX_COLUMN, DatasetError, SampleRecord, parse_bbox

REQUIRED = ("key", "shard", "label", "record_offset", "record_size", "payload_offset", "payload_size", "members")
CHECKSUM_COLUMNS = ("payload_crc32c", "payload_sha256")  # the first is kept; the second is read past
CHUNK_LINES = 1 << 16


@dataclass
class SampleColumns:
    keys: np.ndarray
    key_offsets: np.ndarray
    shard_ids: np.ndarray
    shard_names: list
    labels: np.ndarray
    record_offsets: np.ndarray
    record_sizes: np.ndarray
    payload_offsets: np.ndarray
    payload_sizes: np.ndarray
    payload_headers: np.ndarray
    payload_exts: np.ndarray
    exts: list
    checksums: np.ndarray
    has_checksums: bool = False
    box_ids: Optional[np.ndarray] = None  # None when the index has no bbox column
    boxes: Optional[np.ndarray] = None

    @property
    def has_boxes(self) -> bool:
        """Whether the index records every sample's box (its bbox column), an empty one included."""
        return self.box_ids is not None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in _ARRAYS if getattr(self, name) is not None)

    def key(self, row) -> str:
        row = int(row)
        return self.keys[self.key_offsets[row]:self.key_offsets[row + 1]].tobytes().decode()

    def shard(self, row) -> str:
        return self.shard_names[self.shard_ids[row]]

    def box(self, row) -> Optional[list]:
        """Row `row`'s bounding box [x1, y1, x2, y2] (floats) from the index, or None (no box, or an
        index without the bbox column: `has_boxes` tells which)."""
        box_id = -1 if self.box_ids is None else int(self.box_ids[row])
        return None if box_id < 0 else self.boxes[box_id].tolist()

    def record(self, row) -> SampleRecord:
        """Row `row` as the SampleRecord the shard readers take (built on demand, never kept)."""
        row = int(row)
        header = int(self.payload_headers[row])
        members = f"{self.exts[self.payload_exts[row]]}:{header}" if header >= 0 else ""
        checksum = int(self.checksums[row]) if self.has_checksums else None
        return SampleRecord(self.key(row), self.shard_names[self.shard_ids[row]], int(self.labels[row]),
                            int(self.record_offsets[row]), int(self.record_sizes[row]),
                            int(self.payload_offsets[row]), int(self.payload_sizes[row]), checksum, members)

    def records(self, rows) -> list:
        return [self.record(row) for row in rows]

    def take(self, rows) -> "SampleColumns":
        """A new SampleColumns of `rows` (in that order)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts, stops = self.key_offsets[rows], self.key_offsets[rows + 1]
        lengths = stops - starts
        key_offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=key_offsets[1:])
        # every byte of the chosen keys, in order: start of its key + its place inside the key
        within = np.arange(int(key_offsets[-1]), dtype=np.int64) - np.repeat(key_offsets[:-1], lengths)
        keys = self.keys[np.repeat(starts, lengths) + within]
        return SampleColumns(keys, key_offsets, self.shard_ids[rows], self.shard_names, self.labels[rows],
                             self.record_offsets[rows], self.record_sizes[rows], self.payload_offsets[rows],
                             self.payload_sizes[rows], self.payload_headers[rows], self.payload_exts[rows],
                             self.exts, self.checksums[rows], self.has_checksums,
                             None if self.box_ids is None else self.box_ids[rows], self.boxes)

    def in_shard_order(self) -> "SampleColumns":
        """Rows grouped per shard (shards in order of first appearance), by offset inside a shard:
        itself when already so (what the converter and the repartitioner write)."""
        if len(self) < 2:
            return self
        first_seen = np.full(len(self.shard_names), len(self), dtype=np.int64)
        np.minimum.at(first_seen, self.shard_ids, np.arange(len(self), dtype=np.int64))
        rank = np.argsort(np.argsort(first_seen, kind="stable"), kind="stable")[self.shard_ids]
        same = rank[1:] == rank[:-1]
        if np.all(rank[1:] >= rank[:-1]) and np.all(self.record_offsets[1:][same] > self.record_offsets[:-1][same]):
            return self
        return self.take(np.lexsort((self.record_offsets, rank)))

    def group_ranges(self):
        """(starts, sizes) of the shards' row ranges, in row order (see `in_shard_order`)."""
        if not len(self):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        starts = np.flatnonzero(np.r_[True, self.shard_ids[1:] != self.shard_ids[:-1]]).astype(np.int64)
        sizes = np.diff(np.r_[starts, len(self)]).astype(np.int64)
        return starts, sizes

    def rows_of_shards(self, names) -> np.ndarray:
        names = set(names)
        wanted = [n for n, name in enumerate(self.shard_names) if name in names]
        return np.flatnonzero(np.isin(self.shard_ids, wanted))

    def rows_with_keys(self, wanted) -> dict:
        """{key: [rows]} for the keys in `wanted` (one pass over the keys: for a handful of keys)."""
        wanted = set(wanted)
        found = {}
        if not wanted:
            return found
        data = self.keys.tobytes()
        offsets = self.key_offsets
        for row in range(len(self)):
            key = data[offsets[row]:offsets[row + 1]].decode()
            if key in wanted:
                found.setdefault(key, []).append(row)
        return found


_ARRAYS = ("keys", "key_offsets", "shard_ids", "labels", "record_offsets", "record_sizes", "payload_offsets",
           "payload_sizes", "payload_headers", "payload_exts", "checksums", "box_ids", "boxes")


def _payload_member(members: str, payload_offset: int):
    """(ext, header offset) of the member whose data is the payload: the last one starting before it."""
    best = ("", -1)
    for item in members.split(";"):
        ext, _, offset = item.partition(":")
        if offset and int(offset) < payload_offset and int(offset) > best[1]:
            best = (ext, int(offset))
    return best


class _Builder:
    """Appends parsed rows to compact growable arrays (array.array: 8 bytes an int, no objects)."""

    def __init__(self, has_checksums: bool, has_boxes: bool = False):
        self.keys = array("B")
        self.key_offsets = array("q", [0])
        self.shard_ids = array("i")
        self.labels = array("i")
        self.record_offsets = array("q")
        self.record_sizes = array("I")
        self.payload_offsets = array("q")
        self.payload_sizes = array("I")
        self.payload_headers = array("q")
        self.payload_exts = array("B")
        self.checksums = array("I")
        self.box_ids = array("i")
        self.boxes = array("d")
        self.shards = {}
        self.exts = {"": 0}
        self.has_checksums = has_checksums
        self.has_boxes = has_boxes

    def add(self, key: bytes, shard: str, label: int, record_offset: int, record_size: int, payload_offset: int,
            payload_size: int, checksum: int, members: str, box: Optional[list] = None) -> None:
        self.keys.frombytes(key)
        self.key_offsets.append(len(self.keys))
        shard_id = self.shards.get(shard)
        if shard_id is None:
            shard_id = self.shards[shard] = len(self.shards)
        self.shard_ids.append(shard_id)
        self.labels.append(label)
        self.record_offsets.append(record_offset)
        self.record_sizes.append(record_size)
        self.payload_offsets.append(payload_offset)
        self.payload_sizes.append(payload_size)
        ext, header = _payload_member(members, payload_offset) if members else ("", -1)
        ext_id = self.exts.get(ext)
        if ext_id is None:
            ext_id = self.exts[ext] = len(self.exts)
        self.payload_headers.append(header)
        self.payload_exts.append(ext_id)
        self.checksums.append(checksum)
        if self.has_boxes:
            if box is None:
                self.box_ids.append(-1)
            else:
                self.box_ids.append(len(self.boxes) // 4)
                self.boxes.extend(box)

    def columns(self) -> SampleColumns:
        # Zero-copy views of the arrays (no second copy of the index at its peak).
        def view(values):
            return np.frombuffer(values, dtype=_TYPECODES[values.typecode])

        if len(self.exts) > 255:
            raise DatasetError(f"more than 255 payload extensions in one index: {sorted(self.exts)[:10]} ...")
        return SampleColumns(
            view(self.keys), view(self.key_offsets), view(self.shard_ids), list(self.shards), view(self.labels),
            view(self.record_offsets), view(self.record_sizes), view(self.payload_offsets), view(self.payload_sizes),
            view(self.payload_headers), view(self.payload_exts), list(self.exts), view(self.checksums),
            self.has_checksums, view(self.box_ids) if self.has_boxes else None,
            view(self.boxes).reshape(-1, 4) if self.has_boxes else None)


_TYPECODES = {"q": np.int64, "i": np.int32, "I": np.uint32, "B": np.uint8, "d": np.float64}
assert all(array(code).itemsize == np.dtype(dtype).itemsize for code, dtype in _TYPECODES.items())


def columns_from_records(records: Iterable[SampleRecord]) -> SampleColumns:
    """Columns of SampleRecords (shards scanned without an index, TFRecord shards indexed by their framing).
    `has_boxes` when every record carries its bbox (records of an index with the column)."""
    records = list(records)
    builder = _Builder(False, bool(records) and all(r.bbox is not None for r in records))
    for r in records:
        builder.add(r.key.encode(), r.shard, int(r.label), r.record_offset, r.record_size, r.payload_offset,
                    r.payload_size, 0, r.members, parse_bbox(r.bbox))
    return builder.columns()


def parse_sample_columns(lines: Iterable[bytes], source="<index>") -> SampleColumns:
    """Columns of a text index given as an iterable of its lines (bytes, e.g. an open binary file):
    parsed a line at a time, so only the columns are ever held, never the whole text.

    Errors name the source and the line (as `parse_sample_index` does)."""
    lines = iter(lines)
    header = next(lines, b"").rstrip(b"\r\n").decode(errors="replace").split("\t")
    if not set(REQUIRED) <= set(header) or not any(c in header for c in CHECKSUM_COLUMNS):
        raise DatasetError(f"{source}: not a sample index (expected the columns {' '.join(REQUIRED)} "
                           f"and one of {', '.join(CHECKSUM_COLUMNS)})")
    width = len(header)
    at = {name: header.index(name) for name in REQUIRED}
    has_checksums = "payload_crc32c" in header
    checksum_at = header.index("payload_crc32c") if has_checksums else None
    has_boxes = BBOX_COLUMN in header
    box_at = header.index(BBOX_COLUMN) if has_boxes else None
    builder = _Builder(has_checksums, has_boxes)
    key_at, shard_at, label_at = at["key"], at["shard"], at["label"]
    ro_at, rs_at, po_at, ps_at, members_at = (at["record_offset"], at["record_size"], at["payload_offset"],
                                              at["payload_size"], at["members"])
    add = builder.add
    number = 1
    for number, line in enumerate(lines, start=2):
        fields = line.rstrip(b"\r\n").split(b"\t")
        if len(fields) != width:
            if not line.strip():
                continue
            raise DatasetError(f"{source}: line {number} has {len(fields)} fields, expected {width}")
        try:
            checksum = int(fields[checksum_at], 16) if has_checksums else 0
            box = parse_bbox(fields[box_at]) if has_boxes else None
            add(fields[key_at], fields[shard_at].decode(), int(fields[label_at]), int(fields[ro_at]),
                int(fields[rs_at]), int(fields[po_at]), int(fields[ps_at]), checksum,
                fields[members_at].decode(), box)
        except (ValueError, OverflowError):
            raise DatasetError(f"{source}: line {number} has a non-integer offset, size, label or checksum, "
                               f"or a bbox that is not 4 numbers") from None
    return builder.columns()


def read_sample_columns(location: str, opener=None) -> SampleColumns:
    """The columns of the text index at `location` (a local path; `opener(location)` for anything
    else, e.g. an http response), read as a stream."""
    try:
        with (opener(location) if opener else open(location, "rb")) as stream:
            return parse_sample_columns(stream, location)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise DatasetError(f"{location}: cannot read the sample index: {error.strerror or error}") from None


def check_columns_match(columns: SampleColumns, records, source="<index>") -> Optional[str]:
    """None when `columns` hold exactly `records` (text index order); else the first difference."""
    if len(columns) != len(records):
        return f"{source}: {len(columns)} rows in the columns, {len(records)} lines in the text index"
    for row, record in enumerate(records):
        got = columns.record(row)
        expected_member = _payload_member(record.members, record.payload_offset) if record.members else ("", -1)
        same = (got.key, got.shard, got.label, got.record_offset, got.record_size, got.payload_offset,
                got.payload_size) == (record.key, record.shard, record.label, record.record_offset,
                                      record.record_size, record.payload_offset, record.payload_size)
        member = (columns.exts[columns.payload_exts[row]], int(columns.payload_headers[row]))
        box = (columns.has_boxes, columns.box(row)) == (record.bbox is not None, parse_bbox(record.bbox))
        if not same or member != expected_member or not box:
            return f"{source}: row {row} ({record.key!r}) differs between the columns and the text index"
    return None

