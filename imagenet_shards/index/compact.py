"""How the sample index's columns are held in memory: narrow fixed-width arrays, one per fact.

At ImageNet's count (1.28M train samples) every byte a sample is 1.3 MB in the loader's main process
and, touched, in each forked worker. SampleColumns (imagenet_shards/index/columns.py) keeps what a
column means and how it is read (`columns.payload_offsets[rows]` is an int64 array); this module
decides how each is stored:

    key_offsets             uint32 while the joined keys fit in 4 GiB (int64 beyond)
    payload_offsets         the record's offset + a uint16/uint32 delta (`RelativeColumn`): the payload
                            starts a header or two after its record
    payload_headers         the record's offset + an int16/int32 delta, the dtype's minimum for -1 (none)
    member_patterns         uint16 while there are at most 65,536 patterns
    box_ids                 one -1 broadcast over the rows when the bbox column holds no box (0 bytes)

A column whose values do not fit the narrow form stays int64, so nothing read changes. Every array is
made once in the main process before DataLoader workers fork and never written again: the workers
share its pages (no object, no reference count per sample). `held_bytes` counts what a column holds.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

UNSIGNED = (np.uint16, np.uint32)
SIGNED = (np.int16, np.int32)


class RelativeColumn:
    """An int64 column stored as base[row] + delta[row] with a narrow delta (base: another column, held
    anyway). Read like the array it stands for: by row, rows, slice (int64 values), `tolist()`, len().
    `missing`: the delta that stands for -1 (payload_headers' "no payload member"), or None."""

    __slots__ = ("base", "delta", "missing")
    dtype = np.dtype(np.int64)

    def __init__(self, base: np.ndarray, delta: np.ndarray, missing: Optional[int] = None):
        self.base, self.delta, self.missing = base, delta, missing

    def __getitem__(self, index):
        delta = self.delta[index]
        values = self.base[index] + delta.astype(np.int64)
        if self.missing is not None:
            if np.ndim(values) == 0:
                return np.int64(-1) if delta == self.missing else values
            values[delta == self.missing] = -1
        return values

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


def relative(values, base: np.ndarray, missing: bool = False):
    """`values` (int64, one per row of `base`) as a RelativeColumn with the narrowest delta that holds
    every value (missing=True: -1 values kept as the dtype's minimum), or `values` itself (int64)."""
    if isinstance(values, RelativeColumn):
        delta = narrowest(values.delta, SIGNED if missing else UNSIGNED, missing)
        return RelativeColumn(values.base, delta, int(np.iinfo(delta.dtype).min) if missing else None)
    values = np.asarray(values, dtype=np.int64)
    if not len(values):
        return values
    delta = values - base
    if missing:
        absent = values == -1
        present = delta[~absent]
        low, high = (int(present.min()), int(present.max())) if len(present) else (0, 0)
        for dtype in SIGNED:
            info = np.iinfo(dtype)
            if info.min < low and high <= info.max:
                delta[absent] = info.min
                return RelativeColumn(base, delta.astype(dtype), int(info.min))
        return values
    narrow = narrowest(delta, UNSIGNED)
    return values if narrow.dtype == np.int64 else RelativeColumn(base, narrow)


def narrowest(values: np.ndarray, dtypes=UNSIGNED, keep_minimum: bool = False) -> np.ndarray:
    """`values` in the first of `dtypes` that holds them all (itself when none does, or when it is
    that narrow already). keep_minimum: the current dtype's minimum (a "missing" mark) maps to the new one's."""
    if not len(values):
        return values
    marked = None
    if keep_minimum:
        marked = values == np.iinfo(values.dtype).min
        rest = values[~marked]
        low, high = (int(rest.min()), int(rest.max())) if len(rest) else (0, 0)
    else:
        low, high = int(values.min()), int(values.max())
    for dtype in dtypes:
        if np.dtype(dtype).itemsize >= values.dtype.itemsize:
            return values
        info = np.iinfo(dtype)
        if (info.min < low if keep_minimum else info.min <= low) and high <= info.max:
            narrow = values.astype(dtype)
            if keep_minimum:
                narrow[marked] = info.min
            return narrow
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
    columns.payload_headers = relative(columns.payload_headers, columns.record_offsets, missing=True)
    if columns.member_patterns is not None and len(columns.patterns) <= 1 << 16:
        columns.member_patterns = narrowest(np.asarray(columns.member_patterns), (np.uint16,))
    boxes = columns.box_ids
    if boxes is not None and boxes.strides != (0,) and (not len(columns.boxes) or not np.any(boxes >= 0)):
        columns.box_ids = constant(-1, len(boxes), np.int32)
