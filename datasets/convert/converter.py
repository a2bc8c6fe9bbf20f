"""Convert an ImageNet source (folders or archives) into verified, reproducible WebDataset shards.

Pipeline: list the source (datasets.convert.imagenet_source) -> plan -> encode and write whole shards in
worker processes -> record each finished shard -> when every shard exists, write the
per-split sample indexes and, last, metadata.json.

Plan (main process, deterministic):
  * order: with shuffle (the default), the samples of a split sorted by a keyed hash,
    blake2b(key=f"{seed}:{split}", data=sample key): one global permutation drawn from the
    seed, the same whatever the listing order, the Python or numpy version. Without shuffle,
    class index then source path (ImageFolder's order). The seed is drawn when not given
    and always recorded.
  * shards: consecutive runs of that order, at most --samples-per-shard samples each, and,
    with --max-shard-bytes, a new shard starts before the estimated size would pass the
    limit. The estimate comes from the listing only (never from encoding, so the plan is
    known before any worker starts and does not depend on --workers): tar headers + the
    source file size for `img` (exact for passthrough payloads, approximate for re-encoded
    ones), the exact array size for `tensor` when the steps end in a fixed size. A single
    sample larger than the limit gets a shard of its own.
Shards are independent: shard n's bytes depend only on its samples and the options, so any
worker may write any shard and the output is byte-identical for every --workers value and
instance count. --workers 1 encodes in the main process; N > 1 uses N worker processes
that each encode and write whole shards while the main process records results. Workers
die with the main process (PR_SET_PDEATHSIG), so after a kill -9 none lives on to publish a
shard while a --resume rewrites it.

Samples (tar members, in this order):  <key>.cls  class index as ASCII digits
                                       <key>.json what the sample is and what was done to it
                                       <key>.jpg (img) | <key>.npy (tensor: uint8 HWC, no pickle)
  json: {"source", "class", "bbox" (the union of the image's rows in imagenet_2012_bounding_boxes.csv
  beside train/, normalised [x1, y1, x2, y2], or null; the sample index's bbox column holds it too),
  "width", "height" (as stored in the source), "source_format", "source_mode" (PIL's),
  "converted": "passthrough" | "reencoded" | "tensor", "steps", and when they apply
  "output_width"/"output_height", "quirks" (png_as_jpeg, cmyk, grayscale, exif_rotated, mode_<MODE>)
  and "exif_orientation"}.
  img: an RGB JPEG with no steps is stored byte for byte ("passthrough"; checked for a
  complete scan, not decoded: fast, and what is stored is exactly the source). Anything
  else is decoded, converted to RGB, passed through the steps and encoded as JPEG at
  --image-quality ("reencoded"). tensor: decoded, RGB, steps, stored as uint8 HWC.
  EXIF orientation is recorded, NOT applied: PIL's decoder and torchvision's ImageFolder
  loader ignore it, so the stored pixels are the ones a standard PyTorch pipeline would
  train on, and passthrough, re-encoded and tensor outputs all agree.
  Default steps: none for img; for tensor, when a split has no steps, Resize(256)
  CenterCrop(256) for train (room for the loader's random crops) and Resize(256)
  CenterCrop(224) for validation (the standard evaluation view), so every tensor of a
  split has one shape. The steps used are recorded.
  Decompression bombs: an image whose header declares more than --max-image-pixels pixels
  is never decoded; it is skipped (or fails the run) with a message naming it.

Other formats (--format, from the registry in datasets/formats/): the same samples, payloads and
guarantees in their own containers; each format's module says what its bytes are and what it
adds to metadata.json (e.g. a label offset). The sample index and metadata are as for tar.

Crash safety and resume. Every shard is written as <name>.partial, fsynced and renamed.
After a shard is published, the main process writes .convert-state/<shard>.json (shard
record, sample records, skipped samples, plan fingerprint). --resume recomputes the plan,
refuses a different one (different options or source), and for each shard keeps the file
only if a record of this plan exists and the file's sha256 matches it; everything else is
rewritten, stale .partial files are removed, and shards that are not in the plan are deleted
before metadata.json is written. metadata.json is removed when a run starts and written last;
its `checksum` (the reference folder checksum) leaves .convert-state/ out, and the state is
removed right after it, so nothing hidden is left and a copy without hidden files (as
upload_dataset.py makes) still matches. metadata.json keeps the plan: `plan_fingerprint`, the
options, and `convert_state_removed: true`. --resume of a complete dataset (this plan's
metadata.json, every shard and index there at its recorded size) reads every shard (with several
instances, each its own) and the indexes against metadata.json's sha256: when all match it
writes nothing and says "dataset complete" (a repartition beside it, distributed/, which records
metadata.json's sha256, stays valid); when one differs, the state records are rebuilt from
metadata.json and the indexes and the resume keeps every shard that verifies and rewrites the
rest (a shard missing or resized: every shard is written again). Other options are refused as
above (--overwrite replaces). A crash between writing metadata.json and removing the state
leaves a complete dataset with a stale .convert-state/: --resume removes it (validate_dataset.py
names it as what breaks the reference checksum). A dataset of an earlier version (state kept,
inside its checksum) is resumed as usual: every shard verified against its record, metadata.json
rewritten without the state, state removed.
A failed write (full disk, permissions) of any file - shard, state record, sample index,
metadata.json - stops the run (exit 1) with "<that file>: cannot write the <what>: <why>";
its .partial is removed, so every file under a final name is complete, and a shard whose
record could not be written is rewritten by the --resume that finishes the job.
--overwrite deletes only what this tool writes (shards, indexes, metadata, state) plus a
repartition of the replaced dataset (distributed/, now stale); other files are kept and named.

Several instances (torchrun, poprun, SLURM; datasets.launcher): instance i writes the shards
whose number is i modulo the count. Every instance plans identically (--seed is required
when there is more than one instance and none was recorded) and whichever instance finds
every shard's record after finishing its own writes the indexes and metadata.json (under an
flock of the target folder, so two that finish together do it once; the other finds that
metadata.json and reports the dataset complete); if none does (an instance crashed), a later
--resume run finishes the job.
"""

import errno
import hashlib
import io
import json
import os
import secrets
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Optional

from PIL import Image, UnidentifiedImageError

