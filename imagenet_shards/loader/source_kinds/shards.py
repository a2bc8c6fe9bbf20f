"""The shard kind ("shards", any format of the registry; "webdataset" until 2026-11-28): items are
rows of the columnar sample index; each sequential run of rows is read as one byte range of its
shard, by the shard's format.

With verify, a payload is checked against the CRC32C its index records (`payload_problem`) before
it is decoded. With the source's shard cache (get_data's cache_dir), a run of a cached shard is read
from the node's copy, or from the shard while it is fetched into the cache (imagenet_shards/shard_cache/).
With use_bbox_info, each payload comes Boxed with its box: from the index's bbox column where it has
one, else from the sample's json member.
"""

from __future__ import annotations

import json
from typing import Optional

from imagenet_shards.loader import worker_shards

import numpy as np

from imagenet_shards.formats import format_for_location
from imagenet_shards.index import crc32c_problem, payload_problem
from imagenet_shards.loader.payloads import get_payload
from imagenet_shards.loader.shard_reader import (Run, is_url, iter_run, payload_extension, read_member, reads_locally,
                                          sample_label)
from imagenet_shards.loader.share_plan import epoch_order
from imagenet_shards.loader.source_kinds.base import Boxed, SourceKind, fingerprint_start
from imagenet_shards.loader.source_kinds.shard_sources import resolve_loose, resolve_named

SCATTER_CHUNK = 256  # items read shard by shard, then handed out in order (_scattered_samples)


class RowRun:
    """A sequential run of rows of one shard: its location and byte range; `run()` builds the Run
    with its records (the record-free local path never does)."""

    __slots__ = ("columns", "rows", "location", "start", "stop")

    def __init__(self, columns, rows, location, start, stop):
        self.columns, self.rows, self.location, self.start, self.stop = columns, rows, location, start, stop

    def run(self) -> Run:
        return Run(self.location, self.start, self.stop, tuple(self.columns.records(self.rows)))


def _row_runs(columns, rows, locate):
    """A RowRun per sequential run of `rows` (rows of a columnar index, reading order): consecutive
    rows of one shard whose byte ranges touch. Lazy: records exist for one run at a time, if at all."""
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return
    shard, offset = columns.shard_ids[rows], columns.record_offsets[rows]
    end = offset + columns.record_sizes[rows]
    breaks = np.flatnonzero((shard[1:] != shard[:-1]) | (offset[1:] != end[:-1])) + 1
    bounds = np.r_[0, breaks, len(rows)]
    for first, last in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        yield RowRun(columns, rows[first:last], locate(columns.shard(rows[first])), int(offset[first]),
                     int(end[last - 1]))


def _raw_samples(context, items):
    source, columns = context.source, context.columns
    cache = source.cache  # the node's shard cache (get_data's cache_dir; imagenet_shards/shard_cache/), or None
    if cache is not None:
        cache.plan_rows(columns, items, source.locate)  # what it prefetches (cache_prefetch)
    elif _scattered(columns, items):
        yield from _scattered_samples(context, items)
        return
    yield from _sequential_samples(context, items)


def _scattered(columns, items) -> bool:
    """Whether most items are runs of one row (a block-shuffled order: order="global")."""
    rows = np.asarray(items, dtype=np.int64)
    if len(rows) < 2:
        return False
    offset = columns.record_offsets[rows]
    follows = (columns.shard_ids[rows[1:]] == columns.shard_ids[rows[:-1]]) & \
        (offset[1:] == offset[:-1] + columns.record_sizes[rows[:-1]])
    return int(np.count_nonzero(follows)) * 2 < len(rows)


def _scattered_samples(context, items):
    """Items in no shard order (the global order's block shuffle), without the shard cache: each chunk of
    SCATTER_CHUNK items is read one shard at a time (one call of the format's local path per shard,
    not per sample: ~8% of a sample's CPU at 224 px) and handed out in item order. Local payloads are
    views of the mapped shard, so holding a chunk copies nothing; remote shards read as before."""
    columns = context.columns
    items = np.asarray(items, dtype=np.int64)
    for first in range(0, len(items), SCATTER_CHUNK):
        chunk = items[first:first + SCATTER_CHUNK]
        order = np.argsort(columns.shard_ids[chunk], kind="stable")
        rows = chunk[order]
        shards = columns.shard_ids[rows]
        bounds = np.r_[0, np.flatnonzero(shards[1:] != shards[:-1]) + 1, len(rows)].tolist()
        out = [None] * len(chunk)
        for start, stop in zip(bounds[:-1], bounds[1:]):
            worker_shards.reading(int(shards[start]))
            run = RowRun(columns, rows[start:stop], context.source.locate(columns.shard(rows[start])), 0, 0)
            samples = _local_row_samples(context, run)
            if samples is None:
                samples = _sequential_samples(context, run.rows)
            for position, sample in zip(order[start:stop].tolist(), samples):
                out[position] = sample
        yield from out


def _sequential_samples(context, items):
    source, columns = context.source, context.columns
    # use_bbox_info: the box from the index when it has the column (no json member to read);
    # otherwise (old indexes, shards scanned without one) from each sample's json.
    boxes_indexed = context.use_bbox_info and columns.has_boxes
    cache = source.cache
    # Items are rows of the columnar index; a run's records are built as it is read, where needed.
    for row_run in _row_runs(columns, items, source.locate):
        rows = row_run.rows
        worker_shards.reading(int(columns.shard_ids[rows[0]]))
        samples = _local_row_samples(context, row_run) if cache is None else None
        if samples is not None:
            yield from samples
            continue
        run = row_run.run()
        if cache is not None and cache.covers(run):  # read from the cache, or while filling it
            yield from cache.read_run(run, lambda part, first, rows=rows: _run_samples(context, rows[first:], part,
                                                                                        boxes_indexed))
        else:
            yield from _run_samples(context, rows, run, boxes_indexed)


