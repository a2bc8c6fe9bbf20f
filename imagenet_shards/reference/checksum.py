"""The reference harness's folder checksum: `checksumdir.dirhash(folder, "md5")`, reproduced.

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
`IMAGENET`. Used for metadata.json's `checksum` (the converter writes it, the validator and
`adopt` check it) and for raw image folders (imagenet_shards.validate.raw_checksum).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from imagenet_shards import fileio

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