from datasets.fileio import PARTIAL_SUFFIX, atomic_write_json, partial_path, sha256_file
from datasets.index import (
    CONVERT_STATE_REMOVED,
    FORMAT_VERSION,
    METADATA_FILE,
    SPLITS,
    DatasetError,
    SampleRecord,
    ShardRecord,
    bbox_text,
    payload_crc32c,
    sample_index_name,
    split_of_index_name,
    write_metadata,
    write_sample_index,
)
from datasets.launcher import Instance
from datasets.sample_columns import ShardGroups, read_sample_columns
from datasets.preprocess import PreprocessError, apply_steps, canonical, output_size, parse_steps
from datasets.convert.dataset_source import open_any_source
from datasets.convert.imagenet_source import ImageNetSourceError
from datasets.reference.checksum import folder_checksum
from datasets.layout import CONVERT_STATE_DIR, DISTRIBUTED_DIR
from datasets.formats import EncodedSample, format_names, get_format, is_any_shard_file
from datasets.formats.tar import BLOCK, RECORD, padding

DEFAULT_SAMPLES_PER_SHARD = 1024
DEFAULT_IMAGE_QUALITY = 95
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485  # PIL's default Image.MAX_IMAGE_PIXELS
ON_ERROR = ("skip", "fail")
STATE_DIR = CONVERT_STATE_DIR
PLAN_FILE = "plan.json"
EXIF_ORIENTATION = 0x0112
JPEG_FORMATS = ("JPEG", "MPO")  # MPO: a camera JPEG with extra frames; decoders read its first frame
GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")


class UsageError(Exception):
    """Bad arguments or a target that must not be touched: exit code 2."""


class ConversionError(Exception):
    """The conversion failed (bad data with --on-error fail, unreadable source, full disk): exit code 1."""


class SampleSkipped(Exception):
    """One sample cannot be converted: `reason` says why."""


class FileFailure(Exception):
    """A problem with one file, shown as "<file>: <reason>" (picklable: workers raise these)."""

    def __init__(self, path, reason):
        super().__init__(str(path), reason)
        self.path = str(path)
        self.reason = reason

    def __str__(self):
        return f"{self.path}: {self.reason}"


class SampleFailure(FileFailure):
    """A bad sample with --on-error fail (raised in a worker, re-raised by the main process)."""


class WriteFailure(FileFailure):
    """Writing a file of the target failed (full disk, permissions): names the file being written."""


