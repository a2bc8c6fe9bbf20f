"""The shard kind ("shards", any format of the registry; "webdataset" until 2026-11-28): what names shards
becomes a Source with ShardSettings (`resolve_named`, `resolve_loose`), and its items, rows of the
columnar sample index, are read by the shard's format (imagenet_shards/formats/runs.py).

What names shards:
    converted dataset   a directory or http(s) base URL holding metadata.json and its sample indexes
                        (made by create_webdataset.py); a repartition for the instance count
                        (distributed/<N>-instances/manifest.json) is used when present.
    TFRecord shards     a folder (or list) of TF-slim shards without metadata: indexed from their record
                        headers (or .tfindex files), the label offset given or detected, never silent.
    shard list          paths, URLs or brace patterns of tar shards: the folder's metadata and index where
                        they cover them, else each shard's headers scanned once (a warning says so).
`resolve_named` runs before the other kinds' hooks (a list, a URL, a file, a folder with metadata.json);
`resolve_loose` after them (a folder holding only shards: .tar files or a format's own).

Reading: the plan says how the rows come (ReadContext.positions). In the shard order, each sequential run
of a shard's rows is one `read_run` (one byte range); under the global order, positions are read in
chunks, each shard's rows of a chunk with one `read_positions`. Where the source has a shard cache
(get_data's cache_dir), the bytes under either reader are the node's copy, or the shard while it is
fetched into the cache (imagenet_shards/shard_cache/): a byte source beneath the readers, not a path of
its own. With verify, a payload is checked against the CRC32C its index records before it is decoded.
With use_bbox_info, each payload comes Boxed with its box: from the index's bbox column where it has
one, else from the sample's json member.
"""

from __future__ import annotations

import itertools
import json
import logging
import warnings
from pathlib import Path
from typing import Optional

import numpy as np

from imagenet_shards.dataset_folder import DISTRIBUTED_DIR, METADATA_FILE, REPARTITION_MANIFEST
from imagenet_shards.errors import DatasetError
from imagenet_shards.fileio import sha256_bytes
from imagenet_shards.formats import (FORMATS, ForeignShardsError, UnknownFormatError, format_claiming,
                                     format_for_location, get_format, payload_extension_of)
from imagenet_shards.index import (SAMPLE_INDEX_SUFFIX, SampleColumns, columns_from_records, parse_metadata,
                                   parse_sample_columns, read_sample_columns, sample_index_name)
from imagenet_shards.loader.read.index_trust import index_disagreement, index_file_disagreement
from imagenet_shards.loader.read.shard_reader import (exists, expand_locations, is_url, join_location, open_byte_range,
                                                 read_bytes, scan_shard)
from imagenet_shards.loader.source_kinds.source import OwnShare, ShardSettings, Source, SourceError
from imagenet_shards.metadata_digest import EDITED, MALFORMED, digest_status
from imagenet_shards.preprocess import PreprocessError, parse_stored_steps
from imagenet_shards.reference import ReferenceMetadataError
from imagenet_shards.reference.layout import NOTICE, scan_unadopted
from imagenet_shards.safe_names import is_relative_name, redact
from imagenet_shards.formats.runs import RowReading, ShardBytes, run_bounds
from imagenet_shards.index import crc32c_problem
from imagenet_shards.loader.payloads import get_payload
from imagenet_shards.loader.plan.share_plan import epoch_order
from imagenet_shards.loader.read import worker_shards
from imagenet_shards.loader.source_kinds.base import Boxed, SourceKind, fingerprint_start

log = logging.getLogger(__name__)
KIND = "shards"  # the shard kind's name (SHARDS below)


