"""Datasets made by the reference harness (Graphcore's PyTorch CNN tooling): recognise, check, adopt.

Its layout, in the dataset folder:

    <split>-000000.tar ...   shards; one sample = members sorted by extension:
                               img:    <key>.cls <key>.jpg <key>.json
                               tensor: <key>.cls <key>.json <key>.pth   (torch.save of a CHW uint8 tensor)
                             .cls is ASCII decimal; .json is {"bbox": [x1, y1, x2, y2]} or {"bbox": null}
    metadata.json            train_length, validation_length, format (img|tensor), shuffle,
                             train_transform_pipeline, validation_transform_pipeline, seed,
                             image_quality, checksum
    distributed/<N>-instances/<split>-<i>.tar   its repartitions

`checksum` is checksumdir's md5 dirhash of the folder with every file named metadata.json
left out (imagenet_shards.reference.checksum describes the algorithm). File names never enter
it, so it can say that something changed, never which file: the shard walk below names what
it can (structure, members, counts), and `adopt` records per-shard and per-sample hashes that
name the rest from then on.

`check_reference_dataset` reads every file once: the md5 for the dirhash, and for shards the
sha256 and the tar walk from the same bytes. `adopt` writes this project's sample indexes and
metadata.json (this project's schema, the reference keys kept, `checksum` recomputed over the
new side files so the reference validator still says "Dataset OK.") without changing a shard
byte. `scan_unadopted` is the loader's in-memory view of a dataset that was not adopted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from imagenet_shards.fileio import hash_file
from imagenet_shards.dataset_folder import DISTRIBUTED_DIR
from imagenet_shards.formats.tar import BLOCK, TarFormatError, iter_tar_members, split_key
from imagenet_shards.index import (FORMAT_VERSION, SampleRecord, ShardRecord, bbox_text, payload_crc32c, sample_index_name,
                            write_metadata, write_sample_index)
from imagenet_shards.dataset_folder import METADATA_FILE, SPLITS
from imagenet_shards.errors import DatasetError
from imagenet_shards.reference.checksum import list_files, reference_checksum
from imagenet_shards.reference.harness_metadata import (
    REFERENCE_KEYS,
    REFERENCE_PAYLOAD,
    read_reference_metadata,
    reference_metadata_problems,
)
from imagenet_shards.reference.pth import pth_problem

SHARD_NAME = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<number>\d{6})\.tar$")
NOTICE = ("{root}: a dataset made by the reference harness (Graphcore's create_webdataset.py): read by scanning "
          "its tar headers; `validate_dataset.py --adopt {root}` indexes it once for checked, faster reads")


def split_shard_names(names, split: str):
    """(shard names of `split` in number order, other names that start with the split name).

    The reference loader takes every name starting with the split name as a shard and reads
    the numbers between the first and the last: the others break it."""
    shards, others = [], []
    for name in names:
        match = SHARD_NAME.match(name)
        if match and match["split"] == split:
            shards.append((int(match["number"]), name))
        elif name.startswith(split):
            others.append(name)
    return [name for _, name in sorted(shards)], sorted(others)


def is_reference_repartition(folder) -> bool:
    """A distributed/<N>-instances folder in the reference harness's layout: <split>-<i>.tar only."""
    names = os.listdir(folder)
    return bool(names) and all(SHARD_NAME.match(name) for name in names)


# ------------------------------------------------------------------------------- one shard


@dataclass
class ShardScan:
    name: str
    split: str
    bytes: int = 0
    md5: str = ""
    sha256: str = ""
    records: list = field(default_factory=list)  # SampleRecords (payload sha256 filled)
    problems: list = field(default_factory=list)  # (key or None, problem)
    decoded: int = 0


def _bbox_problem(info) -> Optional[str]:
    if not isinstance(info, dict) or "bbox" not in info:
        return "the .json member has no 'bbox' key"
    bbox = info["bbox"]
    if bbox is None:
        return None
    if (not isinstance(bbox, list) or len(bbox) != 4
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox)):
        return f"bbox {bbox!r} is neither null nor 4 numbers [x1, y1, x2, y2]"
    return None


def decode_reference_payload(ext: str, data) -> Optional[str]:
    """Why a reference payload does not decode, or None."""
    if ext == "pth":
        return pth_problem(data)
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(bytes(data))) as image:
            image.load()
    except Exception as error:  # PIL raises many types for corrupt data
        return f"image does not decode: {type(error).__name__}: {error}"
    return None