def write_problem(error: OSError) -> str:
    """What went wrong in a failed write, and for a full disk what to do about it."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"the disk is full ({error.strerror}); nothing incomplete was left under a final name: free "
                f"space, then run again with --resume (verified shards are kept)")
    return error.strerror or str(error)


@contextmanager
def writing(path, what: str, companions=()):
    """Report an OSError raised while writing `path` (a shard, a state record, an index, the
    metadata) as a WriteFailure naming that file: the OSError of a failed write() or fsync()
    carries no file name. The .partial files of `path` and its `companions` are removed: on a
    full disk the writers' own cleanup can stop early (close() retries the failed flush and
    raises again before the partial file is unlinked)."""
    try:
        yield
    except OSError as error:
        for written in (path, *companions):
            try:
                partial_path(written).unlink(missing_ok=True)
            except OSError:
                pass  # reported below with the write's own error
        raise WriteFailure(path, f"cannot write the {what}: {write_problem(error)}") from None


@dataclass(frozen=True)
class ConvertOptions:
    source: Path
    target: Path
    format: str = "img"
    splits: tuple = SPLITS
    shuffle: bool = True
    seed: int | None = None
    samples_per_shard: int = DEFAULT_SAMPLES_PER_SHARD
    max_shard_bytes: int | None = None
    image_quality: int = DEFAULT_IMAGE_QUALITY
    train_steps: tuple = ()
    validation_steps: tuple = ()
    workers: int = 1
    resume: bool = False
    overwrite: bool = False
    on_error: str = "skip"
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    source_layout: str = "auto"
    instance: Instance = Instance(0, 1, "single")
    progress: bool = True
    on_published: Optional[Callable] = None  # called with each ShardRecord once its shard is published


@dataclass(frozen=True)
class EncodeOptions:
    """What a worker needs to turn source samples into shard members (picklable)."""

    format: str
    steps: tuple  # canonical step strings
    image_quality: int
    max_image_pixels: int
    on_error: str


@dataclass(frozen=True)
class ShardToWrite:
    split: str
    number: int
    name: str
    samples: tuple  # SourceSample, in shard order
    encode: EncodeOptions
    expected: dict | None = None  # ShardRecord json of this plan from an earlier run: keep if it verifies


@dataclass
class WrittenShard:
    split: str
    number: int
    shard: ShardRecord
    samples: list  # SampleRecord
    skipped: list  # {"path", "reason"}
    kept: bool = False  # an earlier run's shard that verified


# ---------------------------------------------------------------- encoding one sample


def jpeg_scan_start(data: bytes) -> int:
    """Offset of the first start-of-scan marker of a JPEG, walking its segments; -1 if none."""
    if data[:2] != b"\xff\xd8":
        return -1
    position, end = 2, len(data)
    while position + 4 <= end:
        if data[position] != 0xFF:
            return -1
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
        elif marker == 0xDA:
            return position
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            position += 2
        else:
            position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
    return -1


def jpeg_is_complete(data: bytes) -> bool:
    """A scan and an end-of-image marker after it: catches truncated files without decoding.

    The search starts at the main image's first scan, so an EXIF thumbnail's own end marker
    (inside an APP1 segment, before that scan) cannot hide a truncated main image.
    """
    scan = jpeg_scan_start(data)
    return scan >= 0 and data.rfind(b"\xff\xd9") > scan


def open_image(data: bytes, max_pixels: int):
    """PIL image of `data`, header parsed, pixels not decoded. Raises SampleSkipped."""
    limit = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None  # our own guard below gives the clearer message
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise SampleSkipped("not an image PIL can read (unknown format or corrupt header)") from None
    except Exception as error:  # PIL raises many types for broken headers
        raise SampleSkipped(f"cannot read the image header: {type(error).__name__}: {error}") from None
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    width, height = image.size
    if width * height > max_pixels:
        raise SampleSkipped(
            f"decompression bomb guard: {width}x{height} = {width * height} pixels exceeds the limit of "
            f"{max_pixels} (--max-image-pixels); not decoded")
    return image


def describe_source(image, name: str):
    """(quirks, exif orientation) of an opened image."""
    quirks = []
    if image.format not in JPEG_FORMATS and name.lower().endswith((".jpeg", ".jpg")):
        quirks.append(f"{(image.format or 'unknown').lower()}_as_jpeg")
    if image.mode == "CMYK":
        quirks.append("cmyk")
    elif image.mode in GRAYSCALE_MODES:
        quirks.append("grayscale")
    elif image.mode != "RGB":
        quirks.append(f"mode_{image.mode}")
    try:
        orientation = int(image.getexif().get(EXIF_ORIENTATION, 1))
    except Exception:  # a broken EXIF block does not make the pixels unreadable
        orientation = 1
    if orientation != 1:
        quirks.append("exif_rotated")
    return quirks, orientation


def encode_payload(data: bytes, name: str, options: EncodeOptions, steps):
    """(payload, json info) of one source image. Raises SampleSkipped.

    The payload is bytes, or for tensors a view of a reused buffer (see tensor_npy): write it
    before encoding the next sample.
    """
    image = open_image(data, options.max_image_pixels)
    quirks, orientation = describe_source(image, name)
    info = {"width": image.width, "height": image.height, "source_format": image.format,
            "source_mode": image.mode}
    fmt = get_format(options.format)
    if fmt.stores_jpeg and not steps and image.format in JPEG_FORMATS and image.mode == "RGB":
        if not jpeg_is_complete(data):
            raise SampleSkipped("truncated or corrupt JPEG: no end-of-image marker after the scan data")
        info["converted"] = "passthrough"
        payload = data
    else:
        try:
            image.load()
            rgb = image if image.mode == "RGB" else image.convert("RGB")
            out = apply_steps(steps, rgb)
        except Exception as error:  # truncated data, broken entropy coding, unsupported mode
            raise SampleSkipped(f"cannot decode the image: {type(error).__name__}: {error}") from None
        info["output_width"], info["output_height"] = out.size
        payload = fmt.encode_image(out, options.image_quality)
        info["converted"] = "reencoded" if fmt.stores_jpeg else "tensor"
    info["steps"] = list(options.steps)
    if quirks:
        info["quirks"] = quirks
    if orientation != 1:
        info["exif_orientation"] = orientation
        info["exif_orientation_applied"] = False
    return payload, info


# ---------------------------------------------------------------- writing one shard (in a worker)

_parsed_steps = {}


def _steps(canonical_steps):
    steps = _parsed_steps.get(canonical_steps)
    if steps is None:
        steps = _parsed_steps[canonical_steps] = parse_steps(list(canonical_steps))
    return steps


def write_shard(target: str, task: ShardToWrite, progress=None) -> WrittenShard:
    """Encode and write one whole shard (or keep a verified one from an earlier run)."""
    path = Path(target) / task.name
    if task.expected is not None and path.is_file():
        digest, size = sha256_file(path)
        if digest == task.expected["sha256"] and size == task.expected["bytes"]:
            if progress:
                progress(len(task.samples))
            return WrittenShard(task.split, task.number, ShardRecord.from_json(task.expected), [], [], kept=True)
    options = task.encode
    steps = _steps(options.steps)
    records, skipped = [], []
    fmt = get_format(options.format)
    companions = tuple(path.with_name(name) for name in fmt.companions(path.name))
    what = "shard or its " + ", ".join(c.suffix for c in companions) if companions else "shard"
    with writing(path, what, companions):
        with fmt.open_writer(path) as writer:
            for sample in fmt.order_in_shard(task.samples):
                try:
                    try:
                        data = sample.read_bytes()
                    except OSError as error:
                        raise SampleSkipped(f"cannot read: {error.strerror or error}") from None
                    payload, info = encode_payload(data, sample.source, options, steps)
                except SampleSkipped as skip:
                    if options.on_error == "fail":
                        raise SampleFailure(sample.source, str(skip)) from None
                    skipped.append({"path": sample.source, "reason": str(skip)})
                    if progress:
                        progress(1)
                    continue
                # "bbox" (normalised [x1, y1, x2, y2] or null) is read unconditionally by the reference loader
                info = {"source": sample.source, "class": sample.class_name, **info, "bbox": sample.bbox}
                encoded = EncodedSample(sample.key, sample.label, sample.class_name, sample.source, info, payload)
                records.append(writer.add_sample(encoded, task.name))
                if progress:
                    progress(1)
    shard = ShardRecord(task.name, writer.samples, writer.bytes_written, writer.sha256, writer.md5)
    return WrittenShard(task.split, task.number, shard, records, skipped)


# ---------------------------------------------------------------- planning


def shuffle_order(samples, seed: int, split: str):
    """One global permutation of the split from the seed: sort by a keyed hash of each key."""
    secret = f"{seed}:{split}".encode()

    def rank(sample):
        return hashlib.blake2b(sample.key.encode(), key=secret, digest_size=16).digest(), sample.key

    return sorted(samples, key=rank)


def estimated_sample_bytes(sample, fmt: str, fixed_size) -> int:
    """Bytes the sample will take in a tar shard, from the listing only (see the module doc)."""
    payload = get_format(fmt).estimated_payload_bytes(sample.size or 0, fixed_size)
    info = 400 + len(sample.source) + len(sample.class_name)  # json fields: a safe bound
    return 3 * BLOCK + BLOCK + (info + padding(info)) + (payload + padding(payload))


def plan_shards(ordered, samples_per_shard: int, max_shard_bytes, estimate):
    """Split the ordered samples into shards (lists), bounded by count and estimated bytes."""
    budget = None if max_shard_bytes is None else max_shard_bytes - (2 * BLOCK + RECORD)
    shards, current, current_bytes = [], [], 0
    for sample in ordered:
        size = estimate(sample) if budget is not None else 0
        full = len(current) >= samples_per_shard or (budget is not None and current and current_bytes + size > budget)
        if full:
            shards.append(current)
            current, current_bytes = [], 0
        current.append(sample)
        current_bytes += size
    if current:
        shards.append(current)
    return shards


@dataclass
class SplitConversion:
    split: str
    steps: tuple  # canonical
    shards: list  # [[SourceSample]]
    ignored: list

    @property
    def samples(self) -> int:
        return sum(len(s) for s in self.shards)


@dataclass
class Plan:
    options: dict  # everything that decides the output bytes
    classes: list
    layout: str
    splits: dict  # split -> SplitConversion
    fingerprint: str = ""
    provenance: dict = field(default_factory=dict)  # written to metadata.json as it is (a parent dataset)


def steps_for(options: ConvertOptions, split: str):
    """Canonical steps for a split, with the tensor defaults (see the module doc)."""
    given = options.train_steps if split == "train" else options.validation_steps
    steps = canonical(parse_steps(list(given)))
    if not steps:
        steps = list(get_format(options.format).default_steps.get(split, ()))
    return tuple(steps)


def make_plan(options: ConvertOptions, source, seed: int) -> Plan:
    split_plans = {}
    for split in options.splits:
        steps = steps_for(options, split)
        fixed = output_size(parse_steps(list(steps)))
        samples = source.splits[split].samples
        ordered = shuffle_order(samples, seed, split) if options.shuffle else list(samples)
        shards = plan_shards(ordered, options.samples_per_shard, options.max_shard_bytes,
                             lambda s: estimated_sample_bytes(s, options.format, fixed))
        split_plans[split] = SplitConversion(split, steps, shards, source.splits[split].ignored)
    recorded = {
        "format": options.format, "shuffle": options.shuffle, "seed": seed,
        "samples_per_shard": options.samples_per_shard, "max_shard_bytes": options.max_shard_bytes,
        "image_quality": options.image_quality, "max_image_pixels": options.max_image_pixels,
        "splits": list(options.splits), "steps": {split: list(p.steps) for split, p in split_plans.items()},
        "source_layout": source.layout,
    }
    plan = Plan(recorded, list(source.classes), source.layout, split_plans, provenance=source.provenance)
    plan.fingerprint = plan_fingerprint(plan)
    return plan


def plan_fingerprint(plan: Plan) -> str:
    """sha256 over the options and every shard's samples: equal fingerprints, equal output."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"options": plan.options, "classes": plan.classes}, sort_keys=True).encode())
    for split, split_plan in plan.splits.items():
        for number, shard in enumerate(split_plan.shards):
            digest.update(f"\n{split} {number}\n".encode())
            for s in shard:
                box = f"\t{s.bbox}" if s.bbox else ""  # only when there are boxes: earlier plans keep their fingerprint
                digest.update(f"{s.key}\t{s.label}\t{s.source}{box}\n".encode())
    return digest.hexdigest()


