"""The sample index as columns (numpy arrays): the one reader of the text index, for every command.

The text index (imagenet_shards.index.schema, one tab-separated line per sample) stays the readable, hashed
form on disk. A process holding 1.28M samples as SampleRecord tuples needs ~600 MB (1.2 GB with the
checksums), and because every DataLoader (or validator pool) worker is forked, reference counting
dirtied those pages and copied them into every worker. Columns hold the same facts in ~52 bytes a
sample at ImageNet's count (keys + 39; imagenet_shards/index/compact.py says how each is held), in a
few large arrays that nobody writes after the parse: forked workers share their pages
(no object, no reference count per sample), so a worker's private memory does not grow with the
index. The loader, the validator, the repartitioner and the converter's resume all read the index
here; code that wants a SampleRecord builds one for one row (`record`), or for one shard's rows
(`ShardGroups`), and drops it. `read_sample_index` (every record of an index at once) is for tests
and small indexes only.

Columns (row i = sample i):
    keys, key_offsets       one joined utf-8 buffer; key i is keys[key_offsets[i]:key_offsets[i + 1]]
                            (uint32 offsets while the keys fit in 4 GiB, int64 beyond)
    shard_ids               int32 into `shard_names` (one string per shard)
    labels                  int32 (0-based; -1 when unknown)
    record_offsets/sizes    int64 / uint32: the sample's whole byte range in its shard
    payload_offsets/sizes   int64 / uint32: the image or tensor bytes (offsets held as a narrow delta
                            from the record's offset: a RelativeColumn, read as int64 like an array)
    payload_headers         int64: the tar header offset of the payload member (-1: no members, TFRecord;
                            a delta too when every sample has one, one broadcast -1 when none has)
    payload_exts            uint8 into `exts` ("jpg", "npy", ...; 0 = "" when there are no members)
    member_patterns         uint16 (int32 past 65,536) into `patterns`: the members relative to the record's offset,
                            ((ext, offset - record_offset), ...), so "cls:0;json:512;jpg:1536" of every
                            sample with the same json size is one pattern (4 bytes a sample, not ~40)
    checksums               uint32 crc32c of the payload when the index carries one (`has_checksums`);
                            `checksum_known` (bool) only when some line leaves it empty
    box_ids, boxes          when the index has the bbox column (`has_boxes`): int32 row into `boxes`
                            (float64 [n, 4], normalised x1, y1, x2, y2), -1 for a sample without a box.
                            Sparse (4 bytes a sample + 32 a box) and float64, so a box is the very
                            float its json holds. Without the column both are None (no memory); a
                            column with no box at all holds one broadcast -1

A record built from a row is the line's record: members and bbox are written back in the index's own
form (offsets as integers, boxes as `bbox_text` writes them), so a repartition copies lines unchanged.
Rows are in index order; `in_shard_order()` regroups them (shards in order of first appearance,
samples by offset inside a shard), after which every shard is one contiguous row range:
`group_ranges()` gives them for the planner.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import numpy as np

from imagenet_shards.errors import DatasetError
from imagenet_shards.index.compact import RelativeColumn, compact, constant, deltas, held_bytes
from imagenet_shards.index.earlier import refuse_earlier_index
from imagenet_shards.index.records import SampleRecord, bbox_text, parse_bbox
from imagenet_shards.index.schema import BBOX_COLUMN, CHECKSUM_COLUMN, COLUMNS

KEY_CHUNK = 1 << 16  # rows hashed per step (bounds the transient Python objects)


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
    member_patterns: Optional[np.ndarray] = None  # None: members unknown (records built without them)
    patterns: tuple = ((),)
    checksum_known: Optional[np.ndarray] = None  # None: every row has its checksum (when has_checksums)

    def __post_init__(self):
        compact(self)

    def __setstate__(self, state):  # unpickled (a spawned worker, a pool task): held as compactly again
        self.__dict__.update(state)
        compact(self)

    @property
    def has_boxes(self) -> bool:
        """Whether the index records every sample's box (its bbox column), an empty one included."""
        return self.box_ids is not None

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def nbytes(self) -> int:
        """The bytes the columns hold in memory (a constant column: one value; imagenet_shards/index/compact.py)."""
        return sum(held_bytes(getattr(self, name)) for name in _ARRAYS if getattr(self, name) is not None)

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

    def members(self, row) -> str:
        """Row `row`'s members column ("cls:0;json:512;jpg:1536"); "ext:header" of the payload member
        alone for columns built without their members."""
        if self.member_patterns is None:
            header = int(self.payload_headers[row])
            return f"{self.exts[self.payload_exts[row]]}:{header}" if header >= 0 else ""
        start = int(self.record_offsets[row])
        return ";".join(f"{ext}:{start + delta}" for ext, delta in self.patterns[self.member_patterns[row]])

    def payload_deltas(self, rows, starts) -> tuple:
        """(payload offset, payload header offset) - record offset of each of `rows` (arrays; start + the
        header's delta is -1 for a sample without a payload member), given their record offsets `starts`:
        the loader's per-run path, one gather a column and no arithmetic on the stored deltas."""
        return deltas(self.payload_offsets, rows, starts), deltas(self.payload_headers, rows, starts)

    def record(self, row) -> SampleRecord:
        """Row `row` as the SampleRecord its index line holds (built on demand, never kept)."""
        row = int(row)
        checksum = (int(self.checksums[row]) if self.has_checksums
                    and (self.checksum_known is None or self.checksum_known[row]) else None)
        bbox = None if self.box_ids is None else bbox_text(self.box(row))
        start, payload = int(self.record_offsets[row]), self.payload_offsets
        payload = start + int(payload.delta[row]) if type(payload) is RelativeColumn else int(payload[row])
        if self.member_patterns is None:
            members = self.members(row)
        else:
            members = ";".join(f"{ext}:{start + delta}" for ext, delta in self.patterns[self.member_patterns[row]])
        return SampleRecord(self.key(row), self.shard_names[self.shard_ids[row]], int(self.labels[row]), start,
                            int(self.record_sizes[row]), payload, int(self.payload_sizes[row]), checksum, members, bbox)

    def records(self, rows) -> list:
        return [self.record(row) for row in rows]

    def iter_records(self, rows=None) -> Iterator[SampleRecord]:
        """The records of `rows` (all, in row order, when None), one at a time."""
        return (self.record(row) for row in (range(len(self)) if rows is None else rows))

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

        def pick(values):
            return None if values is None else values[rows]

        return SampleColumns(keys, key_offsets, self.shard_ids[rows], self.shard_names, self.labels[rows],
                             self.record_offsets[rows], self.record_sizes[rows], self.payload_offsets[rows],
                             self.payload_sizes[rows], self.payload_headers[rows], self.payload_exts[rows],
                             self.exts, self.checksums[rows], self.has_checksums, pick(self.box_ids), self.boxes,
                             pick(self.member_patterns), self.patterns, pick(self.checksum_known))

    def in_shard_order(self) -> "SampleColumns":
        """Rows grouped per shard (shards in order of first appearance), by offset inside a shard:
        itself when already so (what the converter and the repartitioner write)."""
        if len(self) < 2:
            return self
        if self._grouped_by_offset():
            return self
        first_seen = np.full(len(self.shard_names), len(self), dtype=np.int64)
        np.minimum.at(first_seen, self.shard_ids, np.arange(len(self), dtype=np.int64))
        rank = np.argsort(np.argsort(first_seen, kind="stable"), kind="stable")[self.shard_ids]
        return self.take(np.lexsort((self.record_offsets, rank)))

    def _grouped_by_offset(self) -> bool:
        """Whether every shard's rows are one run, by offset (a few bytes a row at a time, not 26)."""
        ids, offsets = self.shard_ids, self.record_offsets
        starts = np.r_[0, np.flatnonzero(ids[1:] != ids[:-1]) + 1]
        if len(np.unique(ids[starts])) != len(starts):
            return False  # a shard's rows in two runs or more
        for start in range(0, len(self) - 1, KEY_CHUNK * 16):
            stop = min(start + KEY_CHUNK * 16, len(self) - 1)
            after = slice(start + 1, stop + 1)
            if not np.all((offsets[after] > offsets[start:stop]) | (ids[after] != ids[start:stop])):
                return False
        return True

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

    def key_hashes(self) -> np.ndarray:
        """int64 hash of every row's key (Python's hash of its bytes: equal keys, equal hashes, in this
        process), for sorting and matching keys without one object per key."""
        out = np.empty(len(self), dtype=np.int64)
        offsets = self.key_offsets
        for start in range(0, len(self), KEY_CHUNK):
            bounds = offsets[start:start + KEY_CHUNK + 1].tolist()
            data, first = self.keys[bounds[0]:bounds[-1]].tobytes(), bounds[0]  # a chunk's keys, not all
            out[start:start + len(bounds) - 1] = [hash(data[a - first:b - first]) for a, b in zip(bounds, bounds[1:])]
        return out

    def duplicate_keys(self) -> dict:
        """{key: count} of the keys listed more than once, in order of first appearance ({} for none)."""
        hashes = self.key_hashes()
        hashes.sort()  # in place: 8 bytes a row while no key repeats (the common case), not 24
        if not np.any(hashes[1:] == hashes[:-1]):
            return {}
        hashes = self.key_hashes()
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        repeated = np.flatnonzero(ordered[1:] == ordered[:-1])
        candidates = np.unique(np.concatenate([order[repeated], order[repeated + 1]]))
        counts = {}
        for row in candidates:  # same hash: the keys themselves decide
            key = self.key(row)
            counts[key] = counts.get(key, 0) + 1
        return {key: count for key, count in counts.items() if count > 1}


