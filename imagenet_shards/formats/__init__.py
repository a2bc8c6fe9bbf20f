"""The on-disk formats, by name: the one place where a format name becomes code.

    from imagenet_shards.formats import get_format
    fmt = get_format(metadata["format"])        # a imagenet_shards.formats.base.ShardFormat
    with fmt.open_writer(path) as writer:
        record = writer.add_sample(encoded_sample, shard_name)

Adding a format is a module with one `ShardFormat` instance (see base.py for the contract)
and one entry in `FORMATS` below; no caller changes.

Modules by registry name: img and tensor are webdataset.py (WebDataset tars), tfrecord is tfslim.py
(TF-slim's ImageNet TFRecords, on tfrecord.py's framing), lmdb is lmdb_format.py (not lmdb.py, which
would shadow the lmdb package).
"""

from __future__ import annotations

from imagenet_shards.formats.base import EncodedSample, ForeignShardsError, ShardDataError, ShardFormat
from imagenet_shards.formats.lmdb_format import LMDB
from imagenet_shards.formats.tfslim import TFRECORD
from imagenet_shards.formats.webdataset import IMG, TENSOR
from imagenet_shards.errors import Error

FORMATS = {fmt.name: fmt for fmt in (IMG, TENSOR, TFRECORD, LMDB)}
DEFAULT_FOREIGN_FORMAT = IMG  # shards without metadata that no format claims by name are tar


class UnknownFormatError(Error, ValueError):
    """A format name that no registered format has."""


def format_names() -> tuple:
    return tuple(FORMATS)


def get_format(name) -> ShardFormat:
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise UnknownFormatError(f"unknown format {name!r} (known: {', '.join(FORMATS)})") from None


def payload_extension_of(metadata: dict) -> str:
    """The payload member's extension in a dataset's samples: metadata's `payload_extension` (an
    adopted reference tensor dataset stores .pth), else its format's."""
    fmt = FORMATS.get(metadata.get("format"))
    return metadata.get("payload_extension") or (fmt.payload_extension if fmt else "jpg")


def format_claiming(location):
    """The format that recognises a shard without metadata by its name, or None."""
    for fmt in FORMATS.values():
        if fmt.claims_location(location):
            return fmt
    return None


def format_for_location(location) -> ShardFormat:
    """The format of a shard without metadata, from its name (tar unless a format claims it)."""
    return format_claiming(location) or DEFAULT_FOREIGN_FORMAT


def is_any_shard_file(name: str) -> bool:
    """A shard, a shard's companion file, or a partial one, of any format."""
    return any(fmt.is_shard_file(name) for fmt in FORMATS.values())


__all__ = ["EncodedSample", "ForeignShardsError", "FORMATS", "ShardDataError", "ShardFormat", "UnknownFormatError",
           "format_claiming", "format_for_location", "format_names", "get_format", "is_any_shard_file", "payload_extension_of"]
