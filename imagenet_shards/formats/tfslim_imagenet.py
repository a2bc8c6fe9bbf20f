"""TF-slim's ImageNet Examples: what our TFRecord shards hold, as samples, and what their labels mean.

The data of each record (imagenet_shards.formats.tfrecord frames them) is a serialized
`tf.train.Example` (imagenet_shards.formats.tf_example) with the TF-slim ImageNet feature names
(`image/encoded`, `image/format`, `image/colorspace`, `image/channels`, `image/height`,
`image/width`, `image/class/label`, `image/class/synset`, `image/filename`) plus
`image/key`, the sample's key (TF-slim readers ignore features they do not ask for).
`TFSlimShardWriter.add_image` writes one; the tests check that the `tfrecord` package's own
reader and index tool read our shards.

Labels: we store TF-slim's convention, 1..N (0 is TF-slim's "background" class), so our
shards drop into TF-slim and TF models code unchanged; metadata.json says
`"label_offset": 1` and readers subtract it. Existing TF-slim data without metadata is
detected from its labels (`decide_label_offset`); labels are never shifted silently.

Reading: `iter_tfrecord_samples` yields webdataset-style sample dicts like `tar`'s. Shards
without a sample index are indexed by `scan_tfrecord_shard` (every record read) or
`index_tfrecord_shard` (the record headers alone).
"""

from dataclasses import dataclass
from pathlib import Path

from imagenet_shards.formats.tf_example import ExampleFormatError, example_feature_spans, example_pieces, parse_example
from imagenet_shards.formats.tfrecord import (
    FRAMING_SIZE,
    HEADER_SIZE,
    TFRecordFormatError,
    TFRecordShardWriter,
    header_entries,
    iter_tfrecord_records,
    read_tfrecord_index,
    tfrecord_index_path,
)
from imagenet_shards.index import positional_key
from imagenet_shards.errors import Error

LABEL_OFFSET = 1  # what we store: TF-slim's 1..N
TFSLIM_CLASSES = 1000  # ImageNet; TF-slim's label 0 is "background"

FEATURE_ENCODED = "image/encoded"
FEATURE_FORMAT = "image/format"
FEATURE_COLORSPACE = "image/colorspace"
FEATURE_CHANNELS = "image/channels"
FEATURE_HEIGHT = "image/height"
FEATURE_WIDTH = "image/width"
FEATURE_LABEL = "image/class/label"
FEATURE_SYNSET = "image/class/synset"
FEATURE_FILENAME = "image/filename"
FEATURE_KEY = "image/key"


# ---------------------------------------------------------------------------------------
# Writing


@dataclass(frozen=True)
class WrittenRecord:
    record_offset: int  # first byte of the record (its length field)
    record_size: int  # length field + CRC + data + CRC: copying this range copies the sample
    payload_offset: int  # the image bytes inside the record, as shard offsets
    payload_size: int
    label: int  # the label as stored (with LABEL_OFFSET added)


def imagenet_example_features(key, label, synset, image_bytes, height, width, filename, colorspace="RGB", image_format="JPEG", label_offset=LABEL_OFFSET):
    """The TF-slim ImageNet features of one image (TF-slim's build_imagenet_data.py names)."""
    channels = {"RGB": 3, "L": 1, "CMYK": 4}.get(colorspace, 3)

    def text(value):
        return value.encode() if isinstance(value, str) else bytes(value)

    return {
        FEATURE_ENCODED: (image_bytes if isinstance(image_bytes, bytes) else bytes(image_bytes), "byte"),
        FEATURE_FORMAT: (text(image_format), "byte"),
        FEATURE_COLORSPACE: (text(colorspace), "byte"),
        FEATURE_CHANNELS: (channels, "int"),
        FEATURE_HEIGHT: (int(height), "int"),
        FEATURE_WIDTH: (int(width), "int"),
        FEATURE_LABEL: (int(label) + label_offset, "int"),
        FEATURE_SYNSET: (text(synset), "byte"),
        FEATURE_FILENAME: (text(filename), "byte"),
        FEATURE_KEY: (text(key), "byte"),
    }


