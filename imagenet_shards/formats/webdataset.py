"""The `img` and `tensor` formats: WebDataset tar shards of JPEG or uint8 .npy payloads.

Bytes (see imagenet_shards.formats.tar for the container): `<split>-%06d.tar`, each sample three
members in this order, all under the sample's key:

    <key>.cls    the class index, ASCII decimal
    <key>.json   the sample's description (source, class, sizes, steps, quirks), sorted keys
    <key>.jpg    img: the JPEG (source bytes when passed through, else re-encoded)
    <key>.npy    tensor: a uint8 HWC array in .npy format (imagenet_shards.formats.npy)

A sample's SampleRecord spans its first header to the end of its last member's padding, so a
repartition copies it byte for byte with `add_raw_record`.
"""

from __future__ import annotations

import json
import re
from typing import Iterator, Optional

import numpy as np

from imagenet_shards.formats.base import EncodedSample, ShardFormat
from imagenet_shards.formats.mapped_shards import lend_payload, mapped_shard
from imagenet_shards.formats.npy import encode_npy
from imagenet_shards.formats.runs import PLAIN, RowRead, positions_as_runs, stream_rows
from imagenet_shards.formats.tar import BLOCK, TarShardWriter, iter_tar_samples, read_member
from imagenet_shards.formats.tar_check import check_tar_shard
from imagenet_shards.index import SampleRecord, payload_crc32c

SHARD_FILE = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<number>\d{6})\.tar(?P<partial>\.partial)?$")
TENSOR_LAYOUT = "HWC"
# Estimate of a tensor payload when the steps give no fixed size: about what JPEG compresses away.
TENSOR_BYTES_PER_SOURCE_BYTE = 8


def tar_shard_name(split: str, number: int) -> str:
    return f"{split}-{number:06d}.tar"



def sample_members(label: int, info: dict, payload_extension: str, payload: bytes):
    """The tar members of one sample, in the contract's order."""
    info_bytes = json.dumps(info, sort_keys=True, separators=(",", ":")).encode()
    return [("cls", str(label).encode()), ("json", info_bytes), (payload_extension, payload)]


class TarSampleWriter(TarShardWriter):
    """A tar shard writer that takes encoded samples (the format-level `add_sample`)."""

    def __init__(self, path, payload_extension: str):
        super().__init__(path)
        self.payload_extension = payload_extension

    def add_sample(self, sample: EncodedSample, shard_name: str) -> SampleRecord:
        written = self.add_members(sample.key, sample_members(sample.label, sample.info, self.payload_extension,
                                                              sample.payload))
        payload_member = written.members[self.payload_extension]
        return SampleRecord(
            key=sample.key, shard=shard_name, label=sample.label,
            record_offset=written.record_offset, record_size=written.record_size,
            payload_offset=payload_member.data_offset, payload_size=payload_member.size,
            payload_crc32c=payload_crc32c(sample.payload),
            members=";".join(f"{ext}:{m.header_offset}" for ext, m in written.members.items()),
        )


def _truncated(location, size: int, key: str, start: int, end: int) -> str:
    return f"TarFormatError: {location}: truncated: the shard is {size} bytes, sample {key!r} needs bytes {start}-{end}"


def _name_mismatch(view, header: int, name: bytes) -> Optional[str]:
    """None if the member header at `header` carries `name` (<key>.<ext>; its first 100 bytes for a
    long name), else the reason."""
    stored = bytes(view[header:header + 100]).split(b"\0", 1)[0]
    if stored == name or (len(name) >= 100 and stored == name[:100]):
        return None
    # Escaped, ASCII only (bytes' repr without its b): a hostile shard's bytes never reach a terminal raw.
    return (f"at byte {header} the shard holds {repr(stored)[1:]}, its index says "
            f"{repr(name)[1:]}: the shard does not match its index")


