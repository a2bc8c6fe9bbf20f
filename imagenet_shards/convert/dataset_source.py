"""A converted dataset as a conversion source: another format or resolution without the original images.

    python create_webdataset.py --source /data/imagenet-img --target /data/imagenet-tensor --format tensor
    python create_webdataset.py --source s3://bucket/imagenet-img --target /data/img-160 --format img \\
        --train-preprocess-steps "Resize(160)"

`open_any_source` is the converter's one entry point for listing a source: a folder holding
metadata.json, or any http(s)://, s3:// location (the ImageNet layouts are local folders), is read
here; everything else by imagenet_shards.convert.imagenet_source. The listing is the parent's sample index
(never its shards): per split, every sample's key, label, class and bounding box, and where its
JPEG lies. Each worker then reads a payload by its byte range (one pread or ranged GET), checks it
against the CRC32C the index records, and the converter treats it as any source image: an RGB JPEG
with no steps passes through byte for byte, anything else is decoded and encoded as the target asks.
So keys, labels, boxes and the split membership are the parent's, and --seed, --resume, --workers
and several instances behave as for a conversion from the original folders.

Parents: every format whose payload is a JPEG (img, tfrecord, lmdb; LMDB shards read locally). A
`tensor` parent is refused: its payloads are decoded arrays (derive from the img dataset). The
metadata.json written records `derived_from`: the parent's location, format, metadata.json sha256,
reference checksum and plan fingerprint.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import crc32c
import numpy as np

from imagenet_shards.convert.imagenet_source import ImageNetSource, ImageNetSourceError, SourceSplit, open_source
from imagenet_shards.convert.source_listing import ListingBuilder
from imagenet_shards.fileio import pread_range, sha256_bytes
from imagenet_shards.formats import UnknownFormatError, get_format, payload_extension_of
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.errors import DatasetError
from imagenet_shards.index import parse_metadata, sample_index_name
from imagenet_shards.safe_names import is_plain_name, redact
from imagenet_shards.reference import ReferenceMetadataError
from imagenet_shards.index import parse_sample_columns
from imagenet_shards.storage import ShardReadError, StorageUnavailable, is_url, join_location, open_byte_range, read_bytes

LAYOUT = "dataset"  # metadata.json's source_layout of a derived dataset


def is_dataset_source(location) -> bool:
    """Whether `--source` names a converted dataset (a folder with metadata.json, or a URL)."""
    text = str(location)
    return is_url(text) or (Path(text) / METADATA_FILE).is_file()


def open_any_source(location, splits, layout="auto", sizes=False) -> ImageNetSource:
    """The converter's listing of `--source`: a converted dataset here, ImageNet's layouts in imagenet_source."""
    if is_dataset_source(location):
        return open_dataset_source(str(location), splits)
    return open_source(location, splits, layout, sizes=sizes)


@dataclass(frozen=True, slots=True)
class DatasetBytes:
    """One parent sample's payload: `record` (a SampleRecord) of the shard at `location`."""

    location: str
    record: tuple
    format_name: str

    def read(self) -> bytes:
        record, fmt = self.record, get_format(self.format_name)
        if not fmt.records_are_byte_ranges:  # e.g. LMDB: the value looked up by key
            try:
                sample = fmt.read_sample(self.location, record)
            except DatasetError as error:
                raise OSError(str(error)) from None
            data = bytes(sample[fmt.payload_extension])
        elif is_url(self.location):
            with open_byte_range(self.location, record.payload_offset,
                                 record.payload_offset + record.payload_size) as stream:
                data = stream.read(record.payload_size)
        else:
            data = pread_range(self.location, record.payload_size, record.payload_offset)
        if len(data) != record.payload_size:
            raise OSError(f"{self.location}: truncated: sample {record.key!r} needs {record.payload_size} bytes "
                          f"at byte {record.payload_offset}, {len(data)} read")
        if record.payload_crc32c is not None and crc32c.crc32c(data) != record.payload_crc32c:
            raise OSError(f"{self.location}: sample {record.key!r}: payload CRC32C differs from the sample index")
        return data


