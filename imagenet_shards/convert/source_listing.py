"""A split's source samples as columns: the converter's listing in bounded memory.

A `SourceListing` holds what the `SourceSample`s of a split say, as numpy columns:

    keys, key_offsets        one joined utf-8 buffer (bytes); key i is keys[key_offsets[i]:key_offsets[i + 1]]
    sources, source_offsets  the same for the source path shown in messages and written in each json
    labels                   int32 class index (the class name is `classes[label]`)
    sizes                    int64 source bytes, -1 when not known
    extra                    int64 the locator's own column (an archive member's data offset, a parent
                             dataset's index row), 0 when unused
    box_ids, boxes           int32 row into float64 [m, 4] (-1: no box), or both None when no sample has one

About 90 bytes a sample where SourceSample objects took ~460 (600 MB for ImageNet). Rows are in the
listing's canonical order (class index, then source path). A `SourceListing` is a sequence of
SourceSample: indexing or iterating builds each one on demand (its location through the listing's
locator) and keeps none. `ListingRows` is some of its rows (a shard, in shard order): in the main
process a view of an order array; pickled (to a worker) it becomes the tuple of its SourceSamples, so a
worker receives its shard's samples and nothing of the listing.

`ListingBuilder` makes a listing from rows added one at a time, holding them as columns every
`CHUNK` rows, and sorts it into the canonical order once at the end.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

CHUNK = 1 << 14  # rows held as Python objects at a time (building, hashing, reordering)


@dataclass(frozen=True, slots=True)
class SourceSample:
    key: str  # unique within its split, no dots
    label: int  # class index
    class_name: str  # class folder name / wnid
    source: str  # where it came from, relative to the source root: "train/n01/x.JPEG",
    #              "ILSVRC2012_img_train.tar:n01.tar:x.JPEG", "ILSVRC2012_img_val.tar:y.JPEG"
    location: object  # FileBytes | ArchiveBytes | DatasetBytes: read() gives the bytes
    size: int | None = None  # source bytes, when known (archives; folders when sizes were asked for)
    bbox: list | None = None  # normalised [x1, y1, x2, y2] from imagenet_2012_bounding_boxes.csv, or None

    def read_bytes(self) -> bytes:
        return self.location.read()


class SourceListing(Sequence):
    """A split's samples as columns (see the module docstring); `locator.locate(row, source, size, extra)`
    gives a sample's location (an object whose read() returns its bytes)."""

    def __init__(self, classes, locator, keys: bytes, key_offsets, sources: bytes, source_offsets, labels, sizes,
                 extra, box_ids=None, boxes=None):
        self.classes, self.locator = classes, locator
        self.keys, self.key_offsets, self.sources, self.source_offsets = keys, key_offsets, sources, source_offsets
        self.labels, self.sizes, self.extra, self.box_ids, self.boxes = labels, sizes, extra, box_ids, boxes

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def nbytes(self) -> int:
        arrays = (self.key_offsets, self.source_offsets, self.labels, self.sizes, self.extra, self.box_ids,
                  self.boxes)
        return len(self.keys) + len(self.sources) + sum(a.nbytes for a in arrays if a is not None)

    def key_bytes(self, row: int) -> bytes:
        return self.keys[self.key_offsets[row]:self.key_offsets[row + 1]]

    def key(self, row: int) -> str:
        return self.key_bytes(row).decode()

    def source(self, row: int) -> str:
        return self.sources[self.source_offsets[row]:self.source_offsets[row + 1]].decode()

    def box(self, row: int) -> Optional[list]:
        box_id = -1 if self.box_ids is None else int(self.box_ids[row])
        return None if box_id < 0 else self.boxes[box_id].tolist()

    def __getitem__(self, row):
        if isinstance(row, slice):
            return ListingRows(self, np.arange(len(self))[row])
        row = int(row)
        if row < 0:
            row += len(self)
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} of a listing of {len(self)}")
        return self.sample(row)

    def sample(self, row: int) -> SourceSample:
        label, size, extra, source = int(self.labels[row]), int(self.sizes[row]), int(self.extra[row]), self.source(row)
        size = None if size < 0 else size
        return SourceSample(self.key(row), label, self.classes[label], source,
                            self.locator.locate(row, source, size, extra), size, self.box(row))

    def __iter__(self) -> Iterator:
        return (self.sample(row) for row in range(len(self)))

    def iter_key_bytes(self, rows=None) -> Iterator[bytes]:
        """Every row's key as bytes (of `rows`, in that order, when given), one chunk of slices at a time."""
        data, offsets = self.keys, self.key_offsets
        rows = np.arange(len(self)) if rows is None else rows
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start:start + CHUNK]
            yield from (data[a:b] for a, b in zip(offsets[chunk].tolist(), offsets[chunk + 1].tolist()))

    def with_boxes(self, box_of_source) -> "SourceListing":
        """This listing with each row's box set to `box_of_source(source)` (a list or None)."""
        ids, boxes = np.full(len(self), -1, dtype=np.int32), []
        for row in range(len(self)):
            box = box_of_source(self.source(row))
            if box is not None:
                ids[row] = len(boxes)
                boxes.append(box)
        if not boxes:
            return self
        return SourceListing(self.classes, self.locator, self.keys, self.key_offsets, self.sources,
                             self.source_offsets, self.labels, self.sizes, self.extra, ids,
                             np.asarray(boxes, dtype=np.float64).reshape(-1, 4))

    def first_repeated_key(self):
        """(row, earlier row) of the first row whose key an earlier row has, in listing order; None if none.
        Found on sorted hashes of the keys (no object per key), the keys themselves compared on a match."""
        hashes = np.fromiter((hash(k) for k in self.iter_key_bytes()), dtype=np.int64, count=len(self))
        order = np.argsort(hashes, kind="stable")
        ordered = hashes[order]
        same = np.flatnonzero(ordered[1:] == ordered[:-1])
        if not same.size:
            return None
        first = {}
        for row in np.unique(np.concatenate([order[same], order[same + 1]])).tolist():  # in listing order
            earlier = first.setdefault(self.key_bytes(row), row)
            if earlier != row:
                return row, earlier
        return None

    def keyed_hash_order(self, secret: bytes) -> np.ndarray:
        """Rows sorted by (blake2b(key=secret, data=key, 16 bytes), key): the converter's shuffle."""
        keys = self.iter_key_bytes()
        digests = b"".join(b"".join(hashlib.blake2b(key, key=secret, digest_size=16).digest()
                                    for _, key in zip(range(CHUNK), keys))
                           for _ in range(0, len(self), CHUNK))
        words = np.frombuffer(digests, dtype=">u8").reshape(-1, 2)
        order = np.lexsort((words[:, 1], words[:, 0]))
        ordered = words[order]
        ties = np.flatnonzero((ordered[1:] == ordered[:-1]).all(axis=1))
        for position in ties.tolist():  # equal digests (never seen): the keys decide, as the tuple sorts
            end = position + 2
            while end < len(order) and (ordered[end] == ordered[position]).all():
                end += 1
            order[position:end] = sorted(order[position:end].tolist(), key=self.key_bytes)
        return order

    def rows(self, rows) -> "ListingRows":
        return ListingRows(self, rows)