def _local_row_samples(context, row_run):
    """The raw sample tuples of a local run read straight from the columns (no record built), or
    None where that path does not apply (a remote shard, boxes asked for, a
    format without `read_payload_rows`)."""
    source, columns = context.source, context.columns
    if context.use_bbox_info or is_url(row_run.location):
        return None
    fmt = source.shard_format or format_for_location(row_run.location)
    payloads = fmt.read_payload_rows(row_run.location, columns, row_run.rows)
    if payloads is None:
        return None
    return _checked_row_samples(payloads, columns, context.verify)


def _checked_row_samples(payloads, columns, verify):
    checksums, known = columns.checksums if columns.has_checksums else None, columns.checksum_known
    labels, shard_ids, shard_names = columns.labels, columns.shard_ids, columns.shard_names
    kinds = {}  # extension -> payload kind name (the registry's answer, looked up once a run)
    for row, ext, payload, error in payloads:
        kind = kinds.get(ext)
        if kind is None:
            kind = kinds[ext] = get_payload(ext).name
        if verify and error is None and checksums is not None and (known is None or known[row]):
            error = crc32c_problem(checksums[row], payload)
        yield row, shard_names[shard_ids[row]], int(labels[row]), payload, kind, error


def _run_samples(context, rows, run, boxes_indexed):
    """The raw sample tuples of one run of a shard (`rows`: its rows of the columnar index)."""
    source, verify, use_bbox_info, columns = context.source, context.verify, context.use_bbox_info, context.columns
    fmt = source.shard_format or format_for_location(run.location)
    payloads = fmt.read_payloads(run) if reads_locally(run) else None
    if payloads is not None:  # the format reads a local run straight from the index
        for row, (record, ext, payload, error) in zip(rows.tolist(), payloads):
            kind = get_payload(ext).name
            if verify and error is None:
                error = payload_problem(record, payload)
            if use_bbox_info and error is None:
                bbox = (_usable_bbox(columns.box(row)) if boxes_indexed
                        else _bbox_of(read_member(run.location, record, "json")))
                payload = Boxed(payload, bbox)
            yield row, record.shard, record.label, payload, kind, error
        return
    for row, (record, sample, error) in zip(rows.tolist(), iter_run(run, source.label_offset, fmt, verify)):
        if error is not None:
            yield row, record.shard, record.label, None, None, error
            continue
        ext = source.payload if source.payload in sample else payload_extension(sample)
        if ext is None:
            members = ", ".join(k for k in sample if not k.startswith("__"))
            yield row, record.shard, record.label, None, None, f"no image payload (members: {members})"
            continue
        try:
            label = sample_label(sample, record.label)
        except ValueError:
            yield row, record.shard, record.label, None, None, "the class label is not an integer"
            continue
        payload = sample[ext]
        error = payload_problem(record, payload) if verify else None
        if use_bbox_info and error is None:
            bbox = _usable_bbox(columns.box(row)) if boxes_indexed else _bbox_of(sample.get("json"))
            payload = Boxed(payload, bbox)
        yield row, record.shard, label, payload, get_payload(ext).name, error


def _bbox_of(info_json) -> Optional[list]:
    """The sample json's "bbox" (normalised [x1, y1, x2, y2] inside the image), or None."""
    if info_json is None:
        return None
    try:
        bbox = json.loads(bytes(info_json)).get("bbox")
    except (ValueError, AttributeError):
        return None
    return _usable_bbox(bbox)


def _usable_bbox(bbox) -> Optional[list]:
    """`bbox` (from the index or a json) if it is a non-empty box inside the image, else None."""
    if (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)
            and 0 <= bbox[0] < bbox[2] <= 1 and 0 <= bbox[1] < bbox[3] <= 1):
        return bbox
    return None


def _key(context, row) -> str:
    return context.columns.key(row)


def _labels(context, rows) -> list:
    return context.columns.labels[np.asarray(rows, dtype=np.int64)].tolist()


def _epoch_sequence(source, seed: int, epoch: int, shuffle: bool):
    return epoch_order(*source.columns.group_ranges(), seed, epoch, shuffle)


# The kind was named "webdataset" until 2026-11-28, and resume states (imagenet_shards/loader/resume.py)
# carry a fingerprint hashed over that name: it stays in the hash, so those states still load.
FINGERPRINT_NAME = "webdataset"


def _fingerprint(source):
    digest = fingerprint_start(FINGERPRINT_NAME, source)
    digest.update(np.ascontiguousarray(source.columns.key_offsets, dtype=np.int64).tobytes())
    digest.update(source.columns.keys.tobytes())
    return digest


SHARDS = SourceKind("shards", _raw_samples, key=_key, labels=_labels, epoch_sequence=_epoch_sequence,
                    fingerprint=_fingerprint, bboxes=True, indexed=True, former_names=("webdataset",),
                    resolve=resolve_named, resolve_loose=resolve_loose)  # resolving: source_kinds/shard_sources.py
