"""The `tfrecord` format: TF-slim ImageNet TFRecords of JPEG payloads.

Bytes: imagenet_shards.formats.tfrecord (record framing with masked CRC32C, shard names, `.tfindex`),
imagenet_shards.formats.tf_example (the tf.train.Example wire format) and
imagenet_shards.formats.tfslim_imagenet (TF-slim's feature names, labels stored 1..N, samples,
label-offset detection). Shards are named as TF-slim names them, `<split>-00000-of-01024`, each
published with its `<shard>.tfindex` (the tfrecord package's index). metadata.json says
`"label_offset": 1`; readers subtract it.

Shards without metadata (TF-slim's own ImageNet conversion) are recognised by name and indexed
from their record headers.
"""

from __future__ import annotations

import re

from imagenet_shards.formats.base import EncodedSample, ForeignShardsError, ShardFormat
from imagenet_shards.formats.runs import PLAIN, positions_as_runs, stream_rows
from imagenet_shards.formats.tfrecord import (
    INDEX_SUFFIX,
    TFRecordFormatError,
    TFRecordShardWriter,
    describe_damage,
    find_tfrecord_shards,
    is_tfrecord_location,
    tfrecord_shard_name,
)
from imagenet_shards.formats.tfrecord_check import check_tfrecord_shard
from imagenet_shards.formats.tfslim_imagenet import (
    LABEL_OFFSET,
    LabelOffsetError,
    TFSlimShardWriter,
    index_tfrecord_shard,
    iter_tfrecord_samples,
    resolve_label_offset,
    scan_tfrecord_shard,
)
from imagenet_shards.index import SampleRecord, payload_crc32c

# TF-slim shard names, and each shard's index file
SHARD_FILE = re.compile(r"^(?P<shard>[A-Za-z0-9_]+-\d{5}-of-\d{5})(?P<index>\.tfindex)?(?P<partial>\.partial)?$")


class TFRecordSampleWriter(TFSlimShardWriter):
    """A TF-slim shard writer that takes encoded samples (the format-level `add_sample`)."""

    def add_sample(self, sample: EncodedSample, shard_name: str) -> SampleRecord:
        info = sample.info
        width, height = info.get("output_width", info["width"]), info.get("output_height", info["height"])
        written = self.add_image(sample.key, sample.label, sample.class_name, sample.payload, height, width,
                                 sample.source.rsplit("/", 1)[-1].rsplit(":", 1)[-1])
        return SampleRecord(
            key=sample.key, shard=shard_name, label=sample.label,
            record_offset=written.record_offset, record_size=written.record_size,
            payload_offset=written.payload_offset, payload_size=written.payload_size,
            payload_crc32c=payload_crc32c(sample.payload))


class TFRecordFormat(ShardFormat):
    name = "tfrecord"
    description = "TFRecord shards of JPEG (tf.train.Example)"
    label_offset = LABEL_OFFSET
    remainder_suffix = ".tfrecord"

    def shard_name(self, split, number, count):
        return tfrecord_shard_name(split, number, count)

    def is_shard_file(self, name):
        return bool(SHARD_FILE.match(name))

    def shard_of_file(self, name):
        match = SHARD_FILE.match(name)
        if match and match["index"] and not match["partial"]:
            return match["shard"]
        return name

    def companions(self, shard_name):
        return (shard_name + INDEX_SUFFIX,)

    def open_writer(self, path):
        return TFRecordSampleWriter(path)

    def finished_size(self, record_bytes):
        return TFRecordShardWriter.finished_size(record_bytes)


    def metadata_fields(self):
        return {"label_offset": LABEL_OFFSET}

    def iter_samples(self, location, start, stop, stream=None, label_offset=0, verify_crc=True):
        return iter_tfrecord_samples(location, label_offset, offset=start, stop_at=stop, stream=stream,
                                     verify_crc=verify_crc)

    def read_run(self, shard, columns, rows, how=PLAIN):
        return stream_rows(self, shard, columns, rows, how)  # records framed and CRC-checked as they stream

    def read_positions(self, shard, columns, rows, how=PLAIN):
        return positions_as_runs(self, shard, columns, rows, how)

    def check_shard(self, task):
        return check_tfrecord_shard(task)

    def describe_damage(self, path):
        return describe_damage(path)

    def claims_location(self, location):
        return is_tfrecord_location(location)

    def find_foreign_shards(self, folder, split):
        try:
            return find_tfrecord_shards(folder, split)
        except TFRecordFormatError as error:
            raise ForeignShardsError(str(error)) from None

    def index_foreign_shards(self, locations, label_offset, open_range):
        """Index TF-slim shards by their framing; the label offset given, or detected from the stored
        labels. `open_range(location)` opens a remote shard as a stream (None: a local file)."""
        groups = []
        try:
            for location in locations:
                stream = open_range(location)
                if stream is not None:  # no cheap header walk remotely: one streamed pass over the shard
                    with stream:
                        records = [r._replace(label=-1)  # labels are read (with the offset) when loaded
                                   for r in scan_tfrecord_shard(location, 0, name=location, stream=stream)]
                else:
                    records = index_tfrecord_shard(location, name=location)
                if records:
                    groups.append(records)
            decision = resolve_label_offset(locations, explicit=label_offset, open_stream=open_range)
        except (TFRecordFormatError, LabelOffsetError) as error:
            raise ForeignShardsError(f"{len(locations)} TFRecord shards: {error}") from None
        reason = (f"{len(locations)} TFRecord shards without metadata: indexed from their record headers; "
                  f"{decision.reason}")
        return groups, decision.offset, reason


TFRECORD = TFRecordFormat()
