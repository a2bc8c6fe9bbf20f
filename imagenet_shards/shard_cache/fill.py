"""One shard fetched into the cache by a thread, the readers that follow its part file as it grows, and the
flock helpers the cache's locks are made of (see imagenet_shards/shard_cache/__init__.py)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import logging
import os
import threading
import weakref
from pathlib import Path
from typing import Optional

from imagenet_shards import storage

log = logging.getLogger(__name__)
CHUNK = 1 << 20


# Lock files this process holds: a forked child closes its copies (flock locks belong to the open file,
# which a fork shares: a child that kept them would hold the parent's locks for its whole life).
_held = set()
_caches = weakref.WeakSet()  # every ShardCache of this process (register())


def _after_fork_in_child() -> None:
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    for cache in list(_caches):
        cache.reset_process_state()


os.register_at_fork(after_in_child=_after_fork_in_child)


def register(cache) -> None:
    """A forked child resets `cache`'s fills, locks and events (they are the parent's)."""
    _caches.add(cache)


def lock_file(path: Path, mode: int, wait: bool = True) -> Optional[int]:
    """An fd of `path` (created if missing) locked with flock `mode`; None if not waiting and it is taken."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)  # never through a link
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        log.warning("%s: a link where the cache keeps a lock file: removed, never followed", path)
        if os.path.islink(path):  # a link is never anyone's lock (flock is taken on regular files only)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, mode | (0 if wait else fcntl.LOCK_NB))
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    _held.add(fd)
    return fd


def unlock(fd: Optional[int]) -> None:
    if fd is not None and fd in _held:
        _held.discard(fd)
        os.close(fd)  # closing the only fd of the open file releases its flock


class Fill:
    """One shard being fetched into a part file by a thread; readers follow the part file as it grows."""

    def __init__(self, cache, name: str, location: str, lock_fd: int):
        self.cache, self.name, self.location, self.lock_fd = cache, name, location, lock_fd
        self.size, self.sha256 = cache.shards[name]
        self.part = cache.path(name).with_name(f"{cache.path(name).name}.part.{os.getpid()}.{threading.get_ident()}")
        self.part.unlink(missing_ok=True)  # a planted file or link of that name: never written through
        self.write_fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.read_fd = os.open(self.part, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.cond = threading.Condition()
        self.written = 0
        self.done = False
        self.error = None  # the store's error: readers raise it, as an uncached read would
        self.cache_error = None  # the cache's own (disk full): readers go to the store instead
        self.intact = False  # set when the fetched bytes matched metadata.json and became the entry
        self.thread = threading.Thread(target=self._run, name=f"cache-fill {name}", daemon=True)

    def _run(self) -> None:
        digest = hashlib.sha256()
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        try:
            with self.cache.open_source(self.location) as stream:
                # readinto1: what has arrived, so that readers following the part file get it without delay
                read = getattr(stream, "readinto1", stream.readinto)
                while count := read(buffer):
                    self._write(view[:count])
                    digest.update(view[:count])
                    with self.cond:
                        self.written += count
                        self.cond.notify_all()
            self.cache.count("bytes_fetched", self.written)
            self.cache.finish_fill(self, digest.hexdigest())
        except Exception as error:  # noqa: BLE001 - handed to the readers, who raise it where they read
            self.cache.count("bytes_fetched", self.written)
            self.cache.fail_fill(self, error)
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def _write(self, data) -> None:
        try:
            while data:
                data = data[os.write(self.write_fd, data):]
        except OSError as error:
            self.cache_error = error
            raise

    def wait(self) -> None:
        self.thread.join()

    def fetched_intact(self) -> bool:
        """Once the fetch has ended: whether the store's bytes matched metadata.json (and became the entry)."""
        self.wait()
        return self.intact


class Follower(io.RawIOBase):
    """Bytes [start, stop) of a shard being filled, read from its part file as the fill writes it."""

    def __init__(self, fill: Fill, fd: int, start: int, stop: Optional[int]):
        super().__init__()
        self.fill, self.position, self.stop = fill, start, stop
        self.fd = fd  # the part file's (this object closes it); still readable after its rename or removal
        self.direct = None  # a stream from the store, if the fill could not write the cache

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.stop is not None and self.position >= self.stop:
            return 0
        wanted = len(buffer) if self.stop is None else min(len(buffer), self.stop - self.position)
        if self.direct is not None:
            return self._count(self.direct.readinto(memoryview(buffer)[:wanted]))
        fill = self.fill
        with fill.cond:
            while fill.written <= self.position and not fill.done:
                fill.cond.wait()
            available = fill.written - self.position
            if available <= 0:
                if fill.cache_error is not None:
                    log.warning("%s: the cache could not be written (%s); reading the store directly", fill.name,
                                fill.cache_error)
                    self.direct = storage.open_byte_range(fill.location, self.position, self.stop) \
                        if storage.is_url(fill.location) else _local_range(fill.location, self.position)
                    return self.readinto(buffer)
                if fill.error is not None:
                    raise fill.error
                return 0  # the shard ended (shorter than recorded: the reader says what is missing)
        return self._count(os.preadv(self.fd, [memoryview(buffer)[:min(wanted, available)]], self.position))

    def _count(self, count: int) -> int:
        self.position += count
        return count

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.direct is not None:
            self.direct.close()
            self.direct = None
        super().close()


def _local_range(path: str, start: int):
    handle = open(path, "rb", buffering=0)
    handle.seek(start)
    return handle