def scan_reference_shard(path, name: str, split: str, fmt: str, deep: bool = False, data: bytes = None) -> ShardScan:
    """Hash (md5, sha256) and walk one reference shard from a single read; check every sample's
    members (exactly .cls, .json and the format's payload), label and bbox; with `deep` decode it."""
    scan = ShardScan(name, split)
    if data is None:
        data = Path(path).read_bytes()
    scan.bytes = len(data)
    scan.md5 = hashlib.md5(data).hexdigest()
    scan.sha256 = hashlib.sha256(data).hexdigest()
    payload_ext = REFERENCE_PAYLOAD[fmt]
    expected = sorted({"cls", "json", payload_ext})
    samples = {}  # key -> [start, end, {ext: member}]
    order = []
    sample_end = 0
    try:
        for member in iter_tar_members(name, buffer=data):
            key, ext = split_key(member.name)
            end = member.data_offset + len(member.data) + (-len(member.data) % BLOCK)
            if key not in samples:
                if order:
                    sample_end = samples[order[-1]][1]
                samples[key] = [sample_end, end, {}]
                order.append(key)
            elif key != order[-1]:
                scan.problems.append((key, f"members of {key!r} are not together (found again at byte "
                                           f"{member.header_offset})"))
                continue
            entry = samples[key]
            entry[1] = end
            if ext in entry[2]:
                scan.problems.append((key, f"member {member.name!r} appears twice"))
            entry[2][ext] = member
    except TarFormatError as error:
        scan.problems.append((None, f"not a valid tar: {error.problem} (at byte {error.offset})"))
    for key in order:
        start, end, members = samples[key]
        exts = list(members)
        if sorted(exts) != expected:
            scan.problems.append((key, f"members .{', .'.join(exts)}; a reference {fmt} sample holds "
                                       f".{', .'.join(expected)}"))
        elif exts != expected:
            scan.problems.append((key, f"members in the order .{', .'.join(exts)}, not sorted by extension"))
        label = -1
        if "cls" in members:
            text = bytes(members["cls"].data).strip()
            if text.isdigit():
                label = int(text)
            else:
                scan.problems.append((key, f".cls {text[:20]!r} is not a decimal class index"))
        bbox = ""  # none found: a missing or bad json is an error of its own, and adopt refuses the dataset
        if "json" in members:
            try:
                info = json.loads(bytes(members["json"].data))
                problem = _bbox_problem(info)
            except ValueError as error:
                problem = f"the .json member is not valid JSON: {error}"
            if problem:
                scan.problems.append((key, problem))
            else:
                bbox = bbox_text(info["bbox"])  # adopted: the index carries it, the loader reads no json
        payload = members.get(payload_ext)
        if payload is None:
            continue
        if deep:
            problem = decode_reference_payload(payload_ext, payload.data)
            scan.decoded += 1
            if problem:
                scan.problems.append((key, problem))
        offsets = ";".join(f"{ext}:{member.header_offset}" for ext, member in members.items())
        scan.records.append(SampleRecord(key, name, label, start, end - start, payload.data_offset, len(payload.data),
                                         payload_crc32c(payload.data), offsets, bbox=bbox))
    return scan


# ------------------------------------------------------------------------------- the whole dataset


@dataclass
class ReferenceCheck:
    root: str
    metadata: dict
    fmt: str
    shards: dict = field(default_factory=dict)  # split -> [ShardScan] in number order
    file_md5: dict = field(default_factory=dict)  # relative path -> md5 of every file the dirhash covers
    checksum: str = ""  # the dirhash found
    checksum_outside_distributed: str = ""
    problems: list = field(default_factory=list)  # (severity, file, key, problem)
    notes: list = field(default_factory=list)
    bytes_read: int = 0

    @property
    def errors(self):
        return [p for p in self.problems if p[0] == "error"]


def check_reference_dataset(root, deep: bool = False, progress=None) -> ReferenceCheck:
    """Check a reference dataset: its metadata, its folder checksum and every shard (one read per file).

    `progress(total_bytes, description)` may return a tqdm-like object. Problems are
    (severity, file relative to root, key or None, problem)."""
    root = Path(root)
    metadata = json.loads((root / METADATA_FILE).read_bytes())
    check = ReferenceCheck(str(root), metadata, metadata.get("format"))
    for problem in reference_metadata_problems(metadata):
        check.problems.append(("error", METADATA_FILE, None, problem))
    if check.fmt not in REFERENCE_PAYLOAD:
        return check
    files, broken, unreadable = list_files(root)
    for path, reason in broken + unreadable:
        check.problems.append(("error", path, None, f"cannot be read ({reason}): the folder checksum cannot match"))
    shard_split = _find_shards(check, sorted(path for path, _ in files if os.sep not in path))
    _read_files(check, root, files, shard_split, deep, progress)
    _check_folder_checksum(check)
    _check_split_samples(check)
    if not deep:
        check.notes.append("payloads were not decoded (--deep decodes every image or tensor)")
    return check