class ListingRows(Sequence):
    """Rows of a listing (a numpy array of row numbers, in this order) as a sequence of SourceSample.
    Pickled it is the tuple of those SourceSamples (a worker gets its shard's samples, not the listing)."""

    def __init__(self, listing: SourceListing, rows):
        self.listing, self.row_numbers = listing, rows

    def __len__(self) -> int:
        return len(self.row_numbers)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return ListingRows(self.listing, self.row_numbers[index])
        return self.listing.sample(int(self.row_numbers[index]))

    def __iter__(self) -> Iterator:
        return (self.listing.sample(row) for row in self.row_numbers.tolist())

    def __reduce__(self):
        return tuple, (tuple(self),)


class ListingBuilder:
    """Rows added one at a time (`add`), held as columns every CHUNK rows; `finish()` gives the listing
    in canonical order (label, then source path: the order `sorted(key=(label, source))` gives)."""

    def __init__(self, classes, locator):
        self.classes, self.locator = classes, locator
        self._rows = []  # (key, label, source, size, extra, box) of the current chunk
        self._chunks = []  # per chunk: (keys bytes, key lengths, sources bytes, source lengths, labels, sizes,
        #                    extra, box ids, boxes)
        self._boxes = 0

    def add(self, key: str, label: int, source: str, size: Optional[int] = None, extra: int = 0,
            box: Optional[list] = None) -> None:
        self._rows.append((key, label, source, -1 if size is None else size, extra, box))
        if len(self._rows) >= CHUNK:
            self._flush()

    def __len__(self) -> int:
        return sum(len(chunk[4]) for chunk in self._chunks) + len(self._rows)

    def _flush(self) -> None:
        if not self._rows:
            return
        keys, labels, sources, sizes, extra, boxes = zip(*self._rows)
        keys, sources = [k.encode() for k in keys], [s.encode() for s in sources]
        box_ids = np.full(len(boxes), -1, dtype=np.int32)
        kept = []
        for i, box in enumerate(boxes):
            if box is not None:
                box_ids[i] = self._boxes + len(kept)
                kept.append(box)
        self._boxes += len(kept)
        self._chunks.append((b"".join(keys), np.fromiter(map(len, keys), np.int64, len(keys)),
                             b"".join(sources), np.fromiter(map(len, sources), np.int64, len(sources)),
                             np.array(labels, dtype=np.int32), np.array(sizes, dtype=np.int64),
                             np.array(extra, dtype=np.int64), box_ids, np.array(kept, dtype=np.float64).reshape(-1, 4)))
        self._rows = []

    def finish(self, relabel=None) -> SourceListing:
        """The listing, sorted; `relabel` (an array: provisional label -> label) maps the labels first."""
        self._flush()
        chunks, self._chunks = self._chunks, []

        def column(i, dtype):
            return np.concatenate([c[i] for c in chunks]) if chunks else np.empty(0, dtype)

        key_lengths, source_lengths = column(1, np.int64), column(3, np.int64)
        labels, sizes, extra = column(4, np.int32), column(5, np.int64), column(6, np.int64)
        box_ids, boxes = column(7, np.int32), (np.concatenate([c[8] for c in chunks]) if chunks
                                                else np.empty((0, 4), np.float64))
        if relabel is not None and len(labels):
            labels = np.asarray(relabel, dtype=np.int32)[labels]
        keys, sources = b"".join(c[0] for c in chunks), b"".join(c[2] for c in chunks)
        del chunks
        key_offsets, source_offsets = _offsets(key_lengths), _offsets(source_lengths)
        order = _canonical_order(labels, sources, source_offsets)
        if not np.array_equal(order, np.arange(len(order))):
            keys, key_offsets = _gather(keys, key_offsets, order), _offsets(key_lengths[order])
            sources, source_offsets = _gather(sources, source_offsets, order), _offsets(source_lengths[order])
            labels, sizes, extra, box_ids = labels[order], sizes[order], extra[order], box_ids[order]
        if not len(boxes):
            box_ids = boxes = None
        return SourceListing(self.classes, self.locator, keys, key_offsets, sources, source_offsets, labels, sizes,
                             extra, box_ids, boxes)


