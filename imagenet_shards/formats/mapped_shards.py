"""Read-only maps of local shard files, kept between reads in each process (`mapped_shard`).

Why: the pages of a fresh map are faulted in as they are first touched, so a split read every
epoch (a validation split, a dataset that fits the page cache) paid for mapping its shards again
every epoch: on 104 KB photos here, CRC32C over a fresh map took ~18 us an image, over a map already
touched ~7 us. A map is reused while its file is the same file: one stat per call compares device,
inode, size and modification time (a file replaced or truncated is mapped anew; a file written in
place shows through a shared map anyway). Beyond MAX_MAPPED_BYTES or MAX_MAPS (each map holds a file
descriptor) maps are let go, least recently used first; one still referenced by a payload view lives
until that view goes. Used by the loader's local read path (imagenet_shards/formats/webdataset.py).

Pages only where they pay (issue 35): every touched page of a kept map stays in the process's RSS
(file-backed, reclaimable, but counted by `top` and by a container's memory limit). On a train split
read once an epoch, a map is never read again while kept, so those pages grew a worker by 100-250 MB
an epoch for nothing. A map pays once it is found again by a later read (`map` returns a kept map:
a split re-read while still mapped, e.g. a validation split that fits the limits). For every other
map the reader lends each payload (`lend_payload`) and the loader hands it back when it is done with
it (`release_payload`, after decoding):
its pages are dropped (madvise MADV_DONTNEED; a read-only shared file map, so a later touch faults the
same bytes in from the page cache again, never other data). Pages are released per payload, not per
shard, because the shuffle buffer holds payloads of many shards: releasing a shard's pages when its
read ends would fault the buffered ones in twice. Two rules, both needed:
  * the pages wholly inside a payload go when it is handed back (a 100 KB photo, out of order: the
    buffer returns payloads shuffled);
  * everything below a map's oldest payload not yet handed back goes too (its low-water mark): the
    pages no payload fills alone, tar headers and payloads smaller than a page. ImageNet-scale
    datasets of small images (the 1.33M tiny JPEGs of benchmarks/imagenet_scale.py) grew each train
    worker by ~190 MB over 2,000 batches with the first rule alone, 540 MB peak RSS (2026-11-28).
What stays resident is what the buffer holds and the pages between its payloads. DATASETS_KEEP_SHARD_PAGES=1 keeps every page, as before.
"""

from __future__ import annotations

import heapq
import mmap
import os
import weakref
from collections import OrderedDict

MAX_MAPPED_BYTES = 512 << 20  # per process (each DataLoader worker keeps its own)
MAX_MAPS = 64
MAX_LENT = 16_384  # lent, not handed back (a damaged sample, readers that never do, a big shuffle buffer): oldest forgotten
KEEP_PAGES = os.environ.get("DATASETS_KEEP_SHARD_PAGES", "") not in ("", "0")  # every map's pages kept
PAGE = mmap.PAGESIZE


class MappedShards:
    """path -> (identity, size, view), least recently used first; payloads lent out of maps that do
    not pay, until handed back."""

    def __init__(self, limit: int = MAX_MAPPED_BYTES, count: int = MAX_MAPS):
        self.limit, self.count = limit, count
        self.maps = OrderedDict()
        self.mapped_bytes = 0
        self.paying = set()  # id() of the kept maps found again while kept: their pages stay
        self.lent = {}  # id(payload) -> (weak reference to it, its offset in its map, its map's _Pages), oldest first
        self.pages = weakref.WeakKeyDictionary()  # a map's mmap -> its _Pages (gone with the map)

    def map(self, location) -> tuple:
        """(size, memoryview of the whole file) of a local file, or raise OSError."""
        key = os.fspath(location)
        kept = self.maps.get(key)
        if kept is not None:
            self._forget(key)
            if kept[0] == _identity(os.stat(key)):
                self._keep(key, kept)
                self.paying.add(id(kept[2].obj))
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
        identity, size, view = self.maps.pop(key)
        self.mapped_bytes -= size
        self.paying.discard(id(view.obj))

    def lend(self, view, start: int, stop: int) -> memoryview:
        """view[start:stop] of a map's whole-file `view`, remembered (where its map does not pay) so
        that `release` knows where it lies: a memoryview does not say, and asking numpy costs ~6 us."""
        payload = view[start:stop]
        if not KEEP_PAGES and isinstance(view.obj, mmap.mmap) and id(view.obj) not in self.paying:
            pages = self.pages.get(view.obj)
            if pages is None:
                pages = self.pages[view.obj] = _Pages()
            lent = self.lent
            lent[id(payload)] = (weakref.ref(payload), start, pages)  # weak: a payload never handed back holds no map
            heapq.heappush(pages.waiting, (start, id(payload)))
            pages.frontier = max(pages.frontier, stop)
            if len(lent) > MAX_LENT:
                del lent[next(iter(lent))]  # its mark entry is skipped as stale
        return payload

    def release(self, payload) -> None:
        """Drop the pages of a payload `lend` gave out (anything else is left alone)."""
        entry = self.lent.pop(id(payload), None)
        if entry is None or entry[0]() is not payload or KEEP_PAGES or id(payload.obj) in self.paying:
            return
        _, start, pages = entry
        # The pages wholly inside the payload: an edge page may hold a neighbour still in the buffer,
        # and faulting it in again would map 64 KB around it (the kernel's fault-around), released
        # neighbours included.
        first, end = -(-start // PAGE) * PAGE, (start + len(payload)) // PAGE * PAGE
        if end > first:
            payload.obj.madvise(mmap.MADV_DONTNEED, first, end - first)
        # And every page below the map's oldest payload still out: all handed back, or headers.
        waiting = pages.waiting
        while waiting and not self._still_out(*waiting[0], pages):
            heapq.heappop(waiting)  # handed back, or forgotten (MAX_LENT)
        mark = (waiting[0][0] if waiting else pages.frontier) // PAGE * PAGE
        if mark > pages.released:
            payload.obj.madvise(mmap.MADV_DONTNEED, pages.released, mark - pages.released)
            pages.released = mark

    def _still_out(self, start: int, key: int, pages) -> bool:
        """Whether the payload lent at `start` of `pages`' map as id `key` is still out (ids are reused)."""
        entry = self.lent.get(key)
        return entry is not None and entry[1] == start and entry[2] is pages


class _Pages:
    """One map's low-water mark: the payloads lent and not handed back (a heap of (offset, id)), the
    furthest byte lent, and the pages below `released` already dropped."""

    __slots__ = ("waiting", "frontier", "released")

    def __init__(self):
        self.waiting, self.frontier, self.released = [], 0, 0


def _identity(status) -> tuple:
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


_SHARDS = MappedShards()  # forked workers inherit it, maps and all: the same files


def mapped_shard(location) -> tuple:
    """(size, memoryview of the whole file) of a local shard, reusing this process's map of it."""
    return _SHARDS.map(location)


def lend_payload(view, start: int, stop: int) -> memoryview:
    """view[start:stop] of a shard map from `mapped_shard`, for `release_payload` to let go."""
    return _SHARDS.lend(view, start, stop)


def release_payload(payload) -> None:
    """The loader is done with `payload` (decoded): let its pages go where its map does not pay.
    Anything `lend_payload` did not give out (bytes of a remote read, a Boxed payload) is left alone."""
    _SHARDS.release(payload)