def resolve_named(source, request) -> Optional[Source]:
    """Shards a source names outright: a list, a URL, a brace pattern, a file, a folder with metadata.json."""
    split, offset = request.split, request.label_offset
    if isinstance(source, (list, tuple)):
        return _shard_list(expand_locations(source), split, offset)
    text = str(source)
    if is_url(text):
        if text.endswith(".tar") or "{" in text or format_claiming(text) is not None:
            return _shard_list(expand_locations(text), split, offset)
        return _converted(text.rstrip("/") + "/", split, request.instance_count, request.use_repartition)
    path = Path(text)
    if not path.exists():
        if "{" in text:
            return _shard_list(expand_locations(text), split, offset)
        raise SourceError(f"{text}: no such file or directory")
    if path.is_file():
        return _shard_list([text], split, offset)
    if (path / METADATA_FILE).is_file():
        return _converted(str(path), split, request.instance_count, request.use_repartition)
    return None


def resolve_loose(source, request) -> Optional[Source]:
    """A folder no kind claimed that holds shards: `<split>-*.tar` (else any .tar), or a format's own shards."""
    path, split = Path(str(source)), request.split
    if isinstance(source, (list, tuple)) or not path.is_dir():
        return None
    shards = sorted(path.glob(f"{split}-*.tar")) or sorted(path.glob("*.tar"))
    if shards:
        return _shard_list([str(s) for s in shards], split, request.label_offset)
    for fmt in FORMATS.values():
        try:
            found = fmt.find_foreign_shards(path, split)
        except ForeignShardsError as error:
            raise SourceError(str(error)) from None
        if found:
            try:
                return _foreign_files(fmt, [str(s) for s in found], split, request.label_offset)
            except SourceError as error:
                if any(path.glob(f"samples-*{SAMPLE_INDEX_SUFFIX}")):  # a converted dataset that lost its metadata
                    raise SourceError(f"{path / METADATA_FILE}: missing, though the folder holds a converted "
                                      f"dataset's sample indexes (restore it or re-convert); read as loose "
                                      f"shards: {error}") from None
                raise
    return None


def _read_json(location: str, what: str):
    try:
        return json.loads(read_bytes(location))
    except FileNotFoundError:
        return None
    except ValueError as error:
        raise SourceError(f"{location}: {what} is not valid JSON: {error}") from None


def _converted(base: str, split: str, instance_count: int, use_repartition: bool) -> Source:
    metadata_location = join_location(base, METADATA_FILE)
    try:
        metadata_bytes = read_bytes(metadata_location)
        _warn_if_edited(metadata_location, metadata_bytes)
        metadata = parse_metadata(metadata_bytes, metadata_location)
    except FileNotFoundError:
        raise SourceError(f"{base}: not a converted dataset ({METADATA_FILE} is missing)") from None
    except ReferenceMetadataError:
        return _unadopted(base, split, json.loads(metadata_bytes))
    if split not in metadata["splits"]:
        raise SourceError(f"{metadata_location}: no split {split!r} (it has {', '.join(metadata['splits'])})")
    entry = metadata["splits"][split]
    index_name = (entry.get("index") or {}).get("name", sample_index_name(split))
    index_location = join_location(base, index_name)
    columns = _read_columns(index_location, entry)
    _hold_against_metadata(columns, entry, index_location)
    fmt = metadata["format"]
    try:
        shard_format = get_format(fmt)
    except UnknownFormatError as error:
        raise SourceError(f"{metadata_location}: {error}") from None
    settings = ShardSettings(columns, base=base, metadata=metadata, label_offset=metadata.get("label_offset", 0),
                             shard_format=shard_format)
    described = f"{redact(base)} ({fmt}, {split}: {len(columns)} samples in {len(columns.group_ranges()[0])} shards)"
    source = Source(KIND, described, [], payload_extension_of(metadata), classes=metadata.get("classes"),
                    stored_steps=_stored_steps(metadata, split, metadata_location),
                    tensor_layout=metadata.get("tensor_layout") or "HWC", settings=settings)
    if source.label_offset:
        log.info("%s: shards store labels + %d (metadata.json label_offset, TF-slim's 1..N); the loader subtracts it",
                 base, source.label_offset)
    if use_repartition and instance_count > 1:
        source.repartition = _repartition(base, split, instance_count, sha256_bytes(metadata_bytes))
    return source