def _find_shards(check: ReferenceCheck, top) -> dict:
    """{shard name: split} of the top-level files `top`; names the reference loader would take for a shard
    but cannot read, and gaps in a split's shard numbers, are errors."""
    shard_split = {}
    for split in SPLITS:
        names, others = split_shard_names(top, split)
        for name in names:
            shard_split[name] = split
        for name in others:
            check.problems.append(("error", name, None, f"starts with the split name {split!r} but is not a "
                                                        f"{split}-NNNNNN.tar shard: the reference loader takes it for "
                                                        f"a shard and fails"))
        numbers = [int(SHARD_NAME.match(n)["number"]) for n in names]
        if numbers and numbers != list(range(numbers[0], numbers[-1] + 1)):
            missing = sorted(set(range(numbers[0], numbers[-1] + 1)) - set(numbers))
            check.problems.append(("error", f"{split}-{missing[0]:06d}.tar", None,
                                   f"missing: {split} shards run from {numbers[0]} to {numbers[-1]} with "
                                   f"{len(missing)} gap(s)"))
        check.shards[split] = []
    return shard_split


def _read_files(check: ReferenceCheck, root: Path, files, shard_split, deep, progress):
    """Read every file the folder checksum covers once: its md5, and for a shard also the walk
    (scan_reference_shard) from the same bytes."""
    bar = progress(sum(size for _, size in files), "files") if progress else None
    try:
        for path, size in files:
            if os.path.basename(path) == METADATA_FILE:
                continue
            full = root / path
            try:
                if path in shard_split:
                    data = full.read_bytes()
                    scan = scan_reference_shard(full, path, shard_split[path], check.fmt, deep, data)
                    check.shards[scan.split].append(scan)
                    md5 = scan.md5
                    for key, problem in scan.problems:
                        check.problems.append(("error", path, key, problem))
                else:
                    md5 = hash_file(full, ("md5",))[0][0]
            except OSError as error:
                check.problems.append(("error", path, None, f"cannot read: {error.strerror or error}"))
                continue
            check.file_md5[path] = md5
            check.bytes_read += size
            if bar is not None:
                bar.update(size)
    finally:
        if bar is not None:
            bar.close()


def _check_folder_checksum(check: ReferenceCheck):
    """The dirhash of the files read against metadata.json's `checksum` (a match without distributed/ is a note)."""
    check.checksum = reference_checksum(check.file_md5.values())
    check.checksum_outside_distributed = reference_checksum(
        md5 for path, md5 in check.file_md5.items() if not path.startswith(DISTRIBUTED_DIR + os.sep))
    expected = check.metadata.get("checksum")
    if check.checksum == expected:
        pass
    elif check.checksum_outside_distributed == expected:
        check.notes.append(f"the folder checksum matches without {DISTRIBUTED_DIR}/, which was added after "
                           f"metadata.json was written (the reference validate_dataset.py counts it and says "
                           f"corrupted)")
    elif isinstance(expected, str):
        check.problems.append(("error", "", None,
                               f"folder checksum (md5 dirhash) is {check.checksum}, metadata.json says {expected}: "
                               f"a file was added, removed or changed; a folder checksum cannot name the file "
                               f"(problems named here come from the shard walk; `--adopt` on an intact copy "
                               f"records per-shard and per-sample hashes that can)"))


def _check_split_samples(check: ReferenceCheck):
    """Each split's sample count against metadata.json's <split>_length, and its keys unique."""
    metadata = check.metadata
    for split in SPLITS:
        found = sum(len(scan.records) for scan in check.shards.get(split, []))
        expected_count = metadata.get(f"{split}_length")
        if isinstance(expected_count, int) and found != expected_count:
            check.problems.append(("error", "", None, f"{split}: {found} samples in {len(check.shards[split])} "
                                                      f"shards, metadata.json says {split}_length={expected_count}"))
        keys = {}
        for scan in check.shards.get(split, []):
            for record in scan.records:
                if record.key in keys:
                    check.problems.append(("error", scan.name, record.key,
                                           f"key also in {keys[record.key]} (keys must be unique in {split})"))
                keys.setdefault(record.key, scan.name)


# ------------------------------------------------------------------------------- adoption


def scan_reference_split(root, split: str, scan_shard) -> list:
    """The SampleRecords of one split of a reference dataset, from its tar headers (no payload
    hashes): what the loader reads a dataset that was not adopted by. `scan_shard(path, name)`
    is the loader's header scan (imagenet_shards.loader.read.shard_reader.scan_shard), passed in: the
    loader sits above this package."""
    root = Path(root)
    names, _ = split_shard_names(sorted(os.listdir(root)), split)
    records = []
    for name in names:
        records += scan_shard(str(root / name), name)
    return records