_ARRAYS = ("keys", "key_offsets", "shard_ids", "labels", "record_offsets", "record_sizes", "payload_offsets",
           "payload_sizes", "payload_headers", "payload_exts", "checksums", "box_ids", "boxes", "member_patterns",
           "checksum_known")


class KeyTable:
    """The rows of an index by key, for many lookups: its keys' hashes sorted (16 bytes a row), no object
    per key. A key listed twice finds its last row (as a dict built over the index would)."""

    def __init__(self, columns: SampleColumns):
        self.columns = columns
        hashes = columns.key_hashes()
        self.order = np.argsort(hashes, kind="stable")
        self.hashes = hashes[self.order]
        self.data = columns.keys.tobytes()

    def rows_of_columns(self, other: SampleColumns) -> np.ndarray:
        """int64: for each row of `other`, the row with its key here, or -1."""
        data, offsets = other.keys.tobytes(), other.key_offsets
        return self._find(other.key_hashes(), lambda i: data[offsets[i]:offsets[i + 1]])

    def rows_of_keys(self, keys) -> np.ndarray:
        """int64: for each key (str) of `keys`, its row here, or -1."""
        encoded = [key.encode() for key in keys]
        return self._find(np.array([hash(key) for key in encoded], dtype=np.int64), encoded.__getitem__)

    def _find(self, wanted, key_of) -> np.ndarray:
        found = np.full(len(wanted), -1, dtype=np.int64)
        if not len(self.hashes) or not len(wanted):
            return found
        at = np.searchsorted(self.hashes, wanted, side="right") - 1
        offsets = self.columns.key_offsets
        for i in np.flatnonzero((at >= 0) & (self.hashes[np.maximum(at, 0)] == wanted)).tolist():
            key, place = key_of(i), int(at[i])
            while place >= 0 and self.hashes[place] == wanted[i]:  # equal hashes: the keys decide
                row = int(self.order[place])
                if self.data[offsets[row]:offsets[row + 1]] == key:
                    found[i] = row
                    break
                place -= 1
        return found