_WARNED_EDITED = set()  # metadata.json locations already warned about in this process


def _warn_if_edited(location: str, data: bytes) -> None:
    """One warning per process and location when metadata.json does not match its own digest
    (imagenet_shards.metadata_digest): the loader still reads it, since every sample is checked on read,
    but its shard list, steps and class table may not be what was written."""
    try:
        status, message = digest_status(json.loads(data))
    except ValueError:
        return  # parse_metadata names it
    if status in (EDITED, MALFORMED) and location not in _WARNED_EDITED:
        _WARNED_EDITED.add(location)
        warnings.warn(f"{location}: {message}", stacklevel=4)


def _unadopted(base: str, split: str, metadata: dict) -> Source:
    """A dataset another tool made, not adopted (imagenet_shards.reference): its shards' tar headers scanned once."""
    metadata_location = join_location(base, METADATA_FILE)
    try:
        scanned = scan_unadopted(base, split, metadata, metadata_location, is_url(base), scan_shard)
    except DatasetError as error:
        raise SourceError(str(error)) from None
    warnings.warn(scanned.notice, stacklevel=4)
    groups = [list(group) for _, group in itertools.groupby(scanned.records, key=lambda r: r.shard)]
    return Source(KIND, scanned.description, [], scanned.payload_ext,
                  stored_steps=_stored_steps(metadata, split, metadata_location), tensor_layout="CHW",
                  settings=ShardSettings(_columns_of_groups(groups), base=base, metadata=metadata))


def _stored_steps(metadata: dict, split: str, metadata_location: str) -> list:
    """The steps the converter already applied to `split` (imagenet_shards.preprocess), or a SourceError
    naming metadata.json."""
    try:
        return parse_stored_steps(metadata.get(f"{split}_transform_pipeline"))
    except PreprocessError as error:
        raise SourceError(f"{metadata_location}: {split}_transform_pipeline: {error}") from None


REBUILD_REPARTITION = "remove the repartition's folder and re-run distributed_webdataset.py"


def _repartition(base: str, split: str, count: int, metadata_sha256: str):
    """{instance: OwnShare loader} for a repartition made for `count` instances, or None."""
    relative = f"{DISTRIBUTED_DIR}/{count}-instances/{REPARTITION_MANIFEST}"
    location = join_location(base, relative)
    manifest = _read_json(location, "the repartition manifest")
    if manifest is None:
        log.info("%s: no repartition for %d instances (%s); dealing samples at run time", base, count, relative)
        return None
    if manifest.get("source_metadata_sha256") != metadata_sha256:
        # The dataset was converted again after the repartition was made: its samples may differ.
        message = (f"{location}: made for another version of this dataset (metadata.json changed since); "
                   f"ignoring it and dealing samples at run time. Re-run distributed_webdataset.py "
                   f"--num-instances {count} to refresh it")
        warnings.warn(message, stacklevel=4)
        return None
    try:
        entry = manifest["splits"][split]
        instances = entry["instances"]
        policy = entry["policy"]
        counts = [int(item["samples"]) for item in instances]
        if len(instances) != count:
            raise SourceError(f"{location}: made for {len(instances)} instances, not {count}")
    except KeyError as error:
        log.info("%s: no %r entry for split %s; dealing samples at run time", location, error.args[0], split)
        return None
    return {"location": location, "base": base, "policy": policy, "counts": counts, "entry": entry}


