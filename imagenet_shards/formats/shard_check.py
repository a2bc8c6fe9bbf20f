"""The frame every format's shard check shares: what a problem is, how a shard is mapped and
compared with metadata, and the per-sample checks that do not depend on the container.

A format's checker (`ShardFormat.check_shard`, e.g. imagenet_shards.formats.tar_check) receives a
`ShardTask` and returns a `ShardResult`; `check_mapped_shard` maps the shard once and calls the
format's walk. Nothing here prints: imagenet_shards.validate renders the problems.
"""

from __future__ import annotations

import bisect
import hashlib
import io
import json
import mmap
import os
from dataclasses import dataclass, field
from typing import Optional

from imagenet_shards.fileio import hash_file
from imagenet_shards.formats.npy import NpyFormatError, decode_npy
from imagenet_shards.index import ShardRecord, SampleRecord, parse_bbox

ERROR = "error"
WARNING = "warning"
HASH_STEP = 1 << 20  # hash the shard in steps of at least this many bytes as the walk advances

NOT_IN_INDEX = "sample is in the shard but not in the sample index"


@dataclass(frozen=True)
class Problem:
    severity: str  # ERROR or WARNING
    file: str  # relative to the dataset root ("" for the dataset as a whole)
    key: Optional[str]  # the sample key, where there is one
    problem: str

    def to_json(self) -> dict:
        return {"severity": self.severity, "file": self.file, "key": self.key, "problem": self.problem}

    def line(self) -> str:
        where = self.file or "."
        if self.key is not None:
            where += f" [{self.key}]"
        return f"{self.severity}: {where}: {self.problem}"


def error(file, problem, key=None) -> Problem:
    return Problem(ERROR, str(file), key, problem)


def warning(file, problem, key=None) -> Problem:
    return Problem(WARNING, str(file), key, problem)



# ================================================================================ payload checks
# Container-independent: a TFRecord checker uses these too.

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
# Payload kinds defined outside the formats: extension -> check(data) returning why the payload does
# not decode, or None. imagenet_shards.reference registers "pth" (the tensors of the datasets it adopts).
PAYLOAD_CHECKS = {}


def decode_problem(ext: str, data, tensor_layout=None, require_rgb_jpeg=True) -> Optional[str]:
    """Why a payload does not decode, or None. Images: PIL verify, then a full load."""
    from PIL import Image

    if ext in IMAGE_EXTENSIONS or ext == "JPEG":
        try:
            with Image.open(io.BytesIO(data)) as image:
                image.verify()  # structure and checksums, without decoding pixels
            with Image.open(io.BytesIO(data)) as image:
                image.load()  # every pixel: catches truncated or corrupt entropy-coded data
                mode, kind = image.mode, image.format
        except Image.DecompressionBombError as exc:
            return f"image refused as a decompression bomb: {exc}"
        except Exception as exc:  # PIL raises many types for corrupt data
            return f"image does not decode: {type(exc).__name__}: {exc}"
        if require_rgb_jpeg and ext == "jpg" and (kind not in ("JPEG", "MPO") or mode != "RGB"):  # MPO: camera JPEG
            return f"payload is a {kind} image in mode {mode}, the converter stores RGB JPEG"
        return None
    if ext in PAYLOAD_CHECKS:
        return PAYLOAD_CHECKS[ext](data)
    if ext == "npy":
        try:
            array = decode_npy(data)
        except NpyFormatError as exc:
            return f"tensor does not decode: {exc}"
        if array.dtype.name != "uint8":
            return f"tensor dtype {array.dtype.name}, expected uint8"
        channel_axis = {"HWC": 2, "CHW": 0}.get(tensor_layout)
        if array.ndim != 3 or (channel_axis is not None and array.shape[channel_axis] != 3):
            return f"tensor shape {array.shape} is not {tensor_layout or 'a 3-channel image'}"
        return None
    return None


_CLASS_NAME_FIELDS = ("class_name", "wnid", "class", "synset", "class_folder")