# ---------------------------------------------------------------- the target folder and its state


def state_dir(target: Path) -> Path:
    return target / STATE_DIR


def record_path(target: Path, shard_name: str) -> Path:
    return state_dir(target) / f"{shard_name}.json"


def is_converter_output(name: str) -> bool:
    return (is_any_shard_file(name) or name == METADATA_FILE or name == STATE_DIR
            or name.endswith(".index.tsv") or name.endswith(".index.tsv" + PARTIAL_SUFFIX)
            or name == METADATA_FILE + PARTIAL_SUFFIX)


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def check_target(options: ConvertOptions) -> None:
    """Refuse what must not be touched, before the (possibly long) listing of the source."""
    target = options.target
    if target.exists() and not target.is_dir():
        raise UsageError(f"--target {target} exists and is not a folder")
    if options.resume and options.overwrite:
        raise UsageError("--resume and --overwrite exclude each other: resume keeps verified shards, "
                         "overwrite deletes them")
    if not target.is_dir() or options.resume or options.overwrite or options.instance.count > 1:
        return
    entries = sorted(os.listdir(target))
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UsageError(
            f"--target {target} is not empty ({len(entries)} entries: {shown}); pass --resume to finish an "
            f"interrupted conversion into it, --overwrite to replace its converted dataset, or choose an "
            f"empty folder")


def read_json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None


def prepare_target(options: ConvertOptions, plan: Plan, own_shards) -> None:
    """Apply --overwrite / --resume / the multi-instance rules; write the plan record."""
    options.target.mkdir(parents=True, exist_ok=True)
    with target_lock(options.target):
        _prepare_target(options, plan, own_shards)


def _prepare_target(options: ConvertOptions, plan: Plan, own_shards) -> None:
    target, instance = options.target, options.instance
    state = state_dir(target)
    recorded = recorded_plan(target)
    same_plan = recorded is not None and recorded.get("fingerprint") == plan.fingerprint
    own_names = {task_name for task_name in own_shards}
    if options.overwrite:
        # A repartition of the replaced dataset (distributed_webdataset.py) names its shards: stale.
        if (target / DISTRIBUTED_DIR).is_dir():
            shutil.rmtree(target / DISTRIBUTED_DIR, ignore_errors=True)
            print(f"note: --overwrite removed {target / DISTRIBUTED_DIR}: it repartitioned the replaced dataset",
                  file=sys.stderr)
        if instance.count == 1:
            for entry in sorted(os.listdir(target)):
                if is_converter_output(entry):
                    remove_path(target / entry)
            others = [e for e in os.listdir(target)]
            if others:
                print(f"note: --overwrite kept {len(others)} entries it did not write in {target}: "
                      f"{', '.join(sorted(others)[:3])}{', ...' if len(others) > 3 else ''}", file=sys.stderr)
        else:  # peers are writing their own shards now: touch only ours
            for name in own_names:
                (target / name).unlink(missing_ok=True)
                record_path(target, name).unlink(missing_ok=True)
    elif recorded is not None and not same_plan and (options.resume or instance.count > 1):
        raise UsageError(
            f"--target {target} holds a conversion with other options or another source "
            f"({describe_plan_difference(recorded.get('options', {}), plan.options)}); "
            f"pass --overwrite to replace it")
    elif instance.count > 1 and not options.resume:
        present = [n for n in own_names if (target / n).exists() or record_path(target, n).exists()]
        foreign = [e for e in os.listdir(target) if not is_converter_output(e)]
        # A state folder alone, without plan.json, is a peer creating it (where there is no flock).
        earlier = [e for e in os.listdir(target) if is_converter_output(e) and e != STATE_DIR]
        if present or foreign or (recorded is None and earlier):
            raise UsageError(
                f"--target {target} already holds files of this instance or of another conversion; pass "
                f"--resume to finish an interrupted conversion, or --overwrite")
    state.mkdir(exist_ok=True)
    with writing(state / PLAN_FILE, "conversion plan record"):
        atomic_write_json(state / PLAN_FILE, {"fingerprint": plan.fingerprint, "options": plan.options})
    (target / METADATA_FILE).unlink(missing_ok=True)  # written again, last, when every shard exists
    for name in own_names:
        (target / (name + PARTIAL_SUFFIX)).unlink(missing_ok=True)


def recorded_plan(target: Path):
    """{"fingerprint", "options"} of the conversion in `target`: its state's plan.json while it runs,
    else what a complete metadata.json records (the state is removed then); None if neither."""
    recorded = read_json(state_dir(target) / PLAN_FILE)
    if isinstance(recorded, dict) and isinstance(recorded.get("options"), dict):
        return recorded
    return plan_of_metadata(read_json(target / METADATA_FILE))