class ShardGroups:
    """{shard name: [SampleRecord]} over columns, built one shard at a time when asked for and never kept:
    what the planner and the shard checks take, at the memory of the columns plus one row order.

    by_offset=True: a shard's records by offset (the repartitioner's order); False: in index order."""

    def __init__(self, columns: SampleColumns, by_offset: bool = True):
        self.columns = columns
        keys = (columns.record_offsets, columns.shard_ids) if by_offset else (columns.shard_ids,)
        self.order = np.lexsort(keys) if len(columns) else np.zeros(0, dtype=np.int64)
        counts = np.bincount(columns.shard_ids, minlength=len(columns.shard_names)) if len(columns) else \
            np.zeros(len(columns.shard_names), dtype=np.int64)
        self.starts = np.r_[0, np.cumsum(counts)].astype(np.int64)
        self.ids = {name: number for number, name in enumerate(columns.shard_names)}

    def rows(self, name) -> np.ndarray:
        number = self.ids.get(name)
        if number is None:
            return np.zeros(0, dtype=np.int64)
        return self.order[self.starts[number]:self.starts[number + 1]]

    def __getitem__(self, name) -> list:
        """The shard's records ([] for a shard without rows)."""
        return self.columns.records(self.rows(name))

    def get(self, name, default=None):
        return self[name] if name in self.ids else default

    def __contains__(self, name) -> bool:
        return name in self.ids

    def __iter__(self):
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def count(self, name) -> int:
        return len(self.rows(name))

    def keys(self):
        return self.ids.keys()

    def items(self):
        return ((name, self[name]) for name in self.ids)


