"""Raw image folders (`train/<class>/*`, `validation/<class>/*`): the reference checksum and a file manifest.

The reference harness's checksum of a folder is `checksumdir.dirhash(folder, "md5")`:

1. walk the folder with `os.walk` (hidden files included, symlinked files read, symlinked
   folders not entered, empty folders contributing nothing);
2. md5 each file's bytes and take the lowercase hex digest (32 characters);
3. sort those 32-character strings (plain string order, which for lowercase hex is the
   order of the digests as numbers);
4. md5 the concatenation of the sorted strings, encoded as ASCII, with no separator;
   the result's hex digest is the folder's checksum.

Because the digests are sorted, file names and paths never enter it: a renamed, moved or
swapped file leaves the checksum unchanged, and any difference only says "something
differs somewhere". The published values for the standard ILSVRC2012 layout are in
`IMAGENET`.

A manifest (`--write-manifest`) records every file's path, size and sha256, so a later
run names each file added, missing or changed. It is a tab-separated text file in the
dataset root, outside the split folders so that it does not change their checksum:

    path<TAB>size<TAB>sha256          header line
    train/n01440764/n01440764_10026.JPEG<TAB>13697<TAB>3c2b...   one line per file, sorted
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from datasets import fileio
from datasets.layout import SPLITS
from datasets.fileio import atomic_write_bytes

MANIFEST_FILE = "dataset_manifest.tsv"
_MANIFEST_HEADER = "path\tsize\tsha256"
RAW_SPLITS = SPLITS
READ_CHUNK = 1 << 20  # a buffer per file: smaller than fileio's default, as most images are ~100 KB


@dataclass(frozen=True)
class ReferenceLayout:
    checksum: str  # checksumdir.dirhash(split folder, "md5") of the standard layout
    images: int
    classes: int


# ILSVRC2012 as the reference harness expects it (train/ and validation/ with one folder per class).
IMAGENET = {
    "train": ReferenceLayout("17aed9504492852ddcc2ac247413aa95", 1_281_167, 1_000),
    "validation": ReferenceLayout("8d6a57a773cf3c3354c92155a5b1d5bd", 50_000, 1_000),
}


class ManifestError(Exception):
    """A manifest that cannot be read: names the file and the problem."""


def reference_checksum(md5_hexdigests) -> str:
    """checksumdir's reduction: md5 of the per-file md5 hex digests, sorted as strings, concatenated."""
    reduced = hashlib.md5()
    for digest in sorted(md5_hexdigests):
        reduced.update(digest.encode("ascii"))
    return reduced.hexdigest()


def folder_checksum(folder, known_md5=None, excluded=("metadata.json",), skip_folders=()) -> str:
    """checksumdir.dirhash(folder, "md5", excluded_files=excluded): files named in `excluded` are
    left out wherever they are. `known_md5` ({path relative to folder: md5 hex}) gives digests
    computed while the files were written; only the other files are read. `skip_folders` (paths
    relative to `folder`) are not walked: the checksum the folder will have once they are gone."""
    return reference_checksum(file_md5s(folder, known_md5, excluded, skip_folders).values())


def file_md5s(folder, known_md5=None, excluded=("metadata.json",), skip_folders=()) -> dict:
    """{path relative to folder: md5 hex} of every file checksumdir hashes (see folder_checksum);
    a name that cannot be stat'ed counts as an empty file, as checksumdir hashes it."""
    known_md5 = known_md5 or {}
    files, broken, _ = list_files(folder, skip_folders)
    digests = {path: hashlib.md5().hexdigest() for path, _ in broken if os.path.basename(path) not in excluded}
    for path, _ in files:
        if os.path.basename(path) in excluded:
            continue
        digest = known_md5.get(path)
        digests[path] = digest if digest else md5_sha256_of_file(os.path.join(folder, path), want_sha256=False)[0]
    return digests


def list_files(folder, skip_folders=()):
    """Every file under `folder` the way checksumdir walks it (`skip_folders`, relative paths, left out).

    Returns (files, broken, unreadable_folders): `files` are (path relative to `folder`,
    size); `broken` are (path, reason) of names that cannot be stat'ed (a dangling
    symlink, which checksumdir hashes as an empty file); `unreadable_folders` are (path,
    reason) of folders os.walk could not enter, which checksumdir silently skips.
    """
    folder = Path(folder)
    files, broken, unreadable = [], [], []

    def on_error(error):
        unreadable.append((os.path.relpath(error.filename, folder), error.strerror or str(error)))

    skipped = {os.path.normpath(path) for path in skip_folders}
    for root, dirs, names in os.walk(folder, onerror=on_error, followlinks=False):
        if skipped:
            dirs[:] = [d for d in dirs if os.path.relpath(os.path.join(root, d), folder) not in skipped]
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            try:
                size = os.stat(path).st_size
            except OSError as error:
                broken.append((os.path.relpath(path, folder), error.strerror or str(error)))
                continue
            files.append((os.path.relpath(path, folder), size))
    return files, broken, unreadable


def md5_sha256_of_file(path, want_sha256=True):
    """(md5 hex, sha256 hex or None, bytes read) of one file, in a single read."""
    digests, size = fileio.hash_file(path, ("md5", "sha256") if want_sha256 else ("md5",), READ_CHUNK)
    return digests[0], (digests[1] if want_sha256 else None), size


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