def plan_of_metadata(metadata):
    """plan.json's {"fingerprint", "options"} as a complete metadata.json of this converter records
    them (build_metadata), or None for any other metadata (the reference harness's, an adoption)."""
    if (not isinstance(metadata, dict) or not isinstance(metadata.get("plan_fingerprint"), str)
            or not isinstance(metadata.get("splits"), dict)):
        return None
    splits = metadata["splits"]
    options = {key: metadata.get(key) for key in ("format", "shuffle", "seed", "samples_per_shard", "max_shard_bytes",
                                                   "image_quality", "max_image_pixels")}
    options.update(splits=list(splits), source_layout=metadata.get("source_layout"),
                   steps={split: entry.get("transform_pipeline", []) if isinstance(entry, dict) else []
                          for split, entry in splits.items()})
    return {"fingerprint": metadata["plan_fingerprint"], "options": options}


def complete_metadata(target: Path, plan: Plan):
    """(metadata, None) when `target` holds this plan's complete dataset: a metadata.json with this plan's
    fingerprint whose shards and indexes are all there with their recorded sizes (stat only: sha256
    checks are validate_dataset.py's). Else (None, why not) - why is None when there is no such
    metadata.json at all."""
    metadata = read_json(target / METADATA_FILE)
    if not isinstance(metadata, dict) or metadata.get("plan_fingerprint") != plan.fingerprint:
        return None, None
    try:
        for entry in metadata["splits"].values():
            for name, size in [(s["name"], s["bytes"]) for s in entry["shards"]] + [(entry["index"]["name"],
                                                                                     entry["index"]["bytes"])]:
                path = target / name
                if not path.is_file():
                    return None, f"{path}: missing"
                if path.stat().st_size != size:
                    return None, f"{path}: {path.stat().st_size:,} bytes, {METADATA_FILE} says {size:,}"
    except (AttributeError, KeyError, TypeError) as error:
        return None, f"{target / METADATA_FILE}: malformed ({type(error).__name__}: {error})"
    return metadata, None


def verify_complete(options: ConvertOptions, plan: Plan, metadata: dict):
    """None if this instance's shards (all of them with one instance) and the indexes match metadata.json's
    sha256; else what differs (the first one)."""
    target, instance = options.target, options.instance
    for entry in metadata["splits"].values():
        checks = [(entry["index"]["name"], entry["index"]["sha256"])]
        checks += [(shard["name"], shard["sha256"]) for number, shard in enumerate(entry["shards"])
                   if number % instance.count == instance.index]
        for name, expected in checks:
            if sha256_file(target / name)[0] != expected:
                return f"{target / name} differs from its sha256 in {METADATA_FILE}"
    return None


def restore_state(target: Path, plan: Plan, metadata: dict) -> None:
    """Write .convert-state/ records of every shard from a complete metadata.json and its sample
    indexes (sha256-checked first): a resume then keeps each shard whose file still verifies. An
    index without CRC32Cs (the earlier version) restores nothing: its shards are written again."""
    for split, entry in metadata["splits"].items():
        index_path = target / entry["index"]["name"]
        if sha256_file(index_path)[0] != entry["index"]["sha256"]:
            continue
        try:
            columns = read_sample_columns(index_path)
        except DatasetError:
            continue
        if not columns.has_checksums or columns.checksum_known is not None:
            continue
        by_shard = ShardGroups(columns, by_offset=False)  # one shard's records at a time
        split_plan = plan.splits[split]
        shard_of_source = {}
        for number, samples in enumerate(split_plan.shards):
            name = get_format(plan.options["format"]).shard_name(split, number, len(split_plan.shards))
            shard_of_source.update((sample.source, name) for sample in samples)
        skipped = {}
        for item in entry["skipped"]:
            skipped.setdefault(shard_of_source.get(item["path"]), []).append(item)
        state_dir(target).mkdir(exist_ok=True)
        for shard in entry["shards"]:
            shard_record = ShardRecord.from_json(shard)
            save_record(target, WrittenShard(split, -1, shard_record, by_shard.get(shard_record.name, []),
                                             skipped.get(shard_record.name, [])), plan.fingerprint)


def remove_state(target: Path) -> None:
    """Remove .convert-state/ (another instance may be removing it too). WriteFailure if it stays."""
    def tolerate_gone(function, path, exc_info):
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    try:
        shutil.rmtree(state_dir(target), onerror=tolerate_gone)
    except OSError as error:
        raise WriteFailure(state_dir(target), f"cannot remove the conversion state: {error.strerror or error}; the "
                                              f"dataset is complete, but the reference validate_dataset.py counts "
                                              f"these hidden files in its checksum: delete the folder, or run "
                                              f"again with --resume") from None