def mapped_rows(shard, columns, rows, how) -> Iterator[RowRead]:
    """The tar formats' reader of a local shard, for runs and positions alike: a RowRead per row, from the
    index's columns (payload offset and size, its member's header offset and extension), without building a
    record or parsing members: the loader's per-sample path.

    The shard is mapped once (formats/mapped_shards.py) and each payload is a zero-copy slice of the map
    (a copy where `shard.copied`). What is checked per sample: the sample lies inside the file (a truncated
    shard is reported, for this and every later sample), and the payload member's header carries the
    expected name `<key>.<ext>` (a shard that does not match its index is an error). Header checksums are
    not verified here (the streamed path and validate_dataset.py do)."""
    location, labels = shard.location, columns.labels
    try:
        size, view = mapped_shard(location)
    except OSError as error:
        reason = f"cannot read the shard: {error.strerror or error}"
        for row in rows.tolist():
            yield RowRead(row, None, None, int(labels[row]), None, reason)
        return
    starts = columns.record_offsets[rows]
    payloads, headers = columns.payload_deltas(rows, starts)  # from the record's offset (the index holds these)
    fields = zip(rows.tolist(), starts.tolist(), (starts + columns.record_sizes[rows]).tolist(),
                 payloads.tolist(), columns.payload_sizes[rows].tolist(), headers.tolist(),
                 columns.payload_exts[rows].tolist(), labels[rows].tolist())
    exts = [ext.encode() for ext in columns.exts]
    keys, key_offsets = columns.keys, columns.key_offsets
    copied, with_info = shard.copied, how.with_info
    for row, start, end, payload, length, header, ext, label in fields:
        payload, header = start + payload, start + header
        if end > size:
            reason = _truncated(location, size, columns.key(row), start, end)
        elif header < 0:
            reason = f"the index lists no payload member for {columns.key(row)!r} ({columns.members(row)})"
        else:
            key = keys[key_offsets[row]:key_offsets[row + 1]].tobytes()
            reason = _name_mismatch(view, header, key + b"." + exts[ext])
        if reason is not None:
            yield RowRead(row, None, None, label, None, reason)
            continue
        info = read_member(location, columns.record(row), "json") if with_info else None
        data = bytes(view[payload:payload + length]) if copied else lend_payload(view, payload, payload + length)
        yield RowRead(row, columns.exts[ext], data, label, info, None)


class WebDatasetFormat(ShardFormat):
    record_alignment = BLOCK
    remainder_suffix = ".tar"
    reference_loader_reads = True  # img: .cls, .jpg, .json with "bbox", as the reference writes them

    def __init__(self, name, payload_extension, description):
        self.name = name
        self.payload_extension = payload_extension
        self.stores_jpeg = payload_extension == "jpg"
        self.description = description

    def shard_name(self, split, number, count):
        return tar_shard_name(split, number)

    def is_shard_file(self, name):
        return bool(SHARD_FILE.match(name))

    def open_writer(self, path):
        return TarSampleWriter(path, self.payload_extension)

    def finished_size(self, record_bytes):
        return TarShardWriter.finished_size(record_bytes)

    def iter_samples(self, location, start, stop, stream=None, label_offset=0, verify_crc=True):
        return iter_tar_samples(location, offset=start, stop_at=stop, stream=stream)

    def read_run(self, shard, columns, rows, how=PLAIN):
        if shard.local and len(rows) and columns.members(rows[0]):  # the index says where each member is
            return mapped_rows(shard, columns, rows, how)
        return stream_rows(self, shard, columns, rows, how)

    def read_positions(self, shard, columns, rows, how=PLAIN):
        if shard.local and len(rows) and columns.members(rows[0]):
            return mapped_rows(shard, columns, rows, how)
        return positions_as_runs(self, shard, columns, rows, how)

    def check_shard(self, task):
        return check_tar_shard(task)


_npy_headers = {}  # (height, width) -> .npy header of a uint8 HWC array of that shape
_tensor_buffer = bytearray()


def tensor_npy(image) -> memoryview:
    """The uint8 HWC .npy of an RGB PIL image: encode_npy's exact bytes, built without numpy.

    The bytes are written into one buffer reused from sample to sample, valid until the next
    call: allocating ~150 KB per sample costs more than the copy itself (fresh pages fault in),
    and numpy's round trip (asarray + np.save) costs ~7x the raw copy.
    """
    global _tensor_buffer
    key = (image.height, image.width)
    header = _npy_headers.get(key)
    if header is None:
        probe = np.zeros((image.height, image.width, 3), dtype=np.uint8)
        header = _npy_headers[key] = encode_npy(probe)[: -probe.size]
    size = len(header) + image.height * image.width * 3
    if len(_tensor_buffer) != size:
        _tensor_buffer = bytearray(size)
    _tensor_buffer[: len(header)] = header
    _tensor_buffer[len(header):] = image.tobytes()
    return memoryview(_tensor_buffer)


class TensorFormat(WebDatasetFormat):
    reference_loader_reads = False  # .npy HWC: the reference reads .pth (torch.save of CHW)
    # Train keeps 256x256 so the loader's RandomResizedCrop still has room.
    default_steps = {"train": ("Resize(256)", "CenterCrop(256)"), "validation": ("Resize(256)", "CenterCrop(224)")}

    def encode_image(self, image, quality):
        return tensor_npy(image)

    def estimated_payload_bytes(self, source_bytes, fixed_size):
        if fixed_size is not None:
            return fixed_size[0] * fixed_size[1] * 3 + 128  # .npy header: 128 bytes for these shapes
        return source_bytes * TENSOR_BYTES_PER_SOURCE_BYTE

    def metadata_fields(self):
        return {"tensor_layout": TENSOR_LAYOUT}


IMG = WebDatasetFormat("img", "jpg", "WebDataset tar shards of JPEG")
TENSOR = TensorFormat("tensor", "npy", "WebDataset tar shards of uint8 .npy")
