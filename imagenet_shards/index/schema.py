"""The sample index's file name and columns, declared once: the writer (imagenet_shards.index.records) writes
these columns and the reader (imagenet_shards.index.columns) requires them.

    samples-<split>.index.tsv     one tab-separated line per sample, under a header line naming the columns
                                  (named so that no side file starts with a split name: the reference loader
                                  takes every such name for a shard; datasets made before keep
                                  <split>.index.tsv, which metadata.json names)

Columns, in the order written (a reader goes by the header's names, not their places):

    key shard label record_offset record_size payload_offset payload_size payload_crc32c members [bbox]

Each is the SampleRecord field of the same name (imagenet_shards.index.records); payload_crc32c is written as
8 hex digits, bbox only when the records carry their boxes (an index without it reads as "not
recorded"). format_version stays 1: every addition is a column the header announces, and a dataset
without it stays valid as it is. The index of the pre-CRC32C version (payload_sha256 in place of
payload_crc32c) is refused with the command that re-creates it (imagenet_shards.index.earlier).
"""

from __future__ import annotations

from typing import Optional

SAMPLE_INDEX_SUFFIX = ".index.tsv"
INDEX_PREFIX = "samples-"

COLUMNS = ("key", "shard", "label", "record_offset", "record_size", "payload_offset", "payload_size",
           "payload_crc32c", "members")
CHECKSUM_COLUMN = "payload_crc32c"
BBOX_COLUMN = "bbox"  # optional: written when the records carry their boxes
INDEX_CHUNK_LINES = 4096  # lines encoded per write: the writer never holds a whole index


def sample_index_name(split: str) -> str:
    """The split's sample index file: the one place that names it."""
    return f"{INDEX_PREFIX}{split}{SAMPLE_INDEX_SUFFIX}"


def split_of_index_name(name: str) -> Optional[str]:
    """The split a sample index file name belongs to (this name or the earlier <split>.index.tsv), or None."""
    if not name.endswith(SAMPLE_INDEX_SUFFIX):
        return None
    stem = name[: -len(SAMPLE_INDEX_SUFFIX)]
    return stem.removeprefix(INDEX_PREFIX) or None


def header_columns(boxed: bool) -> tuple:
    """The columns an index of records with (boxed) or without their bbox has, in order."""
    return COLUMNS + ((BBOX_COLUMN,) if boxed else ())
