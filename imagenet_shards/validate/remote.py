"""Validate a converted dataset stored under `s3://BUCKET/PREFIX`.

Default (full): the prefix is listed, every object is streamed once (one GET each) into a local
staging folder that mirrors it, and that folder is checked exactly as a local dataset is
(imagenet_shards.validate.converted.validate_converted: sizes, sha256, tar/TFRecord structure, every sample against the
index, repartitions); missing and extra objects come out of the same check, since the staging
folder holds exactly what the listing holds. Problems name files relative to the prefix. The
staging folder is deleted afterwards; it needs as much free space as the dataset (`staging`
chooses where; default: the system's temporary folder).

`quick`: no object body is read. The listing gives missing and extra objects and sizes; a HEAD
per file gives the checksum the server stored at upload, compared with the sha256 metadata.json
records (shards, indexes). Samples, structure and repartition contents are not checked, and the
report says so.

Infrastructure failures (StorageUnavailable) propagate: validate_dataset.py exits 2.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Optional

from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.storage import head_object, join_location, list_objects, open_byte_range, sha256_base64
from imagenet_shards.formats import get_format
from imagenet_shards.formats.shard_check import error, warning
from imagenet_shards.validate.converted import check_metadata_digest, validate_converted
from imagenet_shards.validate.report import Report, ValidationUsageError
from imagenet_shards.safe_names import UnsafeNameError, plain_name, redact, relative_name

CHUNK = 1 << 20


def validate_s3(location: str, workers: int = 1, deep: bool = False, quick: bool = False, progress=None,
                staging: Optional[str] = None) -> Report:
    location = location.rstrip("/")
    objects = list_objects(location)
    unsafe = _unsafe_keys(location, objects)
    if unsafe:
        report = Report(redact(location), "converted")
        report.problems.extend(unsafe)
        report.verdicts["Dataset"] = False
        return report
    if METADATA_FILE not in objects:
        if not objects:
            raise ValidationUsageError(f"{location}: no objects under this prefix (not a dataset)")
        report = Report(location, "converted")
        report.problems.append(error(METADATA_FILE, f"missing, but the prefix holds {len(objects)} objects: an upload "
                                                    f"that did not finish (metadata.json goes last); "
                                                    f"upload_dataset.py --resume finishes it"))
        report.verdicts["Dataset"] = False
        return report
    if quick:
        return _quick(location, objects)
    return _full(location, objects, workers, deep, progress, staging)


def _unsafe_keys(location, objects) -> list:
    """An error per listed key that is not plain names joined by `/` (`..`, `//`, an absolute path): such a key
    would be written outside the staging folder, so nothing is fetched (imagenet_shards.safe_names)."""
    problems = []
    for name in sorted(objects):
        try:
            relative_name(name, location)
        except UnsafeNameError as problem:
            problems.append(error(repr(name), f"{problem}: not fetched, the prefix is not validated"))
    return problems


def _full(location, objects, workers, deep, progress, staging) -> Report:
    began = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="validate-s3-", dir=staging))
    try:
        bar = progress(sum(size for size, _ in objects.values()), f"fetch {location}") if progress else None
        for name in sorted(objects):
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with open_byte_range(join_location(location, name), 0, None) as stream, open(target, "wb") as out:
                while chunk := stream.read(CHUNK):
                    out.write(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
        if bar is not None:
            bar.close()
        fetched = time.perf_counter() - began
        report = validate_converted(folder, workers, deep, progress)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report.path = location
    report.notes.append(f"{len(objects)} objects listed under {location} and streamed once each "
                        f"({sum(s for s, _ in objects.values()) / 1e6:,.1f} MB in {fetched:.1f} s), then checked "
                        f"as a local dataset")
    return report


def _quick(location, objects) -> Report:
    report = Report(location, "converted")
    report.notes.append("--quick: object sizes and the checksums the server stored at upload only; shard contents, "
                        "samples and repartitions were NOT read (run without --quick for that)")
    with open_byte_range(join_location(location, METADATA_FILE), 0, None) as stream:
        metadata_bytes = stream.read()
    check_metadata_digest(metadata_bytes, report.problems, report.notes)
    try:
        metadata = json.loads(metadata_bytes)
        expected, companions = {}, set()
        shard_format = get_format(metadata.get("format"))
        for split, entry in metadata["splits"].items():
            plain_name(split, METADATA_FILE)
            for shard in entry["shards"]:
                plain_name(shard["name"], METADATA_FILE)
                expected[shard["name"]] = (int(shard["bytes"]), shard["sha256"])
                companions.update(shard_format.companions(shard["name"]))
            index = entry.get("index") or {}
            if index.get("name"):
                plain_name(index["name"], METADATA_FILE)
                expected[index["name"]] = (int(index["bytes"]), index.get("sha256"))
    except (ValueError, KeyError, TypeError) as problem:
        report.problems.append(error(METADATA_FILE, f"not a valid metadata.json: {problem}"))
        report.verdicts["Dataset"] = False
        return report
    checked = 0
    for name, (size, sha256) in sorted(expected.items()):
        if name not in objects:
            report.problems.append(error(name, "missing: metadata.json lists it, the prefix has no such object"))
            continue
        if objects[name][0] != size:
            report.problems.append(error(name, f"{objects[name][0]} bytes stored, metadata.json records {size}"))
            continue
        head = head_object(join_location(location, name)) or {}
        stored = head.get("ChecksumSHA256")
        checked += 1
        if not stored:
            report.problems.append(warning(name, "the server keeps no SHA256 checksum for it: size checked only"))
        elif sha256 and stored != sha256_base64(sha256):
            report.problems.append(error(name, "the SHA256 the server stored differs from metadata.json's"))
    for name in sorted(companions - set(objects)):
        report.problems.append(warning(name, "missing (a companion file of a shard, e.g. its index)"))
    for name in sorted(set(objects) - set(expected) - companions - {METADATA_FILE}):
        if not name.startswith("distributed/"):
            report.problems.append(warning(name, "extra object not listed in metadata.json (loaders ignore it)"))
    report.verdicts["Dataset"] = not report.errors
    report.stats.update({"shards_checked": checked, "samples_checked": 0,
                         "bytes_checked": 0, "seconds": 0.0, "workers": 1})
    return report