class TFSlimShardWriter(TFRecordShardWriter):
    """Write one shard of TF-slim ImageNet Examples: `with TFSlimShardWriter(path) as w: w.add_image(key, label, ...)`.

    A TFRecordShardWriter (hashed, published atomically with its `.tfindex`). `label` is
    0-based; the shard stores label + `label_offset` (TF-slim's 1..N).
    """

    def __init__(self, path, label_offset=LABEL_OFFSET, write_index=True):
        super().__init__(path, write_index)
        self.label_offset = label_offset

    def add_example(self, data, payload_feature=FEATURE_ENCODED):
        """Frame and write one serialized Example; return (offset, size, payload offset, payload size)."""
        payload_start, payload_size = None, 0
        if payload_feature is not None:
            kind, values = example_feature_spans(data, {payload_feature}).get(payload_feature, (None, []))
            if kind != "bytes" or len(values) != 1:
                raise ValueError(f"the Example has no single bytes feature {payload_feature!r}")
            payload_start, payload_end = values[0]
            payload_size = payload_end - payload_start
        return self.add_record(data, payload_start, payload_size)

    def add_image(self, key, label, synset, image_bytes, height, width, filename, colorspace="RGB", image_format="JPEG") -> WrittenRecord:
        """Write one image as a TF-slim ImageNet Example. `label` is 0-based."""
        if int(label) < 0:
            raise ValueError(f"sample {key!r}: label {label} is negative")
        image_bytes = image_bytes if isinstance(image_bytes, bytes) else bytes(image_bytes)
        features = imagenet_example_features(key, label, synset, image_bytes, height, width, filename, colorspace, image_format, self.label_offset)
        pieces, index = example_pieces(features, locate=FEATURE_ENCODED)
        data = b"".join(pieces)
        offset, size, payload_offset, payload_size = self.add_record(data, sum(map(len, pieces[:index])), len(image_bytes))
        return WrittenRecord(offset, size, payload_offset, payload_size, int(label) + self.label_offset)


# ---------------------------------------------------------------------------------------
# Samples


_PAYLOAD_EXTENSIONS = {"jpeg": "jpg", "jpg": "jpg", "png": "png"}
# What a sample dict is made of (the reader decodes only these features of each record).
SAMPLE_FEATURES = frozenset({FEATURE_ENCODED, FEATURE_FORMAT, FEATURE_LABEL, FEATURE_KEY, FEATURE_FILENAME})


def _text(values, default=""):
    return bytes(values[0]).decode("utf-8", "replace") if values else default


def example_key(features, source, number, offset=0):
    """The sample's key: image/key, else the stem of image/filename (TF-slim), else shard:record."""
    key = _text(features.get(FEATURE_KEY, []))
    if key:
        return key
    filename = _text(features.get(FEATURE_FILENAME, []))
    if filename:
        base = filename.rsplit("/", 1)[-1]
        return base.split(".", 1)[0] or base
    return positional_key(Path(str(source)).name, number) if number is not None else f"{Path(str(source)).name}@{offset}"


def example_to_sample(features, source, offset, number, label_offset):
    """A webdataset-style sample dict, like `tar.iter_tar_samples` gives.

    `jpg` (or `png`) holds the image bytes as a view, `cls` the 0-based label as text
    (b"17", as in our tar shards), `__label__` the same as an int. Raises
    TFRecordFormatError for a record that lacks the image or the label, or whose label
    falls below 0 once `label_offset` is taken off.
    """
    encoded = features.get(FEATURE_ENCODED)
    if not encoded or not isinstance(encoded[0], memoryview):
        raise TFRecordFormatError(source, number, offset, f"the Example has no {FEATURE_ENCODED} bytes")
    labels = features.get(FEATURE_LABEL)
    if not labels or isinstance(labels[0], (memoryview, float)):
        raise TFRecordFormatError(source, number, offset, f"the Example has no integer {FEATURE_LABEL}")
    label = labels[0] - label_offset
    if label < 0:
        raise TFRecordFormatError(source, number, offset, f"{FEATURE_LABEL} {labels[0]} minus label offset {label_offset} is negative")
    extension = _PAYLOAD_EXTENSIONS.get(_text(features.get(FEATURE_FORMAT, []), "jpeg").lower(), "jpg")
    return {
        "__key__": example_key(features, source, number, offset),
        "__url__": str(source),
        "__offset__": offset,
        "__record__": number,
        "__label__": label,
        extension: encoded[0],
        "cls": str(label).encode(),
    }


