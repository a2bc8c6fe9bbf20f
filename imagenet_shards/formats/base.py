"""What every on-disk format provides: the contract a registry entry fulfils.

A format is one `ShardFormat` instance, registered by name in `imagenet_shards.formats` (the only place
where a format name becomes code). The converter, validator, repartitioner, loader and host
benchmark ask the registry for the format and call these methods; none of them branches on a
format's name.

    writing       shard_name, open_writer -> writer.add_sample(EncodedSample) -> SampleRecord,
                  encode_image (the payload of a decoded image), metadata_fields
    reading       read_run, read_positions (rows of one shard, from whatever bytes hold it: runs.py),
                  iter_samples (sample dicts of a byte range: what the default readers stream)
    checking      check_shard (structure and checksums of one shard, against the index)
    repartition   open_writer(...).add_raw_record, finished_size, record_alignment, describe_damage
    foreign data  claims_location / find_foreign_shards / index_foreign_shards (shards without
                  metadata.json, e.g. TF-slim's own TFRecords)

Each format module's docstring (or docs/on-disk-format.md) describes its bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from imagenet_shards.errors import Error


class ShardDataError(Error):
    """A shard's bytes are not what its format says (truncated, corrupt, not this format).
    Every format's reader raises a subclass, so callers catch one type.

    `record_offset`: set (the damaged record's first byte) when the damage is inside one record whose
    framing is intact, so a reader that knows where the next record starts may go on there."""

    record_offset = None


class ForeignShardsError(Error, ValueError):
    """Shards without metadata that cannot be used as they are (names what is wrong)."""


@dataclass(frozen=True)
class EncodedSample:
    """One sample as the converter hands it to every format's writer (the same for all formats).

    `info` is the sample's description (source, class, sizes, steps, quirks); `payload` the
    image's bytes as the format stores them (JPEG or .npy, from `ShardFormat.encode_image`).
    """

    key: str
    label: int
    class_name: str
    source: str  # the source file (or archive member) the sample came from
    info: dict
    payload: bytes


class ShardFormat:
    """Base class of a registered format; subclasses fill in what differs."""

    name: str = ""  # metadata.json's "format"
    description: str = ""
    payload_extension: str = "jpg"  # the payload's key in sample dicts ("jpg" or "npy")
    stores_jpeg: bool = True  # payload is a JPEG: passthrough possible, held against the decode ceiling
    label_offset: int = 0  # stored label - label_offset = class index
    record_alignment: int = 1  # a copied record must start at a multiple of this (tar: 512)
    remainder_suffix: str = ""  # a repartition's remainder shard: <split>-remainder-NNNN<suffix>
    default_steps: dict = {}  # split -> conversion steps when none are given (tensor: a fixed size)
    records_are_byte_ranges: bool = True  # a SampleRecord's record range is a byte range of the shard file
    reads_streams: bool = True  # a shard can be read from a byte stream (a URL, the shard cache); LMDB maps files
    # The reference harness's loader (Graphcore's webdataset_format.py) reads these shards: a repartition
    # also writes the remainder files that loader reads (imagenet_shards.reference.remainders).
    reference_loader_reads: bool = False

    # ------------------------------------------------------------------ names
    def shard_name(self, split: str, number: int, count: int) -> str:
        raise NotImplementedError

    def is_shard_file(self, name: str) -> bool:
        """A shard of this format, its companion file, or a partial one of either."""
        raise NotImplementedError

    def shard_of_file(self, name: str) -> str:
        """The shard a shard file or companion file belongs to (the name itself for a shard)."""
        return name

    def companions(self, shard_name: str) -> tuple:
        """Files published beside a shard (e.g. a TFRecord shard's .tfindex)."""
        return ()


    # ------------------------------------------------------------------ writing
    def open_writer(self, path: Path):
        """A context manager that publishes the shard atomically on a clean exit. It has
        `add_sample(EncodedSample, shard_name) -> SampleRecord`, `add_raw_record(bytes) -> offset`
        (repartition copies), and `.samples`, `.bytes_written`, `.sha256` after the write."""
        raise NotImplementedError

    def order_in_shard(self, samples):
        """The order a shard's samples are written in (the converter's order unless the format's
        reads need another, e.g. LMDB's sorted keys)."""
        return samples

    def read_record(self, path: Path, record) -> bytes:
        """One sample's whole record, for a repartition copy (formats whose records are not byte
        ranges of the file; the others are read with one pread)."""
        raise NotImplementedError

    def finished_size(self, record_bytes: int) -> int:
        """A shard's size once written, for records totalling `record_bytes`."""
        return record_bytes

    def encode_image(self, image, quality: int) -> bytes:
        """The payload of an RGB PIL image: a JPEG at `quality` (formats that store tensors override)."""
        import io

        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=quality)
        return buffer.getvalue()

    def estimated_payload_bytes(self, source_bytes: int, fixed_size) -> int:
        """A payload's size from its source's size (for shard planning): JPEG passthrough keeps it."""
        return source_bytes

    def metadata_fields(self) -> dict:
        """Extra metadata.json fields this format needs its readers to know."""
        return {}

    # ------------------------------------------------------------------ reading
    def iter_samples(self, location: str, start: int, stop: Optional[int], stream=None,
                     label_offset: int = 0, verify_crc: bool = True) -> Iterator[dict]:
        """Sample dicts (`__key__`, `__offset__`, payload extension, `cls`) from byte `start` to `stop`;
        verify_crc=False skips the format's own record checksums, if it has any."""
        raise NotImplementedError

    def read_sample(self, location: str, record, label_offset: int = 0) -> dict:
        """One local sample's dict (as `iter_samples` gives it) looked up by its record, for formats whose
        records are not byte ranges (`records_are_byte_ranges` False; the others are read by range)."""
        raise NotImplementedError

    def read_run(self, shard, columns, rows, how=None) -> Iterator[tuple]:
        """Rows of one shard that follow each other in it (a run: one sequential read) from the bytes `shard`
        (a runs.ShardBytes: the local file, a URL, the shard cache's entry or fill) names: a runs.RowRead per
        row, in order; `how` a runs.RowReading (formats/runs.py). `runs.stream_rows` streams the run's byte
        range through `iter_samples`: what a format without a faster way returns."""
        raise NotImplementedError

    def read_positions(self, shard, columns, rows, how=None) -> Iterator[tuple]:
        """Rows of one shard in any order (the global order's positions): a runs.RowRead per row, in the order
        given. `runs.positions_as_runs` reads the runs the rows happen to form, each with `read_run`."""
        raise NotImplementedError

    # ------------------------------------------------------------------ checking
    def check_shard(self, task):
        """Every check of one shard (a `shard_check.ShardTask`) -> `shard_check.ShardResult`."""
        raise NotImplementedError

    def describe_damage(self, path: Path) -> str:
        """What the format's own checks say about a shard whose hash differs ("" when nothing)."""
        return ""

    # ------------------------------------------------------------------ shards without metadata
    def claims_location(self, location: str) -> bool:
        """Whether a shard location without metadata is of this format (by its name)."""
        return False

    def find_foreign_shards(self, folder: Path, split: str) -> list:
        """This format's shards of `split` in a folder that has no metadata.json."""
        return []

    def index_foreign_shards(self, locations: list, label_offset: Optional[int], open_range: Callable):
        """(groups of SampleRecords, label_offset, what was done) for shards without a sample index.
        `open_range(location)` opens a remote shard as a stream, None for a local file."""
        raise NotImplementedError

    def __repr__(self):
        return f"<format {self.name}>"
