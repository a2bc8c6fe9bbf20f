"""The shard kind's `resolve` hooks: what names shards becomes a Source with ShardSettings.

    converted dataset   a directory or http(s) base URL holding metadata.json and its sample indexes
                        (made by create_webdataset.py); a repartition for the instance count
                        (distributed/<N>-instances/manifest.json) is used when present.
    TFRecord shards     a folder (or list) of TF-slim shards without metadata: indexed from their record
                        headers (or .tfindex files), the label offset given or detected, never silent.
    shard list          paths, URLs or brace patterns of tar shards: the folder's metadata and index where
                        they cover them, else each shard's headers scanned once (a warning says so).

`resolve_named` runs before the other kinds' hooks (a list, a URL, a file, a folder with metadata.json);
`resolve_loose` after them (a folder holding only shards: .tar files or a format's own).
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
from imagenet_shards.formats import (FORMATS, ForeignShardsError, UnknownFormatError, format_claiming, get_format,
                                     payload_extension_of)
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

log = logging.getLogger(__name__)
KIND = "shards"  # the shard kind's name (source_kinds/shards.py registers it as SHARDS)


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


