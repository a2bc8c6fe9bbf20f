"""Crash-safe file writes and whole-file hashing.

A file only ever appears under its final name complete: it is written under a
`.partial` name beside it, flushed, fsynced and renamed (rename is atomic on POSIX
within one file system). Readers and `--resume` can therefore trust any file that
has its final name.
"""

import hashlib
import json
import os
from contextlib import contextmanager
from pathlib import Path

PARTIAL_SUFFIX = ".partial"
HASH_CHUNK = 4 << 20  # 4 MiB: large enough that hashing runs at sha256 speed


def partial_path(path) -> Path:
    path = Path(path)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def fsync_dir(directory) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path, mode="wb"):
    """Open `path`'s partial file for writing; publish it under `path` on success.

    On any exception (including a full disk) the partial file is removed and the
    exception propagates, so nothing half-written is left under either name.
    """
    path = Path(path)
    tmp = partial_path(path)
    handle = open(tmp, mode)
    try:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        handle.close()
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path, data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def atomic_write_json(path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def sha256_file(path, chunk_size: int = HASH_CHUNK):
    """Return (hex sha256, size in bytes) of a file, read in large sequential chunks."""
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            digest.update(view[:n])
            size += n
    return digest.hexdigest(), size


def sha256_bytes(data) -> str:
    return hashlib.sha256(data).hexdigest()