def _offsets(lengths) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _gather(data: bytes, offsets, order) -> bytes:
    """The slices of `data` of rows `order`, joined in that order (one chunk of slices at a time)."""
    parts = []
    for start in range(0, len(order), CHUNK):
        chunk = order[start:start + CHUNK]
        parts.append(b"".join(data[a:b] for a, b in zip(offsets[chunk].tolist(), offsets[chunk + 1].tolist())))
    return b"".join(parts)


def _canonical_order(labels, sources: bytes, source_offsets) -> np.ndarray:
    """Rows sorted by (label, source path): by label (stable), then each class's rows by their utf-8
    source bytes, which sort as the strings do (code point order)."""
    order = np.argsort(labels, kind="stable")
    ordered = labels[order]
    bounds = np.concatenate([[0], np.flatnonzero(ordered[1:] != ordered[:-1]) + 1, [len(order)]]).tolist()
    for start, end in zip(bounds, bounds[1:]):
        rows = order[start:end]
        paths = [sources[a:b] for a, b in zip(source_offsets[rows].tolist(), source_offsets[rows + 1].tolist())]
        order[start:end] = rows[sorted(range(len(paths)), key=paths.__getitem__)]
    return order


class ListingShards(Sequence):
    """A plan's shards of one split: shard n is `ListingRows` of order[bounds[n]:bounds[n + 1]] (views of one
    order array: no list of samples per shard)."""

    def __init__(self, listing: SourceListing, order, bounds):
        self.listing, self.order, self.bounds = listing, order, np.asarray(bounds, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, number):
        if isinstance(number, slice):
            return [self[n] for n in range(len(self))[number]]
        if not -len(self) <= number < len(self):
            raise IndexError(f"shard {number} of {len(self)}")
        number %= len(self)
        return ListingRows(self.listing, self.order[self.bounds[number]:self.bounds[number + 1]])
