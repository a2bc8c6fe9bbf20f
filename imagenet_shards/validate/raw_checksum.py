"""Raw image folders (`train/<class>/*`, `validation/<class>/*`): a file manifest.

A folder's checksum is checksumdir's md5 dirhash, computed by imagenet_shards.reference.checksum.
It cannot name the file that changed: the manifest can.

A manifest (`--write-manifest`) records every file's path, size and sha256, so a later
run names each file added, missing or changed. It is a tab-separated text file in the
dataset root, outside the split folders so that it does not change their checksum:

    path<TAB>size<TAB>sha256          header line
    train/n01440764/n01440764_10026.JPEG<TAB>13697<TAB>3c2b...   one line per file, sorted
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from imagenet_shards.dataset_folder import SPLITS
from imagenet_shards.fileio import atomic_write_bytes
from imagenet_shards.errors import Error

MANIFEST_FILE = "dataset_manifest.tsv"
_MANIFEST_HEADER = "path\tsize\tsha256"
RAW_SPLITS = SPLITS


class ManifestError(Error):
    """A manifest that cannot be read: names the file and the problem."""


@dataclass(frozen=True)
class ManifestEntry:
    path: str  # relative to the dataset root, "/"-separated
    size: int
    sha256: str


def encode_manifest(entries) -> bytes:
    lines = [_MANIFEST_HEADER]
    for entry in sorted(entries, key=lambda e: e.path):
        if "\n" in entry.path or "\r" in entry.path:
            raise ManifestError(f"{entry.path!r}: a file name with a line break cannot be recorded")
        lines.append(f"{entry.path}\t{entry.size}\t{entry.sha256}")
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")


def write_manifest(path, entries) -> None:
    atomic_write_bytes(path, encode_manifest(entries))


def read_manifest(path) -> dict:
    """{relative path: ManifestEntry}; ManifestError names the line that does not parse."""
    try:
        text = Path(path).read_bytes().decode("utf-8", "surrogateescape")
    except OSError as error:
        raise ManifestError(f"{path}: cannot read: {error.strerror or error}") from None
    lines = text.splitlines()
    if not lines or lines[0] != _MANIFEST_HEADER:
        raise ManifestError(f"{path}: not a dataset manifest (expected the header {_MANIFEST_HEADER!r})")
    entries = {}
    for number, line in enumerate(lines[1:], start=2):
        # The path is first, so split from the right: a tab inside a file name survives.
        parts = line.rsplit("\t", 2)
        if len(parts) != 3 or not parts[1].isdigit() or len(parts[2]) != 64:
            raise ManifestError(f"{path}: line {number} is not 'path<TAB>size<TAB>sha256': {line[:120]!r}")
        entries[parts[0]] = ManifestEntry(parts[0], int(parts[1]), parts[2])
    return entries


def compare_with_manifest(recorded: dict, current: dict):
    """Differences between two {path: ManifestEntry} maps as (path, kind, message) tuples.

    kind is "added", "missing" or "changed". A missing file whose content reappears under
    an added name is reported as moved, and a changed file holding another recorded file's
    content says whose: the whole-folder checksum can tell neither.
    """
    recorded_by_hash = {}
    for entry in recorded.values():
        recorded_by_hash.setdefault(entry.sha256, []).append(entry.path)
    added = sorted(set(current) - set(recorded))
    missing = sorted(set(recorded) - set(current))
    added_by_hash = {}
    for path in added:
        added_by_hash.setdefault(current[path].sha256, []).append(path)
    differences = []
    for path in missing:
        moved_to = [p for p in added_by_hash.get(recorded[path].sha256, [])]
        where = f"; its content is now at {', '.join(moved_to)}" if moved_to else ""
        differences.append((path, "missing", f"missing: listed in the manifest ({recorded[path].size:,} bytes){where}"))
    for path in added:
        entry = current[path]
        origin = [p for p in recorded_by_hash.get(entry.sha256, []) if p != path]
        same = f"; same content as {', '.join(origin[:3])} in the manifest" if origin else ""
        differences.append((path, "added", f"added: not in the manifest ({entry.size:,} bytes){same}"))
    for path in sorted(set(recorded) & set(current)):
        old, new = recorded[path], current[path]
        if old.sha256 == new.sha256 and old.size == new.size:
            continue
        other = [p for p in recorded_by_hash.get(new.sha256, []) if p != path]
        whose = f"; it holds the content of {', '.join(other[:3])} (swapped?)" if other else ""
        if old.size != new.size:
            differences.append((path, "changed", f"changed: {new.size:,} bytes, the manifest says {old.size:,}{whose}"))
        else:
            differences.append((path, "changed", f"changed: sha256 {new.sha256[:16]}... differs from the manifest's "
                                                 f"{old.sha256[:16]}...{whose}"))
    return differences
