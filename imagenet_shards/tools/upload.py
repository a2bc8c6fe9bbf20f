"""Upload a converted dataset (repartitions included) to `s3://BUCKET/PREFIX`, verified.

Contract:
  * every file is one PUT carrying `ChecksumSHA256`: for shards the sha256 recorded in
    metadata.json at conversion (so a shard damaged on the local disk since is refused too),
    for other files the sha256 of their bytes. The server recomputes it and rejects bytes
    corrupted in transit; such a file is sent once more, then reported.
  * each upload is then checked with HEAD: the size, and the stored SHA256 checksum where the
    server returns it, else ETag = md5 of the bytes (single-part uploads only: no multipart ETags).
  * order: shards and indexes, then repartition manifests, then metadata.json last: a reader that
    finds metadata.json finds a complete dataset (the local commit marker is kept remotely).
  * an existing dataset under the prefix (any object) is refused unless `resume` (skip objects
    whose size and checksum already match; upload the rest) or `overwrite` (metadata.json is
    deleted first, everything uploaded, objects the local dataset does not have deleted, then
    metadata.json).
Infrastructure failures (StorageUnavailable) stop the upload; a file that cannot be stored is
counted and reported, and metadata.json is then not uploaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from imagenet_shards.dataset_folder import DISTRIBUTED_DIR, REPARTITION_MANIFEST
from imagenet_shards.fileio import PARTIAL_SUFFIX
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.storage import (
    ChecksumMismatchError,
    delete_object,
    head_object,
    is_s3,
    join_location,
    list_objects,
    put_object,
    sha256_base64,
    split_s3,
)

CHUNK = 1 << 20
log = logging.getLogger(__name__)


class UploadError(DatasetError):
    """An upload that cannot start (bad arguments, an existing dataset, not a converted dataset)."""


@dataclass
class LocalFile:
    name: str  # relative to the dataset root, '/'-separated: the object key under the prefix
    path: Path
    size: int
    sha256: str  # hex
    from_metadata: bool  # the sha256 is the one recorded at conversion
    md5: Optional[str] = None  # hex, when metadata.json records it (else computed when an ETag must be checked)


@dataclass
class UploadReport:
    target: str
    uploaded: list = field(default_factory=list)
    skipped: list = field(default_factory=list)  # --resume: already there and matching
    deleted: list = field(default_factory=list)  # --overwrite: objects the local dataset does not have
    failed: list = field(default_factory=list)  # (name, reason)
    retried: list = field(default_factory=list)  # names sent twice after a checksum rejection
    bytes_uploaded: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def mb_per_second(self) -> float:
        return self.bytes_uploaded / 1e6 / self.seconds if self.seconds else 0.0


def _hash_file(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def local_files(root: Path) -> list:
    """Every file of the dataset in upload order (metadata.json last, manifests just before it)."""
    root = Path(root)
    metadata_path = root / METADATA_FILE
    if not metadata_path.is_file():
        raise UploadError(f"{root}: not a converted dataset ({METADATA_FILE} is missing: incomplete or not converted)")
    try:
        metadata = json.loads(metadata_path.read_bytes())
    except ValueError as error:
        raise UploadError(f"{metadata_path}: not valid JSON: {error}") from None
    recorded = {}
    for entry in metadata.get("splits", {}).values():
        for shard in entry.get("shards", []):
            recorded[shard["name"]] = (int(shard["bytes"]), shard["sha256"], shard.get("md5"))
        index = entry.get("index") or {}
        if index.get("name") and index.get("sha256"):
            recorded[index["name"]] = (int(index["bytes"]), index["sha256"], index.get("md5"))
    files = []
    known = _known_names(metadata, recorded)
    for path in _regular_files(root):
        name = path.relative_to(root).as_posix()
        if name.endswith(PARTIAL_SUFFIX) or any(part.startswith(".") for part in name.split("/")):
            continue  # a write in progress, or a hidden file: not part of the dataset
        if not _known(name, known):
            log.warning("%s: not uploaded: metadata.json does not name it and it is no known companion "
                        "(index, .tfindex, repartition)", path)
            continue
        size = path.stat().st_size
        if name in recorded:
            if recorded[name][0] != size:
                raise UploadError(f"{path}: {size} bytes, metadata.json records {recorded[name][0]}: the local "
                                  f"dataset is damaged; run validate_dataset.py on it")
            files.append(LocalFile(name, path, size, recorded[name][1], True, recorded[name][2]))
        else:
            files.append(LocalFile(name, path, size, _hash_file(path, "sha256"), False))

    def order(item: LocalFile):
        if item.name == METADATA_FILE:
            return 2
        return 1 if item.name.rsplit("/", 1)[-1] == REPARTITION_MANIFEST else 0

    files.sort(key=order)  # stable: sorted names within each group
    return files


def _regular_files(root: Path) -> list:
    """Every regular file under `root`, sorted; links (to files or folders) are never followed nor sent."""
    found = []
    for folder, folders, names in os.walk(root, followlinks=False):
        links = [n for n in folders if os.path.islink(os.path.join(folder, n))]
        folders[:] = [n for n in folders if n not in links]
        for name in names + links:
            path = Path(folder) / name
            if path.is_symlink():
                log.warning("%s: a link: not uploaded (an upload never follows one)", path)
            elif path.is_file():
                found.append(path)
    return sorted(found)


def _known_names(metadata: dict, recorded: dict) -> set:
    """What metadata.json names (shards, indexes) and the shards' companions (a format's side files)."""
    from imagenet_shards.formats import FORMATS

    known = {METADATA_FILE, *recorded}
    shard_format = FORMATS.get(metadata.get("format"))
    for entry in metadata.get("splits", {}).values():
        for shard in entry.get("shards", []):
            known.update(shard_format.companions(shard["name"]) if shard_format is not None else ())
    return known


def _known(name: str, known: set) -> bool:
    """A file to send: named by metadata.json or a companion, inside a shard that is a folder (LMDB), or a
    repartition's file (distributed/, checked by its manifest)."""
    return name in known or name.split("/", 1)[0] in known or name.startswith(DISTRIBUTED_DIR + "/")


