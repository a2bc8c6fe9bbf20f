"""The one place that knows the pre-CRC32C sample index, and the command that re-creates it.

The earlier version's index recorded each payload's sha256 in a `payload_sha256` column where this one
records its CRC32C (`payload_crc32c`); format_version stayed 1. Readers no longer take it: they stop
with one line (`EarlierIndexError`) naming the re-index command as the user has it (`reindex_command`:
`tar-tools reindex` installed, `python tar_tools.py reindex` in the checkout), which rewrites such an
index in place (`rewrite_earlier_index`): every payload is read once and checked against its recorded
sha256 before its CRC32C is written, so a damaged shard is named, never blessed; the command then
updates metadata.json's `checksum` and reseals it (imagenet_shards.tools.tar_shards.reindex). The
validator says the same in one line (imagenet_shards.validate.upgrade); docs/on-disk-format.md lists
every layout written since 3a4a4fc.
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from importlib import metadata as distributions
from pathlib import Path

import crc32c

from imagenet_shards.errors import DatasetError
from imagenet_shards.fileio import HashingAtomicWriter

EARLIER_CHECKSUM_COLUMN = "payload_sha256"
CHECKOUT_REINDEX = "python tar_tools.py reindex"  # the checkout's script, run from the checkout
INSTALLED_REINDEX = "tar-tools reindex"  # the console script an install puts on PATH
PACKAGE = Path(__file__).resolve().parents[1]


class EarlierIndexError(DatasetError):
    """A sample index of the earlier version: not damage; re-created by the re-index command."""


def reindex_command(dataset="DATASET_DIR") -> str:
    """The re-index command as this user has it: `tar-tools reindex` where the running command is one of
    this package's console scripts or the package is installed (no tar_tools.py beside it), else the
    checkout's `python tar_tools.py reindex`; `dataset` quoted for a shell unless it is the placeholder."""
    where = dataset if dataset == "DATASET_DIR" else shlex.quote(str(dataset))
    installed = _console_script(Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "")
    if installed or not (PACKAGE.parent / "tar_tools.py").is_file():
        return f"{INSTALLED_REINDEX} {where}"
    return f"{CHECKOUT_REINDEX} {where}"


def _console_script(name: str) -> bool:
    """Whether `name` is a console script of this package (pyproject.toml's [project.scripts])."""
    if not name or name.endswith(".py"):
        return False
    try:
        found = distributions.entry_points(group="console_scripts", name=name)
    except Exception:  # broken metadata of some distribution must not hide the message this serves
        return False
    return any(entry.value.split(".")[0] == PACKAGE.name for entry in found)


def refuse_earlier_index(header, source) -> None:
    """An EarlierIndexError naming the command that re-creates the index, when `header` (column names) is
    the earlier version's."""
    if EARLIER_CHECKSUM_COLUMN in header:
        raise EarlierIndexError(f"{source}: a sample index of the earlier version (payload sha256, no CRC32C); "
                                f"re-create it with `{reindex_command()}`")


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
