"""The one place that knows the pre-CRC32C sample index, and the command that re-creates it.

The earlier version's index recorded each payload's sha256 in a `payload_sha256` column where this one
records its CRC32C (`payload_crc32c`); format_version stayed 1. Readers no longer take it: they stop
with one line naming `REINDEX_COMMAND`, which rewrites such an index in place (`rewrite_earlier_index`):
every payload is read once and checked against its recorded sha256 before its CRC32C is written, so a
damaged shard is named, never blessed; the command then updates metadata.json's `checksum` and reseals
it (imagenet_shards.tools.tar_shards.reindex).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import crc32c

from imagenet_shards.errors import DatasetError
from imagenet_shards.fileio import HashingAtomicWriter

EARLIER_CHECKSUM_COLUMN = "payload_sha256"
REINDEX_COMMAND = "python tar_tools.py reindex DATASET_DIR"


def refuse_earlier_index(header, source) -> None:
    """A DatasetError naming the command that re-creates the index, when `header` (column names) is
    the earlier version's."""
    if EARLIER_CHECKSUM_COLUMN in header:
        raise DatasetError(f"{source}: a sample index of the earlier version (payload sha256, no CRC32C); "
                           f"re-create it with `{REINDEX_COMMAND}`")


def rewrite_earlier_index(folder, entry: dict):
    """Rewrite the index metadata.json's split `entry` names under `folder` with CRC32Cs when it is of the
    earlier version (see above), updating entry["index"]; returns the samples re-indexed, or None when
    the index is already current. The caller (tar_tools.py reindex) updates metadata.json's checksum."""
    folder = Path(folder)
    path = folder / entry["index"]["name"]
    with open(path, "rb") as stream:
        header = stream.readline().rstrip(b"\r\n").decode(errors="replace").split("\t")
        if EARLIER_CHECKSUM_COLUMN not in header:
            return None
        with HashingAtomicWriter(path) as writer:
            count = _rewrite(folder, path.name, header, stream, writer)
    entry["index"].update(bytes=writer.bytes_written, sha256=writer.sha256, md5=writer.md5)
    return count


def _rewrite(folder: Path, name: str, header: list, lines, writer) -> int:
    at = {column: header.index(column) for column in ("shard", "payload_offset", "payload_size")}
    checksum_at = header.index(EARLIER_CHECKSUM_COLUMN)
    writer.write("\t".join(c if c != EARLIER_CHECKSUM_COLUMN else "payload_crc32c" for c in header).encode() + b"\n")
    handles, count = {}, 0
    try:
        for number, line in enumerate(lines, start=2):
            fields = line.rstrip(b"\r\n").split(b"\t")
            if not line.strip():
                continue
            if len(fields) != len(header):
                raise DatasetError(f"{name}: line {number} has {len(fields)} fields, expected {len(header)}")
            shard = fields[at["shard"]].decode()
            handle = handles.get(shard) or handles.setdefault(shard, open(folder / shard, "rb"))
            handle.seek(int(fields[at["payload_offset"]]))
            payload = handle.read(int(fields[at["payload_size"]]))
            if fields[checksum_at] and hashlib.sha256(payload).hexdigest().encode() != fields[checksum_at]:
                raise DatasetError(f"{shard}: the payload at line {number} of {name} differs from its sha256; "
                                   f"the index is left as it was")
            fields[checksum_at] = f"{crc32c.crc32c(payload):08x}".encode()
            writer.write(b"\t".join(fields) + b"\n")
            count += 1
    except (OSError, ValueError) as error:
        raise DatasetError(f"{name}: line {number}: cannot re-index: {error}") from None
    finally:
        for handle in handles.values():
            handle.close()
    return count