def object_matches(head: Optional[dict], item: LocalFile) -> tuple:
    """(matches, why not) for an object's HEAD answer against the local file."""
    if head is None:
        return False, "missing"
    if int(head.get("ContentLength", -1)) != item.size:
        return False, f"{head.get('ContentLength')} bytes stored, {item.size} expected"
    stored = head.get("ChecksumSHA256")
    if stored and "-" not in stored:
        if stored != sha256_base64(item.sha256):
            return False, "the stored SHA256 checksum differs"
        return True, ""
    etag = str(head.get("ETag", "")).strip('"')
    if "-" in etag:
        return False, "a multipart ETag and no stored checksum: cannot verify"
    if etag != (item.md5 or _hash_file(item.path, "md5")):
        return False, "the ETag (md5) differs"
    return True, ""


class _Progress:
    """A file-like body that counts bytes read into a tqdm bar (MB/s)."""

    def __init__(self, handle, bar, lock):
        self.handle, self.bar, self.lock = handle, bar, lock

    def read(self, size=-1):
        data = self.handle.read(size)
        if self.bar is not None and data:
            with self.lock:
                self.bar.update(len(data))
        return data

    def seek(self, *args):
        return self.handle.seek(*args)

    def tell(self):
        return self.handle.tell()


def upload_dataset(local, target: str, workers: int = 4, resume: bool = False, overwrite: bool = False,
                   progress: bool = True) -> UploadReport:
    """Upload the converted dataset at `local` under `target` (s3://BUCKET/PREFIX); see the module
    docstring. Raises UploadError (cannot start) or StorageUnavailable (the store failed)."""
    if not is_s3(target):
        raise UploadError(f"{target}: the target must be s3://BUCKET/PREFIX")
    if resume and overwrite:
        raise UploadError("--resume and --overwrite exclude each other")
    if workers < 1:
        raise UploadError(f"--workers must be >= 1, got {workers}")
    split_s3(target)
    target = target.rstrip("/")
    files = local_files(Path(local))
    existing = list_objects(target)
    if existing and not (resume or overwrite):
        marker = "a complete dataset" if METADATA_FILE in existing else f"{len(existing)} objects (an incomplete upload?)"
        raise UploadError(f"{target}: already holds {marker}; use --resume to upload only what is missing "
                          f"or --overwrite to replace it")
    report = UploadReport(target)
    if overwrite and METADATA_FILE in existing:
        delete_object(join_location(target, METADATA_FILE))  # the dataset is incomplete from here on

    todo = []
    for item in files:
        if resume and item.name in existing:
            matches, _ = object_matches(head_object(join_location(target, item.name)), item)
            if matches:
                report.skipped.append(item.name)
                continue
        todo.append(item)

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(i.size for i in todo), unit="B", unit_scale=True, unit_divisor=1000,
                   desc=f"upload to {target}", mininterval=0.5)
    lock = threading.Lock()
    began = time.perf_counter()
    try:
        body_files = [i for i in todo if i.name != METADATA_FILE]
        # Manifests after the files they name, so they go in a second wave.
        waves = [[i for i in body_files if not i.name.endswith(REPARTITION_MANIFEST)],
                 [i for i in body_files if i.name.endswith(REPARTITION_MANIFEST)]]
        with ThreadPoolExecutor(max_workers=workers) as pool:
            for wave in waves:
                for item, reason in zip(wave, pool.map(lambda i: _upload_one(target, i, report, bar, lock), wave)):
                    if reason:
                        report.failed.append((item.name, reason))
                    else:
                        report.uploaded.append(item.name)
                        report.bytes_uploaded += item.size
        if overwrite:
            wanted = {i.name for i in files}
            for name in sorted(set(existing) - wanted):
                delete_object(join_location(target, name))
                report.deleted.append(name)
        metadata = next(i for i in files if i.name == METADATA_FILE)
        if metadata in todo and not report.failed:
            reason = _upload_one(target, metadata, report, bar, lock)
            if reason:
                report.failed.append((metadata.name, reason))
            else:
                report.uploaded.append(metadata.name)
                report.bytes_uploaded += metadata.size
    finally:
        report.seconds = time.perf_counter() - began
        if bar is not None:
            bar.close()
    return report