class ParentRecords:
    """A listing's locator for a parent dataset: the `extra` column is the sample's row in the parent's
    index columns (kept by this object: ~70 bytes a sample)."""

    def __init__(self, base: str, columns, format_name: str):
        self.base, self.columns, self.format_name = base, columns, format_name

    def locate(self, row, source, size, extra) -> DatasetBytes:
        record = self.columns.record(extra)
        return DatasetBytes(join_location(self.base, record.shard), record, self.format_name)


def open_dataset_source(base: str, splits) -> ImageNetSource:
    """List the parent's samples of `splits` from its sample indexes. Raises ImageNetSourceError."""
    metadata_location = join_location(base, METADATA_FILE)
    try:
        data = read_bytes(metadata_location)
        metadata = parse_metadata(data, metadata_location)
        fmt = get_format(metadata["format"])
    except FileNotFoundError:
        raise ImageNetSourceError(f"--source {base}: not a converted dataset ({METADATA_FILE} is missing)",
                                  usage=True) from None
    except ReferenceMetadataError as error:
        raise ImageNetSourceError(f"{error}; then derive from it", usage=True) from None
    except (DatasetError, UnknownFormatError, OSError, ShardReadError) as error:
        raise ImageNetSourceError(f"--source {base}: {error}") from None
    except StorageUnavailable as error:
        raise ImageNetSourceError(f"--source {base}: {error}") from None
    if not fmt.stores_jpeg or payload_extension_of(metadata) != "jpg":
        raise ImageNetSourceError(f"--source {base}: a {metadata['format']} dataset stores decoded arrays, not "
                                  f"images; derive from the dataset it was made from (img, tfrecord or lmdb)",
                                  usage=True)
    classes = list(metadata["classes"])
    listed = {}
    for split in splits:
        if split not in metadata["splits"]:
            raise ImageNetSourceError(f"{metadata_location}: no split {split!r} (it has "
                                      f"{', '.join(metadata['splits'])}); choose with --splits", usage=True)
        listed[split] = SourceSplit(split, _split_samples(base, metadata, split, fmt, classes))
    provenance = {"derived_from": {"source": redact(base), "format": metadata["format"],
                                   "metadata_sha256": sha256_bytes(data),
                                   "checksum": metadata.get("checksum"),
                                   "plan_fingerprint": metadata.get("plan_fingerprint")}}
    return ImageNetSource(base, LAYOUT, classes, listed, provenance=provenance)


def _split_samples(base: str, metadata: dict, split: str, fmt, classes: list):
    """The split's SourceListing, in the canonical order a listing has (class, then source)."""
    name = (metadata["splits"][split].get("index") or {}).get("name", sample_index_name(split))
    location = join_location(base, name)
    try:
        columns = parse_sample_columns(io.BytesIO(read_bytes(location)), location)
    except (DatasetError, OSError, ShardReadError, StorageUnavailable) as error:
        raise ImageNetSourceError(f"{location}: {error}") from None
    unsafe = next((name for name in columns.shard_names if not is_plain_name(name)), None)
    if unsafe is not None:  # never a path or URL outside the parent dataset (imagenet_shards.safe_names)
        raise ImageNetSourceError(f"{location}: unsafe shard name {unsafe!r} (not a plain file name: a path, "
                                  f"`..` or a URL); a hostile or damaged index")
    outside = np.flatnonzero((columns.labels < 0) | (columns.labels >= len(classes)))
    if outside.size:
        row = int(outside[0])
        raise ImageNetSourceError(f"{location}: sample {columns.key(row)!r} has label {int(columns.labels[row])}, "
                                  f"outside the {len(classes)} classes of {METADATA_FILE}")
    samples = ListingBuilder(classes, ParentRecords(base, columns, fmt.name))
    for row, (label, size) in enumerate(zip(columns.labels.tolist(), columns.payload_sizes.tolist())):
        key, shard = columns.key(row), columns.shard(row)
        samples.add(key, label, f"{shard}:{key}.jpg", size, row, columns.box(row))
    return samples.finish()