def iter_tfrecord_samples(source, label_offset, offset=0, stop_at=None, verify_crc=True, stream=None, first_record=None):
    """Sample dicts (see `example_to_sample`) of the records of one shard.

    `label_offset` is required: 1 for our shards and TF-slim's, 0 for 0-based data;
    `resolve_label_offset` decides it once, before the workers start. `first_record`: as for
    `iter_tfrecord_records` (`__record__` is None when the numbers are unknown).
    """
    number = first_record if first_record is not None or offset else 0
    for record in iter_tfrecord_records(source, offset, stop_at, verify_crc, stream, number):
        try:
            features = parse_example(record.data, SAMPLE_FEATURES)
        except ExampleFormatError as error:
            raise TFRecordFormatError(source, number, record.offset, f"not a tf.train.Example: {error}") from None
        yield example_to_sample(features, source, record.offset, number, label_offset)
        number = None if number is None else number + 1


def scan_tfrecord_shard(source, label_offset, name=None, stream=None, verify_crc=True):
    """Index a shard that has no sample index: one SampleRecord per record, read from the records.

    `name` is the shard name stored in the records (default: `source`). Keys and labels come
    from the Examples (see `example_to_sample`), so every record is read; payload hashes are
    not computed (left empty), as `shard_reader.scan_shard` does for tar.
    """
    from imagenet_shards.index import SampleRecord

    name = str(source) if name is None else name
    records = []
    for number, record in enumerate(iter_tfrecord_records(source, verify_crc=verify_crc, stream=stream)):
        try:
            spans = example_feature_spans(record.data, SAMPLE_FEATURES)
        except ExampleFormatError as error:
            raise TFRecordFormatError(source, number, record.offset, f"not a tf.train.Example: {error}") from None
        view = record.data
        features = {k: ([view[a:b] for a, b in v] if kind == "bytes" else v) for k, (kind, v) in spans.items()}
        sample = example_to_sample(features, source, record.offset, number, label_offset)
        payload_start, payload_end = spans[FEATURE_ENCODED][1][0]
        records.append(
            SampleRecord(
                sample["__key__"], name, sample["__label__"], record.offset, FRAMING_SIZE + len(view),
                record.offset + HEADER_SIZE + payload_start, payload_end - payload_start, None,
            )
        )
    return records


def index_tfrecord_shard(path, name=None):
    """SampleRecords of a local shard without a sample index, from its record framing alone.

    For existing TF-slim data: the planner needs each record's byte range, not its content, so
    only the 12-byte record headers are read (or the shard's `.tfindex`, when it exists and
    accounts for the whole file). Keys are positional ("<shard>#<n>", see `positional_key`),
    labels -1 (read from each record when it is loaded), payload ranges and hashes unknown.
    """
    from imagenet_shards.index import SampleRecord

    path = Path(path)
    name = str(path) if name is None else name
    entries = None
    index_path = tfrecord_index_path(path)
    if index_path.is_file():
        try:
            listed = read_tfrecord_index(index_path)
        except (OSError, TFRecordFormatError):
            listed = None
        contiguous = listed and listed[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(listed, listed[1:]))
        if contiguous and listed[-1][0] + listed[-1][1] == path.stat().st_size:
            entries = listed
    if entries is None:
        entries = header_entries(path)
    return [SampleRecord(positional_key(name, n), name, -1, offset, size, 0, 0, None) for n, (offset, size) in enumerate(entries)]


# ---------------------------------------------------------------------------------------
# Labels


