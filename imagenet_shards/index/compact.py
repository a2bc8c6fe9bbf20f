"""How the sample index's columns are held in memory: narrow fixed-width arrays, one per fact.

At ImageNet's count (1.28M train samples) every byte a sample is 1.3 MB in the loader's main process
and, touched, in each forked worker. SampleColumns (imagenet_shards/index/columns.py) keeps what a
column means and how it is read (`columns.payload_offsets[rows]` is an int64 array); this module
decides how each is stored:

    key_offsets             uint32 while the joined keys fit in 4 GiB (int64 beyond)
    payload_offsets         the record's offset + a uint16/uint32 delta (`RelativeColumn`): the payload
                            starts a header or two after its record
    payload_headers         the record's offset + an int16/int32 delta when every sample has a payload member
                            (a converted tar dataset), one broadcast -1 when none has (TFRecord, LMDB)
    member_patterns         uint16 while there are at most 65,536 patterns
    box_ids                 one -1 broadcast over the rows when the bbox column holds no box (0 bytes)

A column whose values do not fit the narrow form stays int64, so nothing read changes. Every array is
made once in the main process before DataLoader workers fork and never written again: the workers
share its pages (no object, no reference count per sample). `held_bytes` counts what a column holds.
"""

from __future__ import annotations

import ctypes

import numpy as np

UNSIGNED = (np.uint16, np.uint32)
SIGNED = (np.int16, np.int32)


class RelativeColumn:
    """An int64 column stored as base[row] + delta[row] with a narrow delta (base: another column, held
    anyway). Read like the array it stands for: by row, rows, slice (int64 values), `tolist()`, len()."""

    __slots__ = ("base", "delta")
    dtype = np.dtype(np.int64)

    def __init__(self, base: np.ndarray, delta: np.ndarray):
        self.base, self.delta = base, delta

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):  # one row (a record): Python ints, no array
            return np.int64(int(self.base[index]) + int(self.delta[index]))
        return self.base[index] + self.delta[index]  # int64 (the base's dtype)

    def __len__(self) -> int:
        return len(self.delta)

    @property
    def shape(self) -> tuple:
        return self.delta.shape

    @property
    def nbytes(self) -> int:
        return self.delta.nbytes

    def __array__(self, dtype=None, copy=None):
        values = self[:]
        return values if dtype is None else values.astype(dtype)

    def tolist(self) -> list:
        return self[:].tolist()


def deltas(column, rows, bases) -> np.ndarray:
    """column[rows] - bases, given `bases`: the RelativeColumn's base at `rows` (its stored deltas, no
    arithmetic), or of a plain column."""
    return column.delta[rows] if isinstance(column, RelativeColumn) else column[rows] - bases


def relative(values, base: np.ndarray, dtypes=UNSIGNED):
    """`values` (int64, one per row of `base`) as a RelativeColumn with the narrowest of `dtypes` that
    holds every delta, or `values` itself (int64) when none does."""
    if isinstance(values, RelativeColumn):
        return RelativeColumn(values.base, narrowest(values.delta, dtypes))
    values = np.asarray(values, dtype=np.int64)
    if not len(values) or values.strides == (0,):
        return values
    narrow = narrowest(values - base, dtypes)
    return values if narrow.dtype == np.int64 else RelativeColumn(base, narrow)


def header_column(values, base: np.ndarray):
    """payload_headers (-1: the sample has no payload member) as held: relative to `base` when every
    row has one (what the converter writes), one broadcast -1 when none has (TFRecord, LMDB), else int64."""
    if isinstance(values, RelativeColumn):
        return relative(values, base, SIGNED)
    values = np.asarray(values, dtype=np.int64)
    if not len(values) or values.strides == (0,):
        return values
    absent = values == -1
    if absent.all():
        return constant(-1, len(values), np.int64)
    return values if absent.any() else relative(values, base, SIGNED)


def narrowest(values: np.ndarray, dtypes=UNSIGNED) -> np.ndarray:
    """`values` in the first of `dtypes` that holds them all (itself when none does, or when it is
    that narrow already)."""
    if not len(values):
        return values
    low, high = int(values.min()), int(values.max())
    for dtype in dtypes:
        if np.dtype(dtype).itemsize >= values.dtype.itemsize:
            return values
        info = np.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return values.astype(dtype)
    return values


def constant(value, count: int, dtype) -> np.ndarray:
    """A read-only array of `count` times `value` that holds one value (stride 0)."""
    return np.broadcast_to(np.array(value, dtype=dtype), (count,))


def held_bytes(column) -> int:
    """The bytes `column` holds in memory: a constant (stride-0) array holds one value."""
    if isinstance(column, np.ndarray) and column.ndim == 1 and column.strides == (0,):
        return column.itemsize
    return column.nbytes


def compact(columns) -> None:
    """Store `columns`' arrays in their narrow forms (see the module's docstring), in place."""
    if columns.key_offsets.dtype != np.uint32 and len(columns.key_offsets) and \
            int(columns.key_offsets[-1]) <= np.iinfo(np.uint32).max and int(columns.key_offsets.min()) >= 0:
        columns.key_offsets = columns.key_offsets.astype(np.uint32)
    columns.payload_offsets = relative(columns.payload_offsets, columns.record_offsets)
    columns.payload_headers = header_column(columns.payload_headers, columns.record_offsets)
    if columns.member_patterns is not None and len(columns.patterns) <= 1 << 16:
        columns.member_patterns = narrowest(np.asarray(columns.member_patterns), (np.uint16,))
    boxes = columns.box_ids
    if boxes is not None and boxes.strides != (0,) and (not len(columns.boxes) or not np.any(boxes >= 0)):
        columns.box_ids = constant(-1, len(boxes), np.int32)


_malloc_trim = None  # glibc's malloc_trim, looked up once (False: this C library has none)


def release_freed_memory() -> None:
    """Hand the free pages inside the C heap back to the kernel (glibc's malloc_trim; nothing where the C
    library has none). Parsing an index grows and drops blocks of a few MB that glibc keeps in its heap:
    at ImageNet's count ~30 MB the main process's RSS counts, and every worker forked later inherits."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)