def load_own_share(repartition: dict, instance: int) -> OwnShare:
    entry = repartition["entry"]
    item = entry["instances"][instance]
    index_location = join_location(repartition["base"], item["index"])
    recorded = {"index": item["index_record"]} if "index_record" in item else None  # older manifests: none
    columns = _read_columns(index_location, recorded, recorded_by=repartition["location"],
                            remedy=REBUILD_REPARTITION)
    if len(columns) != int(item["samples"]):
        raise SourceError(f"{index_location}: holds {len(columns)} samples, the manifest says {item['samples']}")
    unsafe = next((name for name in columns.shard_names if not is_relative_name(name)), None)
    if unsafe is not None:  # a shard outside the dataset (imagenet_shards.safe_names)
        raise SourceError(f"{index_location}: unsafe shard name {unsafe!r} (a path outside the dataset, `..` or "
                          f"a URL); {REBUILD_REPARTITION}")
    return OwnShare(repartition["location"], repartition["policy"], columns, repartition["counts"],
                    list(item.get("padded_keys", [])), list(entry.get("dropped_keys", [])))


def _read_columns(location: str, split_entry=None, recorded_by: str = "metadata.json",
                  remedy: str = "restore it or re-convert") -> SampleColumns:
    """A text sample index as columns in shard order, read once in this (the main) process: forked
    DataLoader workers share its arrays. A local index is parsed as a stream (the text is never held),
    after its size and sha256 are held against what `recorded_by` records for it in `split_entry`
    (metadata.json's split entry, a repartition manifest's instance entry; index_trust)."""
    if is_url(location):
        columns = parse_sample_columns(iter(read_bytes(location, _recorded_bytes(split_entry)).splitlines()), location)
    else:
        problem = index_file_disagreement(location, split_entry, recorded_by, remedy) if split_entry else None
        if problem:
            raise SourceError(problem)
        try:
            columns = read_sample_columns(location)
        except FileNotFoundError:
            raise SourceError(f"{location}: the sample index is missing ({remedy})") from None
        except UnicodeDecodeError as error:
            raise SourceError(f"{location}: the sample index is not UTF-8 text at byte {error.start} "
                              f"(a damaged index: {remedy})") from None
    return columns.in_shard_order()


def _recorded_bytes(split_entry) -> Optional[int]:
    """The index size `split_entry` records (the most a remote read of it takes), or None (the default cap)."""
    try:
        return int(split_entry["index"]["bytes"])
    except (KeyError, TypeError, ValueError):
        return None


def _hold_against_metadata(columns: SampleColumns, split_entry, index_location: str) -> None:
    """A SourceError naming the index when it disagrees with metadata.json (imagenet_shards/loader/read/index_trust.py)."""
    problem = index_disagreement(columns, split_entry, index_location)
    if problem:
        raise SourceError(problem)


