"""The ShardCache: entries, serving a run, the fill lock, pins, the LRU limit, prefetch (see
imagenet_shards/shard_cache/__init__.py for the contract)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import stat as stat_module
import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Optional

import numpy as np

from imagenet_shards import storage
from imagenet_shards.formats import FORMATS
from imagenet_shards.formats.runs import ShardBytes
from imagenet_shards.shard_cache.events import new_events
from imagenet_shards.shard_cache.fill import CHUNK, Fill, Follower, lock_file, register, unlock
from imagenet_shards.errors import Error
from imagenet_shards.safe_names import plain_name

log = logging.getLogger(__name__)
RESERVE = 1 << 30  # the default limit leaves this much of the disk free
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
SIDE_SUFFIXES = (".meta", ".lock", ".pin")


class CacheError(Error, ValueError):
    """A cache option that cannot be used (bad limit, directory not writable): names it."""


def parse_size(text) -> int:
    """'200GB', '1.5 TiB', '500M', 1000 -> bytes."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = int(text)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?[iI]?)[bB]?\s*", str(text))
        if not match:
            raise CacheError(f"cache limit {text!r}: not a size (e.g. 200GB, 512MiB, 1000000)")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value <= 0:
        raise CacheError(f"cache limit {text!r}: must be more than 0 bytes")
    return value


def dataset_key(metadata: dict) -> str:
    """A digest of the dataset's identity (metadata.json's checksum and its shard records), never a string
    taken from it: a hostile `checksum` (`..`, `/etc`) cannot name the folder (issue 45)."""
    records = sorted((str(s["name"]), int(s["bytes"]), s.get("sha256"))
                     for entry in metadata.get("splits", {}).values() for s in entry.get("shards", []))
    identity = json.dumps({"checksum": str(metadata.get("checksum")), "shards": records}, sort_keys=True)
    return "dataset-" + hashlib.sha256(identity.encode()).hexdigest()[:32]


