"""Read-only maps of local shard files, kept between reads in each process (`mapped_shard`).

Why: the pages of a fresh map are faulted in as they are first touched, so a split read every
epoch (a validation split, a dataset that fits the page cache) paid for mapping its shards again
every epoch: on 104 KB photos here, CRC32C over a fresh map took ~18 us an image, over a map already
touched ~7 us. A map is reused while its file is the same file: one stat per call compares device,
inode, size and modification time (a file replaced or truncated is mapped anew; a file written in
place shows through a shared map anyway). Beyond MAX_MAPPED_BYTES or MAX_MAPS (each map holds a file
descriptor) maps are let go, least recently used first; one still referenced by a payload view lives
until that view goes. Used by the loader's local read path (datasets/formats/webdataset.py).
"""

from __future__ import annotations

import mmap
import os
from collections import OrderedDict

MAX_MAPPED_BYTES = 512 << 20  # per process (each DataLoader worker keeps its own)
MAX_MAPS = 64


class MappedShards:
    """path -> (identity, size, view), least recently used first."""

    def __init__(self, limit: int = MAX_MAPPED_BYTES, count: int = MAX_MAPS):
        self.limit, self.count = limit, count
        self.maps = OrderedDict()
        self.mapped_bytes = 0

    def map(self, location) -> tuple:
        """(size, memoryview of the whole file) of a local file, or raise OSError."""
        key = os.fspath(location)
        kept = self.maps.get(key)
        if kept is not None:
            self._forget(key)
            if kept[0] == _identity(os.stat(key)):
                self._keep(key, kept)
                return kept[1], kept[2]
        with open(key, "rb") as handle:
            status = os.fstat(handle.fileno())
            size = status.st_size
            view = memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b"")
        if 0 < size <= self.limit:
            self._keep(key, (_identity(status), size, view))
        return size, view

    def _keep(self, key, entry) -> None:
        self.maps[key] = entry  # the most recently used last
        self.mapped_bytes += entry[1]
        while self.mapped_bytes > self.limit or len(self.maps) > self.count:
            self._forget(next(iter(self.maps)))

    def _forget(self, key) -> None:
        self.mapped_bytes -= self.maps.pop(key)[1]


def _identity(status) -> tuple:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


_SHARDS = MappedShards()  # forked workers inherit it, maps and all: the same files


def mapped_shard(location) -> tuple:
    """(size, memoryview of the whole file) of a local shard, reusing this process's map of it."""
    return _SHARDS.map(location)