def _shard_list(locations, split: str, label_offset: Optional[int] = None) -> Source:
    if not locations:
        raise SourceError("the list of shards is empty")
    base = locations[0].rsplit("/", 1)[0] if "/" in locations[0] else "."
    same_folder = all(loc.rsplit("/", 1)[0] == base for loc in locations)
    metadata_location = join_location(base, METADATA_FILE)
    metadata, foreign = None, None
    if same_folder and exists(metadata_location):
        metadata_bytes = read_bytes(metadata_location)
        _warn_if_edited(metadata_location, metadata_bytes)
        try:
            metadata = parse_metadata(metadata_bytes, metadata_location)
        except ReferenceMetadataError:  # another tool's shards (imagenet_shards.reference): scanned below
            foreign = json.loads(read_bytes(metadata_location))
    if metadata is not None:
        for name, entry in metadata["splits"].items():
            index_location = join_location(base, (entry.get("index") or {}).get("name", sample_index_name(name)))
            columns = _read_columns(index_location, entry)
            _hold_against_metadata(columns, entry, index_location)
            wanted = {loc.rsplit("/", 1)[-1] for loc in locations}
            rows = columns.rows_of_shards(wanted)
            if {columns.shard_names[i] for i in np.unique(columns.shard_ids[rows])} == wanted:
                # the shards in the order given, samples by offset inside each
                order = {loc.rsplit("/", 1)[-1]: n for n, loc in enumerate(locations)}
                shard_rank = np.array([order.get(shard, len(order)) for shard in columns.shard_names], dtype=np.int64)
                rows = rows[np.lexsort((columns.record_offsets[rows], shard_rank[columns.shard_ids[rows]]))]
                settings = ShardSettings(columns.take(rows), base=base, metadata=metadata,
                                         label_offset=metadata.get("label_offset", 0),
                                         shard_format=get_format(metadata["format"]))
                return Source(KIND, f"{len(locations)} shards of {base} (indexed, split {name})", [],
                              payload_extension_of(metadata), classes=metadata.get("classes"),
                              stored_steps=_stored_steps(metadata, name, metadata_location),
                              tensor_layout=metadata.get("tensor_layout") or "HWC", settings=settings)
    claimed = {format_claiming(location) for location in locations}
    if len(claimed) == 1 and None not in claimed:
        return _foreign_files(claimed.pop(), locations, split, label_offset)
    message = (f"{len(locations)} shards without a sample index: scanning their tar headers once to count "
               f"and locate every sample (convert with create_webdataset.py to skip this)")
    if foreign is not None:
        message = f"{len(locations)} shards of {NOTICE.format(root=base)}"
    warnings.warn(message, stacklevel=3)
    groups = []
    for location in locations:
        records = scan_shard(location)
        if records:
            groups.append(records)
    payloads = {r.members.split(";")[-1].split(":")[0] for g in groups[:1] for r in g[:1]}
    payload = next(iter(payloads & {"npy", "pth"}), "jpg")
    stored = _stored_steps(foreign, split, metadata_location) if foreign is not None else []
    return Source(KIND, f"{len(locations)} shards (scanned, no index)", [], payload, stored_steps=stored,
                  settings=ShardSettings(_columns_of_groups(groups), locations={loc: loc for loc in locations}))


def _foreign_files(fmt, locations, split: str, label_offset: Optional[int]) -> Source:
    """Shards without metadata that a format recognises by name (e.g. TF-slim's TFRecords):
    indexed by the format; the label offset given, or detected, and always said (a warning)."""
    def open_range(location):
        return open_byte_range(location, 0, None) if is_url(location) else None

    try:
        groups, offset, reason = fmt.index_foreign_shards(locations, label_offset, open_range)
    except ForeignShardsError as error:
        raise SourceError(f"{split}: {error}") from None
    warnings.warn(reason, stacklevel=3)
    settings = ShardSettings(_columns_of_groups(groups), locations={loc: loc for loc in locations},
                             label_offset=offset, shard_format=fmt)
    return Source(KIND, f"{len(locations)} {fmt.name} shards ({split}, no metadata, label offset {offset})",
                  [], fmt.payload_extension, settings=settings)


def _columns_of_groups(groups) -> SampleColumns:
    """Scanned shards (lists of SampleRecords, one per shard) as columns, one row range per shard."""
    return columns_from_records(record for group in groups for record in group)


# ------------------------------------------------------------------ reading

POSITIONS_CHUNK = 256  # positions read shard by shard, then handed out in order (_position_samples)


def _raw_samples(context, items):
    """The plan's items (rows of the columnar index) as raw samples, in order. The plan says how they come
    (context.positions): runs of each shard, or positions under the global order, read in chunks shard
    by shard. Either way each shard's rows are read by its format (formats/runs.py), from the bytes the
    shard cache serves where the source has one, else from the shard itself."""
    source, columns = context.source, context.columns
    if source.cache is not None:  # the node's shard cache (get_data's cache_dir; imagenet_shards/shard_cache/)
        source.cache.plan_rows(columns, items, source.locate)  # what it prefetches (cache_prefetch)
    rows = np.asarray(items, dtype=np.int64)
    if context.positions:
        yield from _position_samples(context, rows)
        return
    for first, stop in run_bounds(columns, rows):
        yield from _shard_samples(context, rows[first:stop], "read_run")