def sample_field_problems(label_text: bytes, info_json: Optional[bytes], classes, record: Optional[SampleRecord]):
    """Problems of one sample's label and json, as strings: (label or None, [problems]).

    The label must be an integer inside the class table, equal to the index's label, and the
    class the sample's json names (if it names one) must be the class table's entry for it. An index
    that records the sample's bbox must record the json's (null or no "bbox": no box).
    """
    problems = []
    text = bytes(label_text).strip()
    try:
        label = int(text)
    except ValueError:
        return None, [f"label {text[:40]!r} is not an integer"]
    if not 0 <= label < len(classes):
        problems.append(f"label {label} is outside the class table ({len(classes)} classes: 0..{len(classes) - 1})")
    if record is not None and record.label != label:
        problems.append(f"label {label} in the shard, the index says {record.label}")
    if info_json is not None:
        try:
            info = json.loads(bytes(info_json))
        except ValueError as exc:
            problems.append(f".json member is not valid JSON: {exc}")
            info = None
        if isinstance(info, dict) and record is not None and record.bbox is not None:
            indexed, stored = parse_bbox(record.bbox), info.get("bbox")
            if indexed != stored:
                problems.append(f"bbox {indexed} in the sample index, but the sample's json says {stored}")
        if isinstance(info, dict) and 0 <= label < len(classes):
            for name in _CLASS_NAME_FIELDS:
                value = info.get(name)
                if isinstance(value, str):
                    if value != classes[label]:
                        problems.append(
                            f"label {label} is class {classes[label]!r} in the class table, "
                            f"but the sample's json says {name}={value!r}"
                        )
                    break
    return label, problems


# ================================================================================ shard checks


@dataclass(frozen=True)
class ShardTask:
    path: str  # absolute path
    name: str  # relative to the dataset root, used in messages
    format: str  # the dataset's format name (imagenet_shards.formats.get_format)
    record: Optional[ShardRecord]  # what metadata (or a repartition manifest) says about it
    samples: tuple  # SampleRecords the index places in this shard
    payload_ext: str
    classes: tuple
    hash_payloads: bool  # always compare payload sha256 (deep, remainder shards)
    deep: bool
    tensor_layout: Optional[str] = None
    group: Optional[str] = None  # split whose keys must be unique across shards; None for repartitions
    label_offset: int = 0  # metadata's label_offset: stored label - label_offset = class index (tfrecord: 1)


@dataclass
class ShardResult:
    name: str
    group: Optional[str]
    problems: list
    bytes_read: int = 0
    sha256: Optional[str] = None
    keys: list = field(default_factory=list)  # sample keys in shard order
    payloads_hashed: int = 0
    payloads_decoded: int = 0


class SequentialHasher:
    """The whole-shard sha256, fed from the mapped shard as the walk advances (one sequential pass)."""

    def __init__(self, view):
        self.view = view
        self.done = 0
        self.digest = hashlib.sha256()

    def advance(self, offset):
        if offset - self.done >= HASH_STEP:
            self.digest.update(self.view[self.done : offset])
            self.done = offset

    def finish(self) -> str:
        self.digest.update(self.view[self.done :])
        self.done = len(self.view)
        return self.digest.hexdigest()


class SampleIndex:
    """The index records of one shard, searchable by key and by byte offset."""

    def __init__(self, records):
        self.by_key = {}
        for record in records:
            self.by_key.setdefault(record.key, record)
        self.ordered = sorted(records, key=lambda r: r.record_offset)
        self.starts = [r.record_offset for r in self.ordered]

    def at(self, offset) -> Optional[SampleRecord]:
        i = bisect.bisect_right(self.starts, offset) - 1
        if i >= 0 and offset < self.starts[i] + max(self.ordered[i].record_size, 1):
            return self.ordered[i]
        return None

    def next_start_after(self, offset) -> Optional[int]:
        i = bisect.bisect_right(self.starts, offset)
        return self.starts[i] if i < len(self.starts) else None


def unsafe_member_name(name: str) -> bool:
    return name.startswith("/") or ".." in name.split("/") or "\\" in name


@dataclass
class MappedShard:
    """A shard mapped for one check, with what its size already told."""

    view: memoryview
    size: int
    size_differs: bool  # from metadata's size
    problems: list  # shard-level problems found so far (the size's)