def own_folder(path: Path, what: str) -> Path:
    """`path`, created with mode 0700 when missing, after checking that it is a real folder (not a link) owned by
    this user and writable by no other: a folder another user owns or can write lets them plant entries or
    links (docs/shard-cache.md). CacheError in one line otherwise."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise CacheError(f"{what} {path}: cannot create it: {error.strerror or error}") from None
    info = os.lstat(path)
    if not stat_module.S_ISDIR(info.st_mode):
        raise CacheError(f"{what} {path}: not a folder (a link or a file): refused")
    if info.st_uid != os.geteuid():
        raise CacheError(f"{what} {path}: owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}): "
                         f"refused; give the cache a folder of your own")
    if info.st_mode & 0o022:
        raise CacheError(f"{what} {path}: writable by other users (mode {stat_module.S_IMODE(info.st_mode):o}): "
                         f"refused; chmod go-w it or give the cache a folder of your own")
    return path


def open_cache(directory, metadata: Optional[dict], description: str, limit=None, remote_paths: bool = False,
               prefetch: int = 0) -> Optional["ShardCache"]:
    """The node's cache in `directory` (None: no cache) of the dataset `metadata` (a parsed metadata.json)
    describes; None, with a warning naming `description`, when there is no metadata or it records no shards
    (nothing to check entries against: shard lists scanned, image folders, synthetic data), or when its
    format reads local files only (LMDB: a cached copy was filled, then every sample failed)."""
    if directory is None:
        return None
    shard_format = FORMATS.get(metadata.get("format")) if metadata is not None else None
    if shard_format is not None and not shard_format.reads_streams:
        warnings.warn(f"{description}: not cached (cache={directory}): {metadata['format']} shards are read "
                      f"from local files by path, never through the shard cache", stacklevel=4)
        return None
    if metadata is None or not any(entry.get("shards") for entry in metadata.get("splits", {}).values()):
        warnings.warn(f"{description}: not cached (cache={directory}): only shards that a metadata.json "
                      f"records (name, bytes, sha256) are cached", stacklevel=4)  # get_data's caller
        return None
    return ShardCache.for_dataset(directory, metadata, limit, remote_paths, prefetch)


class ShardCache:
    """The cache of one dataset's shards in `directory` (see the module docstring). One object per
    loader; forked DataLoader workers use their copy (fills and locks are per process)."""

    def __init__(self, directory, key: str, shards: dict, limit: Optional[int] = None, remote_paths: bool = False,
                 prefetch: int = 0):
        self.root = Path(directory)
        self.directory = self.root / plain_name(key, "cache key")
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CacheError(f"cache directory {self.root}: cannot create it: {error.strerror or error}") from None
        own_folder(self.root, "cache directory")
        own_folder(self.directory, "cache folder")
        if not os.access(self.directory, os.W_OK):
            raise CacheError(f"cache directory {self.directory}: not writable")
        if limit is None:
            limit = shutil.disk_usage(self.root).free + self._total_bytes() - RESERVE
        self.key, self.limit = key, max(int(limit), 0)
        self.shards = {plain_name(name, "metadata.json"): record for name, record in shards.items()}
        self.verified = set()  # (name, inode, mtime_ns) of entries hashed in this process (or its parent)
        self.remote_paths, self.prefetch = remote_paths, max(int(prefetch), 0)
        self.reset_process_state()
        register(self)

    @classmethod
    def for_dataset(cls, directory, metadata: dict, limit=None, remote_paths: bool = False,
                    prefetch: int = 0) -> "ShardCache":
        """The cache of the dataset `metadata` (a parsed metadata.json) describes: its shard records
        (name -> bytes, sha256) are what every entry is checked against."""
        shards = {s["name"]: (int(s["bytes"]), s.get("sha256"))
                  for entry in metadata.get("splits", {}).values() for s in entry.get("shards", []) if s.get("sha256")}
        return cls(directory, dataset_key(metadata), shards, None if limit is None else parse_size(limit),
                   remote_paths, prefetch)

    def reset_process_state(self) -> None:
        """Forget the fills, locks and events of the parent process (a forked child's start: fill.py)."""
        self._fills = {}
        self._mutex = threading.Lock()
        self._events = new_events()
        self._plan, self._place = [], {}

    def __getstate__(self):  # a spawned worker starts with no fills, locks or events of its parent
        state = dict(self.__dict__)
        for name in ("_fills", "_mutex", "_events", "_plan", "_place"):
            state.pop(name)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.reset_process_state()
        register(self)

    # ------------------------------------------------------------------ paths and entries

    def path(self, name: str) -> Path:
        return self.directory / plain_name(name, "metadata.json")

    def _side(self, name: str, suffix: str) -> Path:
        path = self.path(name)
        return path.with_name(path.name + suffix)

    def covers(self, name: str, location: str) -> bool:
        """Whether shard `name` at `location` is read through the cache: a remote (or remote-marked local) shard
        that metadata.json records with a sha256."""
        remote = storage.is_url(location) or (self.remote_paths and os.path.isfile(location))
        return remote and name in self.shards

    def open_source(self, location: str):
        """The whole shard from the store: one GET (or, for a remote-marked path, one sequential read)."""
        if storage.is_url(location):
            return storage.open_byte_range(location, 0, None)
        return open(location, "rb", buffering=0)

    def _valid(self, name: str) -> Optional[os.stat_result]:
        """The entry's stat when it may be served: present, and its size, mtime and sha256 as recorded."""
        try:
            meta = read_meta(self._side(name, ".meta"))
            stat = os.lstat(self.path(name))
        except (OSError, ValueError):
            return None
        size, sha256 = self.shards[name]
        if (meta.get("sha256"), meta.get("size")) != (sha256, size) or stat.st_size != size \
                or stat.st_mtime_ns != meta.get("mtime_ns") or not stat_module.S_ISREG(stat.st_mode):
            return None
        return stat

    def _hashed_once(self, name: str, stat: os.stat_result) -> bool:
        """Whether the entry's bytes equal metadata.json's sha256: hashed once per process that did not fill it
        (a forked worker inherits its parent's results), before its first read. A whole read of the entry from
        the page cache at sha256's speed (docs/shard-cache.md: the trust model, what it costs)."""
        mark = (name, stat.st_ino, stat.st_mtime_ns)
        if mark in self.verified:
            return True
        digest = hashlib.sha256()
        try:
            fd = os.open(self.path(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return False
        with open(fd, "rb", buffering=0) as handle:
            while chunk := handle.read(CHUNK * 4):
                digest.update(chunk)
        if digest.hexdigest() != self.shards[name][1]:
            return False
        self.verified.add(mark)
        return True

    def _changed(self, name: str) -> Optional[str]:
        """Why an entry that exists may not be served ("size or mtime changed"), None if none exists."""
        if self.path(name).exists() and self._side(name, ".meta").exists():
            return "its size or mtime changed since it was cached"
        return None

    # ------------------------------------------------------------------ serving a run

    @contextlib.contextmanager
    def serve(self, name: str, shard: ShardBytes):
        """(the bytes to read, fill): shard `name`'s bytes on the local entry (fill None), or on the shard being
        fetched (an `opener` that follows `fill`). The entry is pinned while the caller reads."""
        pin = lock_file(self._side(name, ".pin"), fcntl.LOCK_SH)
        fill = None
        try:
            fill, fd = self._follow_or_fill(name, shard.location)
            self._start_prefetch(name)
            if fill is None:
                self.count("hits")
                os.utime(pin)
                yield ShardBytes(str(self.path(name)), copied=True), None
            else:
                yield replace(shard, opener=lambda location, start, stop: io.BufferedReader(
                    Follower(fill, os.dup(fd), start, stop), buffer_size=CHUNK)), fill
        finally:
            if fill is not None:
                os.close(fd)
            unlock(pin)

    def _follow_or_fill(self, name: str, location: str) -> tuple:
        """(None, None) when the entry is valid (serve it); else (the fill to follow: this process's, or a
        new one once no other process is filling it, an fd of its part file for the caller to close)."""
        with self._mutex:  # the part file's fd is copied while the fill is registered (it closes it after)
            fill = self._fills.get(name)
            if fill is not None:
                return fill, os.dup(fill.read_fd)
        stat = self._valid(name)
        if stat is not None:
            if self._hashed_once(name, stat):
                return None, None
            self.drop(name, "its bytes no longer match metadata.json's sha256")
        lock = lock_file(self._side(name, ".lock"), fcntl.LOCK_EX, wait=False)
        if lock is None:  # another process is fetching it: wait for its entry
            lock = lock_file(self._side(name, ".lock"), fcntl.LOCK_EX)
            self.count("waited")
        return self._fill_locked(name, location, lock)

    def _fill_locked(self, name: str, location: str, lock: int) -> tuple:
        """Holding the fill lock: (None, None) if the entry is (now) valid, else (a started fill, which owns
        the lock, an fd of its part file for the caller to close)."""
        try:
            if self._valid(name) is not None:
                unlock(lock)
                return None, None
            changed = self._changed(name)
            if changed:
                log.warning("%s: cached shard %s dropped and fetched again: %s", self.directory, name, changed)
                self._record("refetched", name, changed)
            self._remove_entry(name, parts=True)
            fill = Fill(self, name, location, lock)
        except BaseException:
            unlock(lock)
            raise
        fd = os.dup(fill.read_fd)
        with self._mutex:
            self._fills[name] = fill
        fill.thread.start()
        return fill, fd

    def read_rows(self, name: str, shard: ShardBytes, read):
        """Items of `read(bytes, first)` (the caller's reader of its rows from `first` on, from those bytes; each
        item ends with its error, None when good), with shard `name` served through the cache. A failing sample
        of a cached entry drops the entry and the rest of the rows is read from a fresh fetch, once. So does
        one read while following a fetch whose bytes matched metadata.json's sha256: the store's bytes were
        good, so the damage is the local file's (truncated or changed on its disk under the reader). Where
        the fetch did not match, the store's bytes are what failed, as without a cache: not fetched again."""
        first = 0
        retried = False
        while True:
            with self.serve(name, shard) as (served, fill):
                for item in read(served, first):
                    if item[-1] is not None and not retried and (fill is None or fill.fetched_intact()):
                        self.drop(name, f"a sample failed its check: {item[-1]}")
                        retried = True
                        break
                    first += 1
                    yield item
                else:
                    return

    def drop(self, name: str, reason: str) -> None:
        """Remove an entry found bad (it is fetched again when next read); reported as refetched."""
        lock = lock_file(self._side(name, ".lock"), fcntl.LOCK_EX)
        try:
            self._remove_entry(name)
        finally:
            unlock(lock)
        log.warning("%s: cached shard %s dropped and fetched again: %s", self.directory, name, reason)
        self._record("refetched", name, reason)

    def _remove_entry(self, name: str, parts: bool = False) -> None:
        """Unlink the entry (readers that have it open keep their bytes); with parts, killed fills' part files."""
        self._side(name, ".meta").unlink(missing_ok=True)
        self.path(name).unlink(missing_ok=True)
        if parts:
            for stale in self.directory.glob(f"{glob_escape(self.path(name).name)}.part.*"):
                stale.unlink(missing_ok=True)

    # ------------------------------------------------------------------ the fill thread's ends

    def finish_fill(self, fill: Fill, sha256: str) -> None:
        try:
            if fill.written != fill.size or sha256 != fill.sha256:
                what = (f"{fill.written} bytes, metadata.json says {fill.size}" if fill.written != fill.size
                        else f"sha256 {sha256}, metadata.json says {fill.sha256}")
                raise ValueError(f"fetched {what}: not cached")
            os.close(fill.write_fd)
            fill.write_fd = None
            path = self.path(fill.name)
            # Pinned while it becomes an entry: another process's evict() would otherwise see the new file
            # under an old pin (its last use long ago) and remove it before its .meta exists.
            pin = lock_file(self._side(fill.name, ".pin"), fcntl.LOCK_SH)
            try:
                os.replace(fill.part, path)
                stat = os.lstat(path)
                write_meta(self._side(fill.name, ".meta"), {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                                            "sha256": sha256})
                self.verified.add((fill.name, stat.st_ino, stat.st_mtime_ns))
                os.utime(pin)  # the last use (LRU)
            finally:
                unlock(pin)
            fill.intact = True
            self.count("fills")
            self.evict()
        except Exception as error:  # noqa: BLE001
            self.fail_fill(fill, error, finished=True)
            return
        self._end_fill(fill)

    def fail_fill(self, fill: Fill, error: Exception, finished: bool = False) -> None:
        if not finished and fill.cache_error is None:
            fill.error = error
        fill.part.unlink(missing_ok=True)
        log.warning("%s: shard %s not cached: %s: %s", self.directory, fill.name, type(error).__name__, error)
        self._record("fill_failed", fill.name, f"{type(error).__name__}: {error}")
        self._end_fill(fill)

    def _end_fill(self, fill: Fill) -> None:
        if fill.write_fd is not None:
            os.close(fill.write_fd)
            fill.write_fd = None
        with self._mutex:
            if self._fills.get(fill.name) is fill:
                del self._fills[fill.name]
            os.close(fill.read_fd)  # readers hold their own copies
        unlock(fill.lock_fd)

    # ------------------------------------------------------------------ limit, prefetch, events

    def _entries(self) -> list:
        """(last use, allocated bytes, shard path, pin path) of every entry this cache wrote under its root: in
        real folders this user owns, a regular file with a valid .meta beside it. Links are never followed; a
        file without a valid .meta (another tool's, another user's) is never counted nor removed."""
        entries = []
        for folder in os.scandir(self.root):
            if not folder.is_dir(follow_symlinks=False) or folder.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue
            for item in os.scandir(folder.path):
                if item.name.endswith(SIDE_SUFFIXES) or ".part." in item.name or ".meta." in item.name:
                    continue
                entry = _entry(item)
                if entry is not None:
                    entries.append(entry)
        return entries

    def _total_bytes(self) -> int:
        return sum(entry[1] for entry in self._entries()) if self.root.exists() else 0

    def evict(self) -> None:
        """Least recently used entries out until the cache holds at most `limit` allocated bytes; an entry some
        process is reading (pinned) is skipped, so the cache may stay above the limit until it is not."""
        entries = sorted(self._entries())
        total = sum(entry[1] for entry in entries)
        for _, size, path, pin in entries:
            if total <= self.limit:
                return
            fd = lock_file(pin, fcntl.LOCK_EX, wait=False)
            if fd is None:
                continue
            try:
                Path(str(path) + ".meta").unlink(missing_ok=True)
                path.unlink(missing_ok=True)
            finally:
                unlock(fd)
            total -= size
            self.count("evicted")

    def plan_rows(self, columns, rows, locate) -> None:
        """This reader's plan (rows of a sample_columns.SampleColumns, reading order; `locate(shard name)`
        gives its location): with `prefetch` > 0, the shards it reads next are fetched ahead of it."""
        if not self.prefetch:
            return
        ids = columns.shard_ids[np.asarray(rows, dtype=np.int64)]
        ids = ids[np.r_[True, ids[1:] != ids[:-1]]] if len(ids) else ids
        names = [columns.shard_names[i] for i in ids.tolist()]
        self._plan = [(name, locate(name)) for name in names if name in self.shards]
        self._place = {name: n for n, (name, _) in enumerate(self._plan)}

    def _start_prefetch(self, name: str) -> None:
        place = self._place.get(name)
        if not self.prefetch or place is None:
            return
        for ahead, location in self._plan[place + 1:place + 1 + self.prefetch]:
            with self._mutex:
                if ahead in self._fills:
                    continue
            if self._valid(ahead) is not None:
                continue
            lock = lock_file(self._side(ahead, ".lock"), fcntl.LOCK_EX, wait=False)
            if lock is not None:  # taken: someone is fetching it already
                fill, fd = self._fill_locked(ahead, location, lock)
                if fd is not None:
                    os.close(fd)

    def count(self, name: str, amount: int = 1) -> None:
        with self._mutex:
            self._events[name] += amount

    def _record(self, name: str, shard: str, reason: str) -> None:
        with self._mutex:
            self._events[name].append({"shard": shard, "reason": reason})

    def take_events(self) -> dict:
        """This process's events since the last call, after its fills in flight have ended."""
        with self._mutex:
            fills = list(self._fills.values())
        for fill in fills:
            fill.wait()
        with self._mutex:
            events, self._events = self._events, new_events()
        return events


def _entry(item: os.DirEntry) -> Optional[tuple]:
    """(last use, allocated bytes, path, pin path) of a cache entry: a regular file (not a link) whose .meta
    records its size and mtime; None for anything else."""
    try:
        stat = item.stat(follow_symlinks=False)
        meta = read_meta(Path(item.path + ".meta"))
    except (OSError, ValueError):
        return None
    if not stat_module.S_ISREG(stat.st_mode) or (meta.get("size"), meta.get("mtime_ns")) != \
            (stat.st_size, stat.st_mtime_ns):
        return None
    pin = Path(item.path + ".pin")
    try:
        used = os.lstat(pin).st_mtime_ns
    except OSError:
        used = stat.st_mtime_ns
    return used, stat.st_blocks * 512, Path(item.path), pin


def read_meta(path: Path) -> dict:
    """An entry's .meta, opened without following a link (OSError for a link, ValueError for bad JSON)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with open(fd, "rb") as handle:
        meta = json.loads(handle.read(1 << 16))
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: not a JSON object")
    return meta


def write_meta(path: Path, meta: dict) -> None:
    """Write .meta through a side file made with O_EXCL|O_NOFOLLOW (a planted file or link is never written
    through), then renamed over it."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w") as handle:
        handle.write(json.dumps(meta))
    os.replace(temporary, path)


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", text)