def _upload_one(target: str, item: LocalFile, report: UploadReport, bar, lock) -> Optional[str]:
    """PUT with ChecksumSHA256, then HEAD; None when stored and verified, else the reason."""
    location = join_location(target, item.name)
    for attempt in (1, 2):
        try:
            with open(item.path, "rb") as handle:
                put_object(location, _Progress(handle, bar, lock), ContentLength=item.size,
                           ChecksumSHA256=sha256_base64(item.sha256))
        except ChecksumMismatchError as error:
            if attempt == 1:
                with lock:
                    report.retried.append(item.name)
                continue
            if item.from_metadata and _hash_file(item.path, "sha256") != item.sha256:
                return (f"{item.path} no longer matches the sha256 metadata.json records for it (damaged "
                        f"on the local disk?); the server refused it")
            return f"the server rejected the bytes twice: {error}"
        except OSError as error:
            return f"cannot read {item.path}: {error.strerror or error}"
        matches, why = object_matches(head_object(location), item)
        if matches:
            return None
        return f"stored, but the HEAD check failed: {why}"
    return "unreachable"


def describe(report: UploadReport) -> str:
    lines = [f"{report.target}: {len(report.uploaded)} files uploaded ({report.bytes_uploaded / 1e6:.1f} MB in "
             f"{report.seconds:.1f} s, {report.mb_per_second:.1f} MB/s), {len(report.skipped)} already there "
             f"and matching (skipped)"]
    if report.retried:
        lines.append(f"  sent again after the server rejected their checksum: {', '.join(report.retried)}")
    if report.deleted:
        lines.append(f"  deleted (not in the local dataset): {', '.join(report.deleted)}")
    for name, reason in report.failed:
        lines.append(f"  FAILED {name}: {reason}")
    if report.failed:
        lines.append(f"  {METADATA_FILE} was not uploaded: the remote dataset is incomplete; fix the cause and "
                     f"run again with --resume")
    return "\n".join(lines)


class PublishedShardUploader:
    """Uploads a conversion's shards while it runs (create_webdataset.py --target s3://...): each
    published shard is PUT (with the sha256 the converter recorded) in the background; `finish`
    then uploads everything else with metadata.json last (`upload_dataset(resume=True)`, which
    skips the shards already stored and verified)."""

    def __init__(self, local, target: str, workers: int = 4):
        self.local, self.target = Path(local), target.rstrip("/")
        self.pool = ThreadPoolExecutor(max_workers=workers)
        self.lock = threading.Lock()
        self.pending = []
        self.report = UploadReport(self.target)

    def published(self, shard) -> None:
        """Called with a ShardRecord once its shard has its final name in the staging folder."""
        item = LocalFile(shard.name, self.local / shard.name, shard.bytes, shard.sha256, True,
                         getattr(shard, "md5", None))
        self.pending.append((item, self.pool.submit(_upload_one, self.target, item, self.report, None, self.lock)))

    def finish(self, progress: bool = False) -> UploadReport:
        self.pool.shutdown(wait=True)
        early = UploadReport(self.target)
        for item, future in self.pending:
            reason = future.result()
            if reason:
                early.failed.append((item.name, reason))
            else:
                early.uploaded.append(item.name)
                early.bytes_uploaded += item.size
        rest = upload_dataset(self.local, self.target, resume=True, progress=progress)
        rest.uploaded = early.uploaded + rest.uploaded
        rest.bytes_uploaded += early.bytes_uploaded
        rest.failed = early.failed + rest.failed
        rest.retried = self.report.retried + rest.retried
        rest.skipped = [name for name in rest.skipped if name not in set(early.uploaded)]
        return rest