def check_mapped_shard(task: ShardTask, unit: str, check_contents, when_intact=None) -> ShardResult:
    """The frame of every container's shard check: stat the shard, compare its size with
    metadata's, refuse an empty one, map it, and let `check_contents(task, shard, result)`
    (shard: a MappedShard) check what is in it.

    `check_contents` sets result.sha256 and result.problems and returns its final walk, whose
    `found` keys and payload counts go into the result. `unit` ("samples", "records") names
    what an empty shard lacks.

    Unless the task asks for every payload (deep, remainder shards), a shard whose size and sha256
    equal metadata's is not walked at all (see `check_intact_shard`); `when_intact(task, ordered
    records)` adds the format's checks of its companion files then.
    """
    name, record = task.name, task.record
    result = ShardResult(name, task.group, [])
    try:
        size = os.stat(task.path).st_size
    except OSError as exc:
        result.problems.append(error(name, f"cannot read the shard: {exc.strerror or exc}"))
        return result
    size_problems = []
    size_differs = record is not None and size != record.bytes
    if size_differs:
        size_problems.append(error(name, f"size {size:,} bytes, metadata says {record.bytes:,} "
                                         f"(truncated, extended or replaced)"))
    if record is not None and not size_differs and size and not (task.hash_payloads or task.deep):
        if check_intact_shard(task, result, size, unit, when_intact):
            return result
    if size == 0:
        size_problems.append(error(name, f"empty file (zero bytes): no {unit} can be read"))
        result.problems = size_problems + [error(name, "listed in the sample index but not in the shard", r.key)
                                           for r in task.samples]
        return result
    try:
        with open(task.path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        result.problems.append(error(name, f"cannot read the shard: {exc.strerror or exc}"))
        return result
    # No madvise(MADV_SEQUENTIAL): it made hashing ~10% slower here (pages freed behind the walk).
    view = memoryview(mapped)
    try:
        walk = check_contents(task, MappedShard(view, size, size_differs, size_problems), result)
        result.keys = walk.found
        result.payloads_hashed = walk.payloads_hashed
        result.payloads_decoded = walk.payloads_decoded
    finally:
        view.release()
        mapped.close()
    result.bytes_read = size
    return result


def check_intact_shard(task: ShardTask, result: ShardResult, size: int, unit: str, when_intact=None) -> bool:
    """Hash the shard (one sequential read, at sha256's speed); if it equals metadata's sha256, fill
    `result` and return True: the bytes are exactly those the converter wrote, published and indexed,
    so walking its headers again would prove nothing. What is still checked is the index's own
    account of the shard (count, byte ranges inside the file and in order, labels in the class
    table), which costs no read. False (result untouched) when the hash differs: walk it."""
    try:
        (digest,), _ = hash_file(task.path)
    except OSError:
        return False  # the walk names the problem
    if digest != task.record.sha256:
        return False
    ordered = sorted(task.samples, key=lambda r: r.record_offset)
    problems = metadata_mismatches(task, digest, len(ordered), unit, "")
    end = 0
    for r in ordered:
        if (r.record_offset < end or r.record_offset + r.record_size > size or r.payload_offset < r.record_offset
                or r.payload_offset + r.payload_size > r.record_offset + r.record_size):
            problems.append(error(task.name, f"the sample index places it at bytes {r.record_offset:,}+{r.record_size:,} "
                                             f"(payload {r.payload_offset:,}+{r.payload_size:,}), which does not fit "
                                             f"the shard's {size:,} bytes or overlaps the sample before", r.key))
        if not 0 <= r.label < len(task.classes):
            problems.append(error(task.name, f"label {r.label} is outside the class table ({len(task.classes)} classes: "
                                             f"0..{len(task.classes) - 1}), as the sample index says", r.key))
        end = max(end, r.record_offset + r.record_size)
    if when_intact is not None:
        problems += when_intact(task, ordered)
    result.sha256, result.bytes_read, result.problems = digest, size, problems
    result.keys = [r.key for r in ordered]
    return True


def metadata_mismatches(task: ShardTask, sha256: str, count: int, unit: str, unchanged_detail: str) -> list:
    """The shard's sha256 and its number of `unit` against metadata's record of it.

    `unchanged_detail` is appended to a sha256 mismatch: what the format's walk says about
    where the difference must be ("" when the walk found damage).
    """
    record = task.record
    if record is None:
        return []
    problems = []
    if sha256 != record.sha256:
        problems.append(error(task.name, f"sha256 {sha256[:16]}... differs from metadata "
                                         f"({record.sha256[:16]}...){unchanged_detail}"))
    if count != record.samples:
        problems.append(error(task.name, f"{count} {unit} in the shard, metadata says {record.samples}"))
    return problems