def _members(members: bytes, record_offset: int, payload_offset: int):
    """(pattern, payload ext, payload header offset) of a members field: the pattern is its
    (ext, offset - record_offset) pairs; the payload member is the last one starting before the payload."""
    pairs = []
    ext, header = b"", -1
    for item in members.split(b";"):
        if not item:
            continue
        name, _, offset = item.partition(b":")
        offset = int(offset)
        pairs.append((name, offset - record_offset))
        if header < offset < payload_offset:
            ext, header = name, offset
    return tuple(pairs), ext, header


class _Builder:
    """Appends parsed rows to compact growable arrays (array.array: fixed width, no objects). Offsets
    that the record's offset implies are kept as deltas from it, in 4 bytes (payload offset, payload
    header offset; key offsets in 4 bytes too) and pattern ids in 2: the first row that does not fit
    widens those arrays to 8 (4) bytes (`_widen`), so any index parses as before."""

    NARROW = {"key_offsets": "I", "payload_deltas": "I", "header_deltas": "i", "member_patterns": "H"}
    WIDE = {"key_offsets": "q", "payload_deltas": "q", "header_deltas": "q", "member_patterns": "i"}

    def __init__(self, has_checksums: bool, has_boxes: bool = False):
        self.keys = array("B")
        self.key_offsets = array("I", [0])
        self.shard_ids = array("i")
        self.labels = array("i")
        self.record_offsets = array("q")
        self.record_sizes = array("I")
        self.payload_deltas = array("I")  # payload offset - record offset
        self.payload_sizes = array("I")
        self.header_deltas = array("i")  # payload header offset - record offset; `no_header`: none
        self.no_header = -(1 << 31)
        self.payload_exts = array("B")
        self.member_patterns = array("H")
        self.checksums = array("I")
        self.unknown_checksums = []  # rows whose checksum field is empty (none in what the tools write)
        self.box_ids = None  # array("i") from the first box on (-1 before it); None: no box (yet)
        self.boxes = array("d")
        self.shards = {}
        self.exts = {b"": 0}
        self.patterns = {(): 0}
        self.has_checksums = has_checksums
        self.has_boxes = has_boxes

    def add(self, key: bytes, shard: str, label: int, record_offset: int, record_size: int, payload_offset: int,
            payload_size: int, checksum: int, members: bytes, box: Optional[list] = None) -> None:
        try:
            self.keys.frombytes(key)
            self.key_offsets.append(len(self.keys))
            self.shard_ids.append(self.shards.setdefault(shard, len(self.shards)))  # a new shard: the next id
            self.labels.append(label)
            self.record_offsets.append(record_offset)
            self.record_sizes.append(record_size)
            self.payload_deltas.append(payload_offset - record_offset)
            self.payload_sizes.append(payload_size)
            pattern, ext, header = _members(members, record_offset, payload_offset) if members else ((), b"", -1)
            self.member_patterns.append(self.patterns.setdefault(pattern, len(self.patterns)))
            delta = header - record_offset if header >= 0 else self.no_header
            if delta == self.no_header and header >= 0:
                raise OverflowError("a header delta equal to the mark of none")
            self.header_deltas.append(delta)
            self.payload_exts.append(self.exts.setdefault(ext, len(self.exts)))
            self.checksums.append(checksum)  # the last of a row's arrays but the boxes (see _widen)
        except OverflowError:
            if self.header_deltas.typecode == "q":
                raise  # wide already: a value no index holds (a DatasetError in parse_sample_columns)
            self._widen()
            self.add(key, shard, label, record_offset, record_size, payload_offset, payload_size, checksum,
                     members, box)
            return
        if box is not None and self.has_boxes:
            if self.box_ids is None:
                self.box_ids = array("i", [-1]) * (len(self.checksums) - 1)
            self.box_ids.append(len(self.boxes) // 4)
            self.boxes.extend(box)
        elif self.box_ids is not None:
            self.box_ids.append(-1)

    def _widen(self) -> None:
        """Drop the part of a row that did not fit, and hold the narrow arrays in their wide types."""
        rows = len(self.checksums)
        del self.keys[self.key_offsets[rows]:]
        del self.key_offsets[rows + 1:]
        for name in ("shard_ids", "labels", "record_offsets", "record_sizes", "payload_deltas", "payload_sizes",
                     "header_deltas", "payload_exts", "member_patterns"):
            del getattr(self, name)[rows:]
        for name, code in self.WIDE.items():
            values = getattr(self, name)
            wide = array(code, values)
            if name == "header_deltas":
                wide = array(code, (-(1 << 63) if value == self.no_header else value for value in values))
            setattr(self, name, wide)
        self.no_header = -(1 << 63)

    def columns(self) -> SampleColumns:
        # Zero-copy views of the arrays (no second copy of the index at its peak).
        def view(values):
            return np.frombuffer(values, dtype=_TYPECODES[values.typecode])

        if len(self.exts) > 255:
            raise DatasetError(f"more than 255 payload extensions in one index: {sorted(self.exts)[:10]} ...")
        known = None
        if self.unknown_checksums:
            known = np.ones(len(self.labels), dtype=bool)
            known[self.unknown_checksums] = False
        patterns = tuple(tuple((ext.decode(), delta) for ext, delta in pattern) for pattern in self.patterns)
        box_ids = None
        if self.has_boxes:
            box_ids = constant(-1, len(self.labels), np.int32) if self.box_ids is None else view(self.box_ids)
        record_offsets = view(self.record_offsets)
        headers = view(self.header_deltas)
        absent = headers == self.no_header
        if not absent.any():
            headers = RelativeColumn(record_offsets, headers)
        elif absent.all():
            headers = constant(-1, len(headers), np.int64)
        else:  # some samples without a payload member: int64 offsets, -1 for those
            headers = record_offsets + headers
            headers[absent] = -1
        del absent
        return SampleColumns(
            view(self.keys), view(self.key_offsets), view(self.shard_ids), list(self.shards), view(self.labels),
            record_offsets, view(self.record_sizes), RelativeColumn(record_offsets, view(self.payload_deltas)),
            view(self.payload_sizes), headers,
            view(self.payload_exts), [ext.decode() for ext in self.exts], view(self.checksums), self.has_checksums,
            box_ids, view(self.boxes).reshape(-1, 4) if self.has_boxes else None, view(self.member_patterns),
            patterns, known)


_TYPECODES = {"q": np.int64, "i": np.int32, "I": np.uint32, "H": np.uint16, "B": np.uint8, "d": np.float64}
assert all(array(code).itemsize == np.dtype(dtype).itemsize for code, dtype in _TYPECODES.items())


def columns_from_records(records: Iterable[SampleRecord], checksums: bool = False) -> SampleColumns:
    """Columns of SampleRecords (shards scanned without an index, TFRecord shards indexed by their framing).
    `has_boxes` when every record carries its bbox (records of an index with the column). checksums=True
    keeps the records' CRC32Cs: the records an index would hold."""
    records = list(records)
    crcs = checksums and any(r.payload_crc32c is not None for r in records)
    builder = _Builder(crcs, bool(records) and all(r.bbox is not None for r in records))
    for r in records:
        if crcs and r.payload_crc32c is None:
            builder.unknown_checksums.append(len(builder.labels))
        builder.add(r.key.encode(), r.shard, int(r.label), r.record_offset, r.record_size, r.payload_offset,
                    r.payload_size, r.payload_crc32c or 0 if crcs else 0, r.members.encode(), parse_bbox(r.bbox))
    return builder.columns()


def _header(line: bytes, source):
    header = line.rstrip(b"\r\n").decode(errors="replace").split("\t")
    refuse_earlier_index(header, source)
    if not set(COLUMNS) <= set(header):
        raise DatasetError(f"{source}: not a sample index (expected the columns {' '.join(COLUMNS)})")
    return header, header.index(CHECKSUM_COLUMN), header.index(BBOX_COLUMN) if BBOX_COLUMN in header else None


def parse_sample_columns(lines: Iterable[bytes], source="<index>") -> SampleColumns:
    """Columns of a text index given as an iterable of its lines (bytes, e.g. an open binary file):
    parsed a line at a time, so only the columns are ever held, never the whole text. Errors name the
    source and the line."""
    lines = iter(lines)
    header, checksum_at, box_at = _header(next(lines, b""), source)
    width = len(header)
    at = {name: header.index(name) for name in COLUMNS}
    builder = _Builder(True, box_at is not None)
    key_at, shard_at, label_at = at["key"], at["shard"], at["label"]
    ro_at, rs_at, po_at, ps_at, members_at = (at["record_offset"], at["record_size"], at["payload_offset"],
                                              at["payload_size"], at["members"])
    add, shards = builder.add, {}
    for number, line in enumerate(lines, start=2):
        fields = line.rstrip(b"\r\n").split(b"\t")
        if len(fields) != width:
            if not line.strip():
                continue
            raise DatasetError(f"{source}: line {number} has {len(fields)} fields, expected {width}")
        try:
            checksum = 0
            text = fields[checksum_at]
            if text:
                checksum = int(text, 16)
            else:
                builder.unknown_checksums.append(len(builder.labels))
            box = parse_bbox(fields[box_at]) if box_at is not None else None
            shard = fields[shard_at]
            name = shards.get(shard) or shards.setdefault(shard, shard.decode())
            add(fields[key_at], name, int(fields[label_at]), int(fields[ro_at]), int(fields[rs_at]),
                int(fields[po_at]), int(fields[ps_at]), checksum, fields[members_at], box)
        except (ValueError, OverflowError, UnicodeDecodeError):
            raise DatasetError(f"{source}: line {number} has a non-integer offset, size, label or CRC32C, a "
                               f"members field that does not parse, or a bbox that is not 4 numbers") from None
    return builder.columns()


def read_sample_columns(location, opener=None) -> SampleColumns:
    """The columns of the text index at `location` (a local path; `opener(location)` for anything
    else, e.g. an http response), read as a stream."""
    try:
        with (opener(location) if opener else open(location, "rb")) as stream:
            return parse_sample_columns(stream, location)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise DatasetError(f"{location}: cannot read the sample index: {error.strerror or error}") from None


def read_sample_index(path) -> list:
    """Every SampleRecord of the index at `path` (checksums included), in index order: for tests and
    small indexes only (a tuple a sample); commands read columns and build records per row or shard."""
    columns = read_sample_columns(path)
    return list(columns.iter_records())


def check_columns_match(columns: SampleColumns, records, source="<index>") -> Optional[str]:
    """None when `columns` hold exactly `records` (text index order); else the first difference."""
    if len(columns) != len(records):
        return f"{source}: {len(columns)} rows in the columns, {len(records)} lines in the text index"
    for row, record in enumerate(records):
        got = columns.record(row)
        expected_member = _members(record.members.encode(), record.record_offset, record.payload_offset)[1:]
        same = (got.key, got.shard, got.label, got.record_offset, got.record_size, got.payload_offset,
                got.payload_size) == (record.key, record.shard, record.label, record.record_offset,
                                      record.record_size, record.payload_offset, record.payload_size)
        member = (columns.exts[columns.payload_exts[row]].encode(), int(columns.payload_headers[row]))
        box = (columns.has_boxes, columns.box(row)) == (record.bbox is not None, parse_bbox(record.bbox))
        if not same or member != expected_member or not box or got.members != record.members:
            return f"{source}: row {row} ({record.key!r}) differs between the columns and the text index"
    return None