@contextmanager
def target_lock(target: Path):
    """An exclusive flock on the target folder while one instance prepares the target (checks it, writes
    plan.json) or finalizes: instances started together see each other's plan.json, not a half-made state,
    and a peer that finalizes second finds metadata.json written and the state removed. Where the
    filesystem has no flock (some network mounts), unlocked: both steps also tolerate a peer's work."""
    try:
        import fcntl

        descriptor = os.open(target, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        os.close(descriptor)  # releases the lock


def describe_plan_difference(old: dict, new: dict) -> str:
    changed = [f"{key}: {old.get(key)!r} -> {new.get(key)!r}" for key in sorted(set(old) | set(new))
               if old.get(key) != new.get(key)]
    return "; ".join(changed) if changed else "same options, different source listing"


# The per-sample checksum a state record holds; a record of the earlier version (payload sha256)
# is not reused, so one index never mixes the two (its shard is simply written again).
_STATE_CHECKSUM = "crc32c"


def load_record(target: Path, shard_name: str, fingerprint: str):
    record = read_json(record_path(target, shard_name))
    if (not isinstance(record, dict) or record.get("fingerprint") != fingerprint
            or record.get("checksum") != _STATE_CHECKSUM):
        return None
    return record


def save_record(target: Path, result: WrittenShard, fingerprint: str) -> None:
    """Record a published shard. If this fails the shard has no record, so --resume rewrites it."""
    path = record_path(target, result.shard.name)
    with writing(path, f"state record of {result.shard.name}"):
        atomic_write_json(path, {
            "fingerprint": fingerprint,
            "checksum": _STATE_CHECKSUM,
            "shard": result.shard.to_json(),
            "samples": [[r.key, r.label, r.record_offset, r.record_size, r.payload_offset, r.payload_size,
                         r.payload_crc32c, r.members] for r in result.samples],
            "skipped": result.skipped,
        }, indent=None)  # compact: json's C encoder, ~3.7x faster than with an indent (one per shard)


def records_from_json(record: dict):
    shard = record["shard"]["name"]
    return [SampleRecord(key, shard, label, ro, rs, po, ps, crc, members)
            for key, label, ro, rs, po, ps, crc, members in record["samples"]]


# ---------------------------------------------------------------- finishing: indexes and metadata


def finalize(options: ConvertOptions, plan: Plan):
    """Write the indexes and metadata.json if every planned shard has a record and a file, then
    remove .convert-state/ (outside metadata.json's checksum). Another instance finalizing at the
    same time (or before) finds metadata.json of this plan and reports the dataset complete.

    Returns the metadata, or None (with the number of missing shards) when not complete.
    """
    target = options.target
    with target_lock(target):
        done, _ = complete_metadata(target, plan)  # a peer instance finished it
        if done is None:
            done, missing = write_indexes_and_metadata(options, plan)
            if done is None:  # its records may be gone because a peer finished meanwhile (no lock)
                done = complete_metadata(target, plan)[0]
                if done is None:
                    return None, missing
        remove_state(target)  # a crash before this: --resume finds metadata.json complete and removes it
    return done, 0


def write_indexes_and_metadata(options: ConvertOptions, plan: Plan):
    """finalize's writes: (metadata, 0), or (None, missing shards) when some shard has no record or file."""
    target = options.target
    split_entries, missing = {}, 0
    shards_by_split = {}  # split -> [(state record name, its shard's record, its skipped)]: no samples held
    for split, split_plan in plan.splits.items():
        shards = []
        for number in range(len(split_plan.shards)):
            name = get_format(options.format).shard_name(split, number, len(split_plan.shards))
            record = load_record(target, name, plan.fingerprint)
            path = target / name
            if record is None or not path.is_file() or path.stat().st_size != record["shard"]["bytes"]:
                missing += 1
                continue
            shards.append((name, record["shard"], record["skipped"]))
        shards_by_split[split] = shards
    if missing:
        return None, missing
    planned = {get_format(options.format).shard_name(split, n, len(p.shards))
               for split, p in plan.splits.items() for n in range(len(p.shards))}
    for entry in os.listdir(target):  # stale shards of an earlier run never mix in
        if is_any_shard_file(entry) and get_format(options.format).shard_of_file(entry) not in planned:
            (target / entry).unlink(missing_ok=True)
        elif split_of_index_name(entry) is not None and entry != sample_index_name(split_of_index_name(entry)):
            (target / entry).unlink(missing_ok=True)  # the earlier name (<split>.index.tsv)
        elif split_of_index_name(entry) is not None and split_of_index_name(entry) not in plan.splits:
            (target / entry).unlink(missing_ok=True)
    for split, shards in shards_by_split.items():
        split_plan = plan.splits[split]
        skipped = [s for _, _, shard_skipped in shards for s in shard_skipped]
        index_path = target / sample_index_name(split)
        with writing(index_path, f"{split} sample index"):
            written = [0]
            index = write_sample_index(index_path, _index_records(target, plan, split_plan, shards, written))
        length = written[0]
        split_entries[split] = {
            "length": length,
            "source_samples": length + len(skipped),
            "skipped": skipped,
            "ignored": split_plan.ignored,
            "transform_pipeline": list(split_plan.steps),
            "shards": [shard for _, shard, _ in shards],
            "index": index,
        }
    metadata = build_metadata(plan, split_entries)
    # The reference harness's folder checksum, from the md5s taken while shards and indexes were
    # written; only small files (.tfindex) are read. .convert-state/ is left out: it is removed next.
    known = {entry["index"]["name"]: entry["index"]["md5"] for entry in split_entries.values()}
    known.update((shard["name"], shard.get("md5")) for entry in split_entries.values() for shard in entry["shards"])
    metadata["checksum"] = folder_checksum(target, known, skip_folders=(STATE_DIR,))
    with writing(target / METADATA_FILE, "metadata"):
        write_metadata(target, metadata)
    return metadata, 0


def _index_records(target: Path, plan: Plan, split_plan, shards, written: list):
    """A split's index records, streamed: one shard's state record read at a time (not the split's samples
    at once). Each sample's box as its json holds it (the plan's, which the fingerprint covers), "" for
    none: the index always has the bbox column, so the loader never reads a json member for it. written[0]
    counts the records."""
    for (name, _, _), shard_samples in zip(shards, split_plan.shards):  # both in shard number order
        record = load_record(target, name, plan.fingerprint)
        if record is None:  # removed since it was checked: the index would be incomplete
            raise WriteFailure(record_path(target, name), "the state record vanished while the index was written")
        boxes = {sample.key: sample.bbox for sample in shard_samples}
        for r in records_from_json(record):
            written[0] += 1
            yield r._replace(bbox=bbox_text(boxes[r.key]))


def build_metadata(plan: Plan, split_entries: dict) -> dict:
    o = plan.options
    return {
        # The reference harness's keys.
        "train_length": split_entries.get("train", {}).get("length", 0),
        "validation_length": split_entries.get("validation", {}).get("length", 0),
        "format": o["format"],
        "shuffle": o["shuffle"],
        "train_transform_pipeline": o["steps"].get("train", []),
        "validation_transform_pipeline": o["steps"].get("validation", []),
        "seed": o["seed"],
        "image_quality": o["image_quality"],
        # Added (see datasets/index.py).
        "format_version": FORMAT_VERSION,
        "classes": plan.classes,
        "tensor_layout": None,
        **get_format(o["format"]).metadata_fields(),
        "samples_per_shard": o["samples_per_shard"],
        "max_shard_bytes": o["max_shard_bytes"],
        "max_image_pixels": o["max_image_pixels"],
        "source_layout": o["source_layout"],
        "exif_orientation": "recorded in each sample's json, not applied (as PIL and torchvision's ImageFolder)",
        "plan_fingerprint": plan.fingerprint,
        **plan.provenance,
        CONVERT_STATE_REMOVED: True,
        "splits": split_entries,
    }


# ---------------------------------------------------------------- running


@dataclass
class SplitReport:
    split: str
    planned_samples: int = 0  # this instance's share
    shards: int = 0  # this instance's shards
    written: int = 0  # samples written by this run
    skipped: list = field(default_factory=list)
    kept_shards: int = 0
    bytes: int = 0


@dataclass
class Summary:
    options: ConvertOptions
    plan: Plan
    seed: int
    reports: dict
    elapsed: float  # the whole run: listing, planning, encoding, index and metadata
    encode_elapsed: float  # encoding and writing the shards only
    encode_cpu: float  # CPU seconds of that phase, main process and workers
    metadata: dict | None
    missing_shards: int
    already_complete: bool = False  # --resume found this plan's complete dataset: nothing written
    leftover_state_removed: bool = False  # ... and removed the .convert-state/ a crash had left
    incomplete_reason: str | None = None  # why a dataset whose metadata.json has this plan was converted again


def validate_options(options: ConvertOptions) -> None:
    if options.format not in format_names():
        raise UsageError(f"--format {options.format!r}: expected one of {', '.join(format_names())}")
    if options.samples_per_shard < 1:
        raise UsageError(f"--samples-per-shard must be at least 1, got {options.samples_per_shard}")
    if options.max_shard_bytes is not None and options.max_shard_bytes < 1:
        raise UsageError(f"--max-shard-bytes must be positive, got {options.max_shard_bytes}")
    if not 1 <= options.image_quality <= 100:
        raise UsageError(f"--image-quality must be between 1 and 100, got {options.image_quality}")
    if options.workers < 1:
        raise UsageError(f"--workers must be at least 1, got {options.workers}")
    if options.seed is not None and not 0 <= options.seed < 2**63:
        raise UsageError(f"--seed must be between 0 and 2**63-1, got {options.seed}")
    if options.on_error not in ON_ERROR:
        raise UsageError(f"--on-error {options.on_error!r}: expected skip or fail")
    if options.max_image_pixels < 1:
        raise UsageError(f"--max-image-pixels must be positive, got {options.max_image_pixels}")
    if not options.splits or any(s not in SPLITS for s in options.splits):
        raise UsageError(f"--splits: expected one or both of {', '.join(SPLITS)}, got {list(options.splits)}")
    if len(set(options.splits)) != len(options.splits):
        raise UsageError(f"--splits lists a split twice: {list(options.splits)}")
    for split in SPLITS:
        try:
            steps_for(options, split)
        except PreprocessError as error:
            flag = "--train-preprocess-steps" if split == "train" else "--validation-preprocess-steps"
            raise UsageError(f"{flag}: {error}") from None


def choose_seed(options: ConvertOptions) -> int:
    if options.seed is not None:
        return options.seed
    if options.resume or options.instance.count > 1:
        recorded = recorded_plan(options.target)
        if recorded is not None and isinstance(recorded["options"].get("seed"), int):
            return recorded["options"]["seed"]
    if options.instance.count > 1:
        raise UsageError(
            f"--seed is required with {options.instance.count} instances: every instance must plan the same "
            f"order ({options.instance.describe()})")
    return secrets.randbelow(2**31)


def convert(options: ConvertOptions) -> Summary:
    """Run a conversion (see the module docstring). Raises UsageError or ConversionError."""
    started = time.perf_counter()
    validate_options(options)
    check_target(options)
    seed = choose_seed(options)
    try:
        source = open_any_source(options.source, options.splits, options.source_layout,
                                 sizes=options.max_shard_bytes is not None)
    except ImageNetSourceError as error:
        raise (UsageError if error.usage else ConversionError)(str(error)) from None
    plan = make_plan(options, source, seed)
    instance = options.instance
    incomplete = None
    if (options.resume or instance.count > 1) and not options.overwrite:
        done, incomplete = complete_metadata(options.target, plan)
        if done is not None and (done.get(CONVERT_STATE_REMOVED) or not state_dir(options.target).exists()):
            try:
                incomplete = verify_complete(options, plan, done)
                if incomplete is None:
                    leftover = state_dir(options.target).exists()
                    remove_state(options.target)  # left by a crash after metadata.json was written
                    return Summary(options, plan, seed, {}, time.perf_counter() - started, 0.0, 0.0, done, 0,
                                   already_complete=True, leftover_state_removed=leftover)
                if options.resume:  # (an instance started without it is refused below: nothing written)
                    restore_state(options.target, plan, done)  # the verified shards are kept by the resume below
            except WriteFailure as failure:
                raise ConversionError(str(failure)) from None
            except OSError as error:
                raise ConversionError(f"{error.filename or options.target}: {write_problem(error)}") from None
        # Else not complete; or made by an earlier version that kept .convert-state/ inside the checksum:
        # resumed as usual (every shard verified against its record), metadata.json written without it.
    tasks = {split: [] for split in plan.splits}
    own_names = []
    for split, split_plan in plan.splits.items():
        encode = EncodeOptions(options.format, split_plan.steps, options.image_quality,
                               options.max_image_pixels, options.on_error)
        for number, shard in enumerate(split_plan.shards):
            if number % instance.count != instance.index:
                continue
            name = get_format(options.format).shard_name(split, number, len(split_plan.shards))
            own_names.append(name)
            tasks[split].append(ShardToWrite(split, number, name, tuple(shard), encode))
    try:
        prepare_target(options, plan, own_names)
    except WriteFailure as failure:
        raise ConversionError(str(failure)) from None
    except OSError as error:  # creating the folder, removing an earlier run's files
        raise ConversionError(f"{error.filename or options.target}: cannot prepare the target folder: "
                              f"{write_problem(error)}") from None
    reports = {split: SplitReport(split) for split in plan.splits}
    if options.resume or instance.count > 1:
        for split, split_tasks in tasks.items():
            tasks[split] = [_with_expected(options.target, task, plan.fingerprint) for task in split_tasks]
    try:
        encode_started, cpu_started = time.perf_counter(), _cpu_seconds()
        run_all(options, plan, tasks, reports)  # returns after the workers have exited: their CPU is counted
        encode_elapsed, encode_cpu = time.perf_counter() - encode_started, _cpu_seconds() - cpu_started
        metadata, missing = finalize(options, plan)
    except WriteFailure as failure:
        raise ConversionError(str(failure)) from None
    except OSError as error:  # reading state, listing or removing stale files (writes are WriteFailures)
        raise ConversionError(f"{error.filename or options.target}: {write_problem(error)}") from None
    return Summary(options, plan, seed, reports, time.perf_counter() - started, encode_elapsed, encode_cpu,
                   metadata, missing, incomplete_reason=incomplete)


def _cpu_seconds() -> float:
    """CPU time of this process and its exited children (the worker processes)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _with_expected(target: Path, task: ShardToWrite, fingerprint: str) -> ShardToWrite:
    record = load_record(target, task.name, fingerprint)
    if record is None:
        return task
    return ShardToWrite(task.split, task.number, task.name, task.samples, task.encode, record["shard"])


def run_all(options: ConvertOptions, plan: Plan, tasks: dict, reports: dict) -> None:
    from tqdm import tqdm

    target = options.target
    executor = None
    if options.workers > 1 and sum(len(t) for t in tasks.values()) > 1:
        context = get_context("fork") if sys.platform.startswith("linux") else get_context()
        executor = ProcessPoolExecutor(max_workers=options.workers, mp_context=context,
                                       initializer=_worker_init, initargs=(os.getpid(),))
    interactive = sys.stderr.isatty()
    try:
        for split, split_tasks in tasks.items():
            report = reports[split]
            report.shards = len(split_tasks)
            report.planned_samples = sum(len(t.samples) for t in split_tasks)
            bar = tqdm(total=report.planned_samples, desc=f"{split:<10}", unit="img", disable=not options.progress,
                       mininterval=0.5 if interactive else 30, dynamic_ncols=True, file=sys.stderr)

            def record(result: WrittenShard):
                if result.kept:
                    report.kept_shards += 1
                    if executor is not None:
                        bar.update(len(tasks_by_number[result.number].samples))
                else:
                    save_record(target, result, plan.fingerprint)
                    if options.on_published is not None:
                        options.on_published(result.shard)
                    report.written += result.shard.samples
                    report.skipped.extend(result.skipped)
                    report.bytes += result.shard.bytes
                    if executor is not None:
                        bar.update(result.shard.samples + len(result.skipped))

            tasks_by_number = {t.number: t for t in split_tasks}
            try:
                if executor is None:
                    for task in split_tasks:
                        record(write_shard(str(target), task, progress=bar.update))
                else:
                    run_in_pool(executor, str(target), split_tasks, record)
            finally:
                bar.close()
    except SampleFailure as failure:
        raise ConversionError(f"{failure} (--on-error fail stops at the first bad sample; "
                              f"--on-error skip skips and lists it)") from None
    except WriteFailure as failure:
        raise ConversionError(str(failure)) from None
    except BrokenProcessPool:
        raise ConversionError(
            "a worker process died (killed, or out of memory?); finished shards are kept: run again with "
            "--resume, perhaps with fewer --workers") from None
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)


def _worker_init(parent_pid: int) -> None:
    """Workers die with the main process (Linux): when the job is killed, none lives on to publish a
    shard under a name a --resume run is writing again."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def run_in_pool(executor, target: str, tasks, record) -> None:
    """Run shard tasks in worker processes; record each as it finishes.

    On a failure, pending shards are cancelled, running ones finish and are recorded (so a
    --resume keeps them), then the failure is raised.
    """
    futures = {executor.submit(write_shard, target, task): task for task in tasks}
    try:
        for future in as_completed(futures):
            # Recorded, or tried once (a record that failed is not written again in the cleanup); no longer
            # kept: each result holds its shard's records, all of them together the whole dataset's.
            del futures[future]
            record(future.result())  # raises the worker's exception
    except BaseException:
        for future in futures:
            future.cancel()
        for future in futures:
            if future.cancelled():
                continue
            try:
                record(future.result())
            except BaseException:  # the first failure is the one to report; an unrecorded shard is rewritten
                continue
        raise


# ---------------------------------------------------------------- the closing summary


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def format_summary(summary: Summary, max_listed: int = 20) -> str:
    options, plan = summary.options, summary.plan
    instance = options.instance
    if summary.already_complete:
        lengths = ", ".join(f"{split} {entry['length']}" for split, entry in summary.metadata["splits"].items())
        removed = f"; removed the {STATE_DIR}/ left by an interrupted finish" if summary.leftover_state_removed else ""
        return (f"{options.target}: dataset complete: {lengths} samples; its {METADATA_FILE} records this "
                f"conversion (same options and source, plan {plan.fingerprint[:12]}), every shard and index is "
                f"there with its recorded size: nothing written{removed} (validate_dataset.py checks every byte)")
    lines = [
        f"converted {options.source} ({plan.layout} layout) -> {options.target}: format {options.format}, "
        f"shuffle {'on' if options.shuffle else 'off'}, seed {summary.seed}, "
        f"{options.samples_per_shard} samples/shard, {options.workers} worker{'s' if options.workers > 1 else ''}"
        + (f", {instance.describe()}" if instance.count > 1 else ""),
    ]
    if summary.incomplete_reason:
        lines.append(f"  {METADATA_FILE} records this conversion, but {summary.incomplete_reason}: resumed "
                     f"(shards that verify are kept)")
    processed = 0
    written_total = shards_total = bytes_total = skipped_total = 0
    for split, report in summary.reports.items():
        steps = " ".join(plan.splits[split].steps) or "none"
        kept = f", {report.kept_shards} verified shards kept from an earlier run" if report.kept_shards else ""
        lines.append(
            f"  {split:<10} {report.written:>8} samples written, {len(report.skipped)} skipped, "
            f"{report.shards - report.kept_shards} shards, {human_bytes(report.bytes)}{kept}; steps: {steps}")
        processed += report.written + len(report.skipped)
        written_total += report.written
        shards_total += report.shards - report.kept_shards
        bytes_total += report.bytes
        skipped_total += len(report.skipped)
        ignored = plan.splits[split].ignored
        if ignored:
            lines.append(f"  {split:<10} {len(ignored)} files ignored as not images, e.g. {ignored[0]['path']}")
    rate = processed / summary.elapsed if summary.elapsed > 0 else 0.0
    lines.append(
        f"  total      {written_total:>8} samples, {shards_total} shards, {human_bytes(bytes_total)}, "
        f"{skipped_total} skipped, in {summary.elapsed:.1f} s ({rate:.0f} images/s)")
    skipped = [s for r in summary.reports.values() for s in r.skipped]
    for item in skipped[:max_listed]:
        lines.append(f"  skipped: {item['path']}: {item['reason']}")
    if len(skipped) > max_listed:
        lines.append(f"  ... and {len(skipped) - max_listed} more skipped (listed in {METADATA_FILE})")
    if summary.metadata is not None:
        lengths = ", ".join(f"{split} {entry['length']}" for split, entry in summary.metadata["splits"].items())
        lines.append(f"  dataset complete: {lengths} samples; {options.target / METADATA_FILE} written")
    else:
        lines.append(
            f"  {summary.missing_shards} shards of other instances are not finished yet: the last instance to "
            f"finish writes {METADATA_FILE} (or run again with --resume once all have ended)")
    return "\n".join(lines)