@dataclass
class UnadoptedSplit:
    """What the loader needs of one split of a dataset not adopted (loader.source_kinds.resolve_source)."""

    records: list  # SampleRecords in shard order, from the tar headers
    payload_ext: str
    description: str
    notice: str  # the warning the loader gives: scanned, adopt it for checked, faster reads


def scan_unadopted(base: str, split: str, metadata: dict, metadata_location: str, remote: bool,
                   scan_shard) -> UnadoptedSplit:
    """One split of a reference dataset read the loader's way, or a DatasetError naming the
    folder (or metadata.json) and the problem. `remote`: `base` is a URL (no listing there)."""
    fmt = metadata.get("format")
    if fmt not in REFERENCE_PAYLOAD:
        raise DatasetError(f"{metadata_location}: format {fmt!r} is not a reference format "
                           f"({', '.join(REFERENCE_PAYLOAD)})")
    if remote:
        raise DatasetError(f"{base}: a dataset made by the reference harness is read from a local folder (no listing "
                           f"over http); adopt it (validate_dataset.py --adopt) to serve it")
    try:
        records = scan_reference_split(base, split, scan_shard)
    except (OSError, TarFormatError) as error:
        raise DatasetError(f"{base}: {error}") from None
    if not records:
        raise DatasetError(f"{base}: a dataset made by the reference harness with no {split}-NNNNNN.tar shards")
    shards = len({record.shard for record in records})
    return UnadoptedSplit(records, REFERENCE_PAYLOAD[fmt], f"{base} (reference harness {fmt}, {split}: "
                                                          f"{len(records)} samples in {shards} shards, scanned)",
                          NOTICE.format(root=base.rstrip("/")))


def unadopted_shards(root):
    """(format, root, {split: shard paths in number order}, {split: mean bytes per sample},
    {split: samples metadata.json counts}, metadata) of a reference dataset not adopted, or None
    for any other folder: the host benchmark's view (shards by name, counts from its metadata)."""
    reference = read_reference_metadata(root)
    if reference is None:
        return None
    shards, per_image, samples = {}, {}, {}
    for split in ("train", "validation"):
        names, _ = split_shard_names(sorted(p.name for p in Path(root).iterdir()), split)
        shards[split] = [Path(root) / name for name in names]
        samples[split] = int(reference.get(f"{split}_length") or 0)
        total = sum(path.stat().st_size for path in shards[split])
        per_image[split] = total / samples[split] if samples[split] else 0.0
    return str(reference["format"]), Path(root), shards, per_image, samples, reference


def adopted_metadata(check: ReferenceCheck, split_entries: dict) -> dict:
    """This project's metadata for a checked reference dataset, the reference keys kept."""
    metadata = {key: check.metadata[key] for key in REFERENCE_KEYS if key in check.metadata}
    labels = [r.label for scans in check.shards.values() for scan in scans for r in scan.records]
    metadata.update({
        "format_version": FORMAT_VERSION,
        "adopted_from": "reference harness (Graphcore create_webdataset.py layout)",
        "reference_checksum": check.metadata.get("checksum"),
        # The reference stores no class names: the table is the class indices it uses.
        "classes": [str(n) for n in range(max(labels, default=-1) + 1)],
        "tensor_layout": "CHW" if check.fmt == "tensor" else None,
        "payload_extension": REFERENCE_PAYLOAD[check.fmt],
        "splits": split_entries,
    })
    return metadata


def adopt(root, check: ReferenceCheck) -> list:
    """Write this project's sample indexes and metadata.json beside the shards of a checked,
    intact reference dataset; no shard byte changes. Returns the files written.

    The new metadata.json's `checksum` is the dirhash with the indexes included (from the md5s
    already computed: no second read), so the reference validator still accepts the folder."""
    if check.errors:
        raise DatasetError(f"{root}: not adopted: the dataset has {len(check.errors)} error(s); "
                           f"adopt an intact copy")
    root = Path(root)
    split_entries, written, md5s = {}, [], dict(check.file_md5)
    for split, scans in check.shards.items():
        if not scans and not check.metadata.get(f"{split}_length"):
            continue
        records = [record for scan in scans for record in scan.records]
        name = sample_index_name(split)
        index = write_sample_index(root / name, records)
        written.append(name)
        md5s[name] = index["md5"]
        split_entries[split] = {
            "length": len(records),
            "source_samples": len(records),
            "skipped": [],
            "shards": [ShardRecord(s.name, len(s.records), s.bytes, s.sha256, s.md5).to_json() for s in scans],
            "index": index,
        }
    metadata = adopted_metadata(check, split_entries)
    metadata["checksum"] = reference_checksum(md5s.values())
    write_metadata(root, metadata)
    written.append(METADATA_FILE)
    return written
