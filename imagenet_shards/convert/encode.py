"""Encode and write one whole shard: source samples -> payloads -> the format's writer (in a worker).

Contract: write_shard(target, ShardToWrite) writes exactly one shard, whose bytes depend only on
its samples and EncodeOptions (so any process may write any shard), published under its final
name only when complete (the format's writer: <name>.partial, fsync, rename), and returns a
WrittenShard with its records; or keeps an earlier run's shard whose sha256 and size match the
plan's record. A sample that cannot be converted is skipped and listed (SampleFailure with
--on-error fail); a failed write is a WriteFailure naming the file. Everything here is picklable.

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

Other formats (--format, from the registry in imagenet_shards/formats/): the same samples, payloads and
guarantees in their own containers; each format's module says what its bytes are and what it
adds to metadata.json (e.g. a label offset). The sample index and metadata are as for tar.
"""

import io
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from imagenet_shards.convert.failures import SampleFailure, SampleSkipped, writing
from imagenet_shards.fileio import sha256_file
from imagenet_shards.formats import EncodedSample, get_format
from imagenet_shards.index import ShardRecord
from imagenet_shards.preprocess import apply_steps, parse_steps

EXIF_ORIENTATION = 0x0112
JPEG_FORMATS = ("JPEG", "MPO")  # MPO: a camera JPEG with extra frames; decoders read its first frame
GRAYSCALE_MODES = ("1", "L", "LA", "I", "I;16", "F")


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
    samples: tuple  # SourceSample, in shard order (in the main process a ListingRows: pickled, this tuple)
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
