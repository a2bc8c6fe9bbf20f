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


def open_new(path, mode: str = "wb"):
    """`path` opened for writing as a new file: a file or link already there (a killed run's partial file, or
    one planted) is removed first, and the open uses O_EXCL|O_NOFOLLOW, so it never writes through a link."""
    path = Path(path)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    return os.fdopen(fd, mode)


def fsync_dir(directory) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(handle, partial: Path, path: Path, before_rename=None) -> None:
    """Make the partial file durable, then give it its final name (durably too)."""
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    if before_rename is not None:
        before_rename()
    os.replace(partial, path)
    fsync_dir(path.parent)


def _discard(handle, partial: Path) -> None:
    try:
        # On a full disk, close() retries the failed flush and raises again: the partial
        # file must still go.
        handle.close()
    except OSError:
        pass
    finally:
        partial.unlink(missing_ok=True)


@contextmanager
def atomic_open(path, mode="wb"):
    """Open `path`'s partial file for writing; publish it under `path` on success.

    On any exception (including a full disk) the partial file is removed and the
    exception propagates, so nothing half-written is left under either name.
    """
    path = Path(path)
    tmp = partial_path(path)
    handle = open_new(tmp, mode)
    try:
        yield handle
        _publish(handle, tmp, path)
    except BaseException:
        _discard(handle, tmp)
        raise


class HashingAtomicWriter:
    """A binary file written like `atomic_open`'s, that hashes (sha256 and md5) and counts its bytes as it
    writes them.

    `with HashingAtomicWriter(path) as w: w.write(data)`. On a clean exit the file is
    published under `path` and `w.sha256` / `w.md5` / `w.bytes_written` describe it: no second
    read to hash it. (md5 because it is the per-file digest of Graphcore's folder checksum and
    the ETag of a single-part S3 upload.) On any exception the partial file is removed. Shard writers subclass it
    and keep only their format's framing, using the two hooks below.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.bytes_written = 0
        self.sha256 = None
        self.md5 = None
        self._digest = hashlib.sha256()
        self._md5 = hashlib.md5()
        self._partial = partial_path(self.path)
        self._file = None

    def __enter__(self):
        self._file = open_new(self._partial, "wb")
        return self

    def write(self, data) -> None:
        self._file.write(data)
        self._digest.update(data)
        self._md5.update(data)
        self.bytes_written += len(data)

    def _write_trailer(self) -> None:
        """Hook: the format's end-of-file bytes, written (and hashed) on a clean exit."""

    def _before_rename(self) -> None:
        """Hook: runs once the data are durable, before the file takes its final name
        (a companion file published here is always there when the file is)."""

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            _discard(self._file, self._partial)
            return False
        try:
            self._write_trailer()
            _publish(self._file, self._partial, self.path, self._before_rename)
        except BaseException:
            _discard(self._file, self._partial)
            raise
        self.sha256 = self._digest.hexdigest()
        self.md5 = self._md5.hexdigest()
        return False


def atomic_write_bytes(path, data: bytes) -> None:
    with atomic_open(path, "wb") as handle:
        handle.write(data)


def atomic_write_json(path, obj, indent=1) -> None:
    """indent=None for large machine-read files: json's C encoder (an indent runs the pure-Python one)."""
    atomic_write_bytes(path, (json.dumps(obj, indent=indent, sort_keys=False) + "\n").encode())


def hash_file(path, algorithms=("sha256",), chunk_size: int = HASH_CHUNK):
    """([hex digest per name in `algorithms`], size in bytes) of a file, in one sequential read.

    `algorithms` are hashlib names ("sha256", "md5", ...). Large reads into one reused
    buffer keep this at the hash's own speed.
    """
    digests = [hashlib.new(name) for name in algorithms]
    size = 0
    buffer = bytearray(chunk_size)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            chunk = view[:n]
            for digest in digests:
                digest.update(chunk)
            size += n
    return [digest.hexdigest() for digest in digests], size


def sha256_file(path, chunk_size: int = HASH_CHUNK):
    """Return (hex sha256, size in bytes) of a file, read in large sequential chunks."""
    (digest,), size = hash_file(path, ("sha256",), chunk_size)
    return digest, size


def sha256_bytes(data) -> str:
    return hashlib.sha256(data).hexdigest()


_read_fds = {}  # path -> fd, per process: a converter worker reads many ranges of one archive or shard


def pread_range(path: str, size: int, offset: int) -> bytes:
    """Up to `size` bytes at `offset` of the local file `path` (fewer at its end: the caller checks),
    through one fd kept open per path for the process's life."""
    fd = _read_fds.get(path)
    if fd is None:
        fd = _read_fds[path] = os.open(path, os.O_RDONLY)
    return os.pread(fd, size, offset)


class OpenShard:
    """One local file kept open while it is read (os.pread), closed when another file is read or on
    close(): a reader that goes shard by shard holds one descriptor, not one per shard."""

    def __init__(self):
        self.path = None
        self.fd = None

    def pread(self, path, size: int, offset: int) -> bytes:
        if path != self.path:
            self.close()
            self.fd, self.path = os.open(path, os.O_RDONLY), path
        return os.pread(self.fd, size, offset)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd = self.path = None


def human_bytes(count) -> str:
    """A byte count as people read it, in decimal units ("512 B", "1.5 MB"); "-" for None."""
    if count is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(count) < 1000:
            break
        count /= 1000.0
    else:
        unit = "TB"
    return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