def example_label(data):
    """The stored image/class/label of a serialized Example (None when it has none)."""
    kind, values = example_feature_spans(data, {FEATURE_LABEL}).get(FEATURE_LABEL, (None, []))
    return values[0] if kind == "int64" and values else None


def iter_stored_labels(paths, verify_crc=True, open_stream=None):
    """The stored labels of the records of shards, in order (lazily, so a scan can stop early).

    Local paths are mapped; with `open_stream`, other locations (URLs) are read through the
    stream it returns (closed when the scan moves on or stops).
    """
    for path in paths:
        stream = open_stream(path) if open_stream is not None and not Path(str(path)).is_file() else None
        try:
            for number, record in enumerate(iter_tfrecord_records(path, verify_crc=verify_crc, stream=stream)):
                label = example_label(record.data)
                if label is None:
                    raise TFRecordFormatError(path, number, record.offset, f"the Example has no integer {FEATURE_LABEL}")
                yield label
        finally:
            if stream is not None:
                stream.close()


@dataclass(frozen=True)
class LabelOffset:
    offset: int  # subtract this from stored labels to get 0-based class indices
    reason: str  # one line for the user: which offset, and why

    def __str__(self):
        return self.reason


class LabelOffsetError(Error, ValueError):
    """The labels do not say whether they start at 0 or at 1."""


def decide_label_offset(labels, num_classes=None) -> LabelOffset:
    """Tell 0-based labels from TF-slim's 1-based ones, reading `labels` only as far as needed.

    A label 0 means 0-based (TF-slim never stores its background class 0 in ImageNet data);
    a label equal to the class count (`num_classes`, else TF-slim's 1000) means 1-based,
    since 0-based labels stop at count - 1. If neither ever appears, the labels cannot tell
    and LabelOffsetError asks for an explicit offset: a wrong guess would shift every label.
    """
    top = num_classes or TFSLIM_CLASSES
    count, low, high = 0, None, None
    for label in labels:
        count += 1
        low = label if low is None else min(low, label)
        high = label if high is None else max(high, label)
        if label < 0 or label > top:
            raise LabelOffsetError(f"stored label {label} is outside 0..{top}: not {top}-class data; give the class count or the label offset explicitly")
        if label == 0:
            return LabelOffset(0, f"label offset 0: a stored label is 0, so the labels are already 0-based (after {count} records)")
        if label == top:
            return LabelOffset(
                1, f"label offset 1 (TF-slim convention): a stored label is {top} = the class count and none is 0, so labels 1..{top} become 0..{top - 1} (after {count} records)"
            )
    if count == 0:
        raise LabelOffsetError("no records to read labels from; give the label offset explicitly")
    raise LabelOffsetError(
        f"cannot tell whether the labels start at 0 or at 1: the {count} records hold labels {low}..{high}, "
        f"never 0 and never the class count {top}; give the label offset explicitly (1 for TF-slim data, 0 for 0-based)"
    )


def resolve_label_offset(paths=(), metadata=None, explicit=None, num_classes=None, verify_crc=True, open_stream=None) -> LabelOffset:
    """The label offset to apply, and why: explicit > metadata.json's `label_offset` > detection.

    Callers print `.reason`, so which offset was applied is never silent.
    """
    if explicit is not None:
        if explicit not in (0, 1):
            raise LabelOffsetError(f"label offset {explicit} is neither 0 nor 1")
        stored = (metadata or {}).get("label_offset")
        note = f" (metadata.json says {stored})" if stored is not None and stored != explicit else ""
        return LabelOffset(int(explicit), f"label offset {explicit}: given explicitly{note}")
    if metadata is not None and "label_offset" in metadata:
        return LabelOffset(int(metadata["label_offset"]), f"label offset {metadata['label_offset']}: from metadata.json")
    if num_classes is None and metadata is not None and metadata.get("classes"):
        num_classes = len(metadata["classes"])
    return decide_label_offset(iter_stored_labels(paths, verify_crc, open_stream), num_classes)