def _position_samples(context, rows):
    """Positions in no shard order (the global order's block shuffle): each chunk of POSITIONS_CHUNK is read
    one shard at a time (one reader call per shard, not per sample: ~8% of a sample's CPU at 224 px) and
    handed out in the plan's order. Local payloads are views of the mapped shard: holding a chunk copies
    nothing."""
    shard_ids = context.columns.shard_ids
    for first in range(0, len(rows), POSITIONS_CHUNK):
        chunk = rows[first:first + POSITIONS_CHUNK]
        order = np.argsort(shard_ids[chunk], kind="stable")
        by_shard = chunk[order]
        shards = shard_ids[by_shard]
        bounds = np.r_[0, np.flatnonzero(shards[1:] != shards[:-1]) + 1, len(by_shard)].tolist()
        out = [None] * len(chunk)
        for start, stop in zip(bounds[:-1], bounds[1:]):
            for position, sample in zip(order[start:stop].tolist(),
                                        _shard_samples(context, by_shard[start:stop], "read_positions")):
                out[position] = sample
        yield from out


def _shard_samples(context, rows, reader: str):
    """Raw samples of `rows` of one shard, read by its format's `reader` ("read_run" or "read_positions")."""
    source, columns = context.source, context.columns
    name = columns.shard(rows[0])
    worker_shards.reading(int(columns.shard_ids[rows[0]]))
    location = source.locate(name)
    read = getattr(source.shard_format or format_for_location(location), reader)
    # use_bbox_info: the box from the index when it has the column, else from each sample's json member
    how = RowReading(source.label_offset, source.payload, context.verify,
                     with_info=context.use_bbox_info and not columns.has_boxes)
    cache = source.cache
    if cache is not None and cache.covers(name, location):  # from the cache, or while filling it (a failed check
        return cache.read_rows(name, ShardBytes(location),  # of a cached sample drops the entry: read_rows)
                               lambda served, first: _checked(context, name, read(served, columns, rows[first:], how)))
    return _checked(context, name, read(ShardBytes(location), columns, rows, how))


def _checked(context, name, reads):
    """Raw sample tuples of a reader's RowReads: each payload's CRC32C checked against the index (verify),
    its kind looked up once per extension, its box attached (use_bbox_info)."""
    columns, verify, boxes = context.columns, context.verify, context.use_bbox_info
    checksums = columns.checksums if verify and columns.has_checksums else None
    known = columns.checksum_known
    kinds = {}  # extension -> payload kind name (the registry's answer, looked up once a shard)
    for row, ext, payload, label, info, error in reads:
        if error is not None:
            yield row, name, label, None, None, error
            continue
        kind = kinds.get(ext)
        if kind is None:
            kind = kinds[ext] = get_payload(ext).name
        if checksums is not None and (known is None or known[row]):
            error = crc32c_problem(checksums[row], payload)
        if boxes and error is None:
            payload = Boxed(payload, _usable_bbox(columns.box(row)) if columns.has_boxes else _bbox_of(info))
        yield row, name, label, payload, kind, error


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


# The kind was named "webdataset" until 2026-11-28, and resume states (imagenet_shards/loader/plan/resume.py)
# carry a fingerprint hashed over that name: it stays in the hash, so those states still load.
FINGERPRINT_NAME = "webdataset"


def _fingerprint(source):
    digest = fingerprint_start(FINGERPRINT_NAME, source)
    digest.update(np.ascontiguousarray(source.columns.key_offsets, dtype=np.int64).tobytes())
    digest.update(source.columns.keys.tobytes())
    return digest


SHARDS = SourceKind("shards", _raw_samples, key=_key, labels=_labels, epoch_sequence=_epoch_sequence,
                    fingerprint=_fingerprint, bboxes=True, indexed=True, former_names=("webdataset",),
                    resolve=resolve_named, resolve_loose=resolve_loose)
