"""The `lmdb` format: one LMDB environment per shard, read with sequential cursor walks.

Bytes: `<split>-%06d.lmdb`, a single-file LMDB environment (subdir=False, no lock file), written
by the `lmdb` package in one write transaction, then fsynced and renamed (a shard under its final
name is complete). Keys are the sample keys (UTF-8); LMDB keeps them sorted, and the converter
hands a shard its samples in key order (`order_in_shard`), so a cursor walk reads the shard in
index order. Each value is self-describing, with no pickle:

    b"LMS1"                     magic and version
    uint32 label                little endian, like every integer here
    uint16 n + n bytes          the sample key (so a copied value is a whole sample)
    uint16 n + n bytes          the payload's extension ("jpg" or "npy")
    uint32 n + n bytes          the sample's json (source, class, sizes, steps)
    payload                     the rest: the JPEG (or .npy) bytes

Offsets in the sample index are *logical*: the values of a shard laid end to end in write order
(record_offset = bytes of the values before it, record_size = its value's length, payload_offset
= record_offset + header). Consecutive samples therefore form runs, the payload is a known slice
of the value, and a repartition copies a value verbatim. The shard's sha256 and md5 are of the
file, read once after the environment is closed (LMDB writes the file itself).
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Iterator

from imagenet_shards.fileio import PARTIAL_SUFFIX, fsync_dir, hash_file
from imagenet_shards.formats.base import EncodedSample, ShardDataError, ShardFormat
from imagenet_shards.formats.runs import PLAIN, RowRead
from imagenet_shards.formats.shard_check import (
    NOT_IN_INDEX,
    ShardResult,
    ShardTask,
    decode_problem,
    error,
    metadata_mismatches,
    sample_field_problems,
)
from imagenet_shards.index import SampleRecord, payload_crc32c, payload_problem

MAGIC = b"LMS1"
SHARD_FILE = re.compile(r"^(?P<split>[A-Za-z0-9_]+)-(?P<number>\d{6})\.lmdb(?P<partial>\.partial)?$")
MAP_SIZE = 1 << 40  # address space only: the file grows with the pages written
COMMIT_EVERY = 256  # samples per write transaction (bounds the dirty pages held in memory)


class LMDBFormatError(ShardDataError):
    """An LMDB shard or value that is not what this format writes."""

    def __init__(self, source, message):
        super().__init__(f"{source}: {message}")


def encode_value(key: str, label: int, extension: str, info: bytes, payload) -> tuple:
    """(value bytes, header length) of one sample."""
    key_bytes, ext_bytes = key.encode(), extension.encode()
    header = b"".join((MAGIC, struct.pack("<I", label), struct.pack("<H", len(key_bytes)), key_bytes,
                       struct.pack("<H", len(ext_bytes)), ext_bytes, struct.pack("<I", len(info)), info))
    return header + bytes(payload), len(header)


def decode_value(value, source="<value>") -> dict:
    """A value's fields: key, label, ext, info (bytes), payload_start, and the payload as a slice."""
    view = memoryview(value)
    try:
        if bytes(view[:4]) != MAGIC:
            raise LMDBFormatError(source, f"value does not start with {MAGIC!r}")
        (label,) = struct.unpack_from("<I", view, 4)
        pos = 8
        (n,) = struct.unpack_from("<H", view, pos)
        key = bytes(view[pos + 2:pos + 2 + n]).decode()
        pos += 2 + n
        (n,) = struct.unpack_from("<H", view, pos)
        ext = bytes(view[pos + 2:pos + 2 + n]).decode()
        pos += 2 + n
        (n,) = struct.unpack_from("<I", view, pos)
        info = bytes(view[pos + 4:pos + 4 + n])
        pos += 4 + n
        if pos > len(view) or len(info) != n:
            raise LMDBFormatError(source, "value is shorter than its header says")
    except (struct.error, UnicodeDecodeError) as problem:
        raise LMDBFormatError(source, f"malformed value: {problem}") from None
    return {"key": key, "label": label, "ext": ext, "info": info, "payload_start": pos, "payload": view[pos:]}


def open_environment(path, readonly=True):
    """The shard's environment; for reading, LMDBFormatError if the file lacks pages its meta page uses."""
    import lmdb

    try:
        env = lmdb.open(str(path), subdir=False, readonly=readonly, lock=False, readahead=False,
                        map_size=MAP_SIZE, max_dbs=0, create=not readonly)
    except lmdb.Error as problem:
        raise LMDBFormatError(path, f"cannot open the LMDB environment: {problem}") from None
    if readonly:
        # LMDB maps the file: touching a page past its end kills the process with SIGBUS.
        needed, size = (env.info()["last_pgno"] + 1) * env.stat()["psize"], os.path.getsize(path)
        if size < needed:
            env.close()
            raise LMDBFormatError(path, f"truncated: {size:,} bytes, its LMDB pages need {needed:,}")
    return env


class LMDBShardWriter:
    """Write one shard: `with LMDBShardWriter(path) as w: w.add_sample(encoded, shard_name)`.

    The environment is written under `<path>.partial`; on a clean exit it is synced, closed,
    hashed (sha256 and md5 in one read), fsynced and renamed to `path`. On an error the partial
    file is removed. `.samples`, `.bytes_written` (the file's size), `.sha256`, `.md5` after exit.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        self.samples = 0
        self.logical_bytes = 0  # the values laid end to end: the index's offsets
        self.bytes_written = 0
        self.sha256 = self.md5 = None
        self._env = self._txn = None

    def __enter__(self):
        self.partial.unlink(missing_ok=True)
        self._env = open_environment(self.partial, readonly=False)
        self._txn = self._env.begin(write=True)
        return self

    def _put(self, key: str, value: bytes) -> int:
        if not self._txn.put(key.encode(), value, overwrite=False):
            raise LMDBFormatError(self.path, f"sample {key!r} is written twice")
        offset = self.logical_bytes
        self.logical_bytes += len(value)
        self.samples += 1
        if self.samples % COMMIT_EVERY == 0:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
        return offset

    def add_sample(self, sample: EncodedSample, shard_name: str) -> SampleRecord:
        info = json.dumps(sample.info, sort_keys=True, separators=(",", ":")).encode()
        value, header = encode_value(sample.key, sample.label, "jpg", info, sample.payload)
        offset = self._put(sample.key, value)
        return SampleRecord(key=sample.key, shard=shard_name, label=sample.label, record_offset=offset,
                            record_size=len(value), payload_offset=offset + header,
                            payload_size=len(value) - header, payload_crc32c=payload_crc32c(sample.payload))

    def add_raw_record(self, raw, source="<record>", number=None) -> int:
        """Copy one value (a whole sample: it carries its key) verbatim; returns its logical offset."""
        fields = decode_value(raw, source)
        return self._put(fields["key"], bytes(raw))

    def __exit__(self, kind, value, traceback):
        try:
            if kind is None:
                self._txn.commit()
                self._txn = None
                self._env.sync(True)
            else:
                self._txn.abort()
                self._txn = None
        finally:
            self._env.close()
            self._env = None
        if kind is not None:
            self.partial.unlink(missing_ok=True)
            return False
        try:
            (self.sha256, self.md5), self.bytes_written = hash_file(self.partial, ("sha256", "md5"))
            with open(self.partial, "rb+") as handle:
                os.fsync(handle.fileno())
            self.partial.rename(self.path)
            fsync_dir(self.path.parent)
        except BaseException:
            self.partial.unlink(missing_ok=True)
            raise
        return False


def iter_shard_values(path, source=None):
    """(key, value bytes) of every entry, in cursor (key) order."""
    env = open_environment(path)
    try:
        with env.begin(buffers=True) as txn:
            for key, value in txn.cursor():
                yield bytes(key).decode(errors="replace"), bytes(value)
    except Exception as problem:  # lmdb.Error: a damaged environment
        if isinstance(problem, LMDBFormatError):
            raise
        raise LMDBFormatError(source or path, f"cannot read: {type(problem).__name__}: {problem}") from None
    finally:
        env.close()


def read_rows(shard, columns, rows, how) -> Iterator[RowRead]:
    """LMDB's reader, for runs and positions alike: a RowRead per row of a local shard, by cursor: one walk
    when the rows' keys are in cursor order (as the converter writes them), a seek where they are not."""
    import lmdb

    records = columns.records(rows)
    try:
        env = open_environment(shard.location)
    except LMDBFormatError as problem:
        for row, record in zip(rows.tolist(), records):
            yield RowRead(row, None, None, record.label, None, str(problem))
        return
    try:
        with env.begin(buffers=True) as txn:
            cursor = txn.cursor()
            positioned = False
            for row, record in zip(rows.tolist(), records):
                key = record.key.encode()
                try:
                    if not (positioned and cursor.next() and bytes(cursor.key()) == key):
                        positioned = cursor.set_key(key)
                    if not positioned:
                        yield RowRead(row, None, None, record.label, None,
                                      f"{shard.location}: sample {record.key!r} is not in the shard")
                        continue
                    value = cursor.value()
                    start = record.payload_offset - record.record_offset
                    if len(value) != record.record_size:
                        yield RowRead(row, None, None, record.label, None, (
                            f"{shard.location}: sample {record.key!r} is {len(value)} bytes, its index says "
                            f"{record.record_size}: the shard does not match its index"))
                        continue
                    fields = decode_value(value, shard.location)
                    yield RowRead(row, fields["ext"], bytes(value[start:start + record.payload_size]), record.label,
                                  fields["info"] if how.with_info else None, None)
                except (lmdb.Error, LMDBFormatError) as problem:
                    positioned = False
                    yield RowRead(row, None, None, record.label, None, f"{shard.location}: sample {record.key!r}: {problem}")
    finally:
        env.close()


# ---------------------------------------------------------------------------------------- checking


class _Walk:
    def __init__(self):
        self.found = []
        self.payloads_hashed = 0
        self.payloads_decoded = 0


def check_lmdb_shard(task: ShardTask) -> ShardResult:
    """Every check of one LMDB shard: size, sha256 and count against metadata (one read of the file);
    a cursor walk of every value against the index when the hash differs (to name the damaged
    sample), for remainder shards, and with --deep (which also decodes every payload)."""
    name, record = task.name, task.record
    result = ShardResult(name, task.group, [])
    path = Path(task.path)
    try:
        (sha256,), size = hash_file(path, ("sha256",))
    except OSError as problem:
        result.problems.append(error(name, f"cannot read the shard: {problem.strerror or problem}"))
        return result
    result.sha256, result.bytes_read = sha256, size
    problems = []
    size_differs = record is not None and size != record.bytes
    if size_differs:
        problems.append(error(name, f"size {size:,} bytes, metadata says {record.bytes:,} (truncated, extended or "
                                    f"replaced)"))
    sha_differs = record is not None and result.sha256 != record.sha256
    walk = _Walk()
    if not (sha_differs or size_differs or task.hash_payloads or task.deep):
        walk.found = [r.key for r in task.samples]
        result.keys = walk.found
        result.problems = problems + metadata_mismatches(task, result.sha256, len(task.samples), "samples", "")
        return result
    by_key = {r.key: r for r in task.samples}
    sample_problems = []
    try:
        for key, value in iter_shard_values(path, name):
            walk.found.append(key)
            expected = by_key.get(key)
            try:
                fields = decode_value(value, name)
            except LMDBFormatError as problem:
                sample_problems.append(error(name, str(problem).removeprefix(f"{name}: "), key))
                continue
            if fields["key"] != key:
                sample_problems.append(error(name, f"the value names sample {fields['key']!r}", key))
            if expected is None:
                sample_problems.append(error(name, NOT_IN_INDEX, key))
                continue
            payload = fields["payload"]
            if len(value) != expected.record_size or len(payload) != expected.payload_size:
                sample_problems.append(error(name, f"value of {len(value)} bytes (payload {len(payload)}), the index "
                                                   f"says {expected.record_size} ({expected.payload_size})", key))
            if expected.payload_crc32c is not None:
                walk.payloads_hashed += 1
                why = payload_problem(expected, payload)
                if why:
                    sample_problems.append(error(name, why, key))
            _, field_problems = sample_field_problems(str(fields["label"]).encode(), fields["info"], task.classes,
                                                      expected)
            sample_problems.extend(error(name, text, key) for text in field_problems)
            if task.deep:
                walk.payloads_decoded += 1
                problem = decode_problem(fields["ext"], payload, task.tensor_layout)
                if problem:
                    sample_problems.append(error(name, problem, key))
    except LMDBFormatError as problem:
        sample_problems.append(error(name, str(problem).removeprefix(f"{name}: ")))
    seen = set(walk.found)
    sample_problems.extend(error(name, "listed in the sample index but not in the shard", r.key)
                           for r in task.samples if r.key not in seen)
    detail = ("; every sample still matches the index, so what changed is in LMDB's own pages, or metadata's "
              "record of the shard") if not sample_problems and not size_differs else ""
    result.keys = walk.found
    result.payloads_hashed, result.payloads_decoded = walk.payloads_hashed, walk.payloads_decoded
    result.problems = problems + metadata_mismatches(task, result.sha256, len(walk.found), "samples", detail) \
        + sample_problems
    return result


class LMDBFormat(ShardFormat):
    name = "lmdb"
    description = "LMDB environments of JPEG, one per shard (cursor reads)"
    remainder_suffix = ".lmdb"
    records_are_byte_ranges = False
    reads_streams = False

    def shard_name(self, split, number, count):
        return f"{split}-{number:06d}.lmdb"

    def is_shard_file(self, name):
        return bool(SHARD_FILE.match(name))

    def order_in_shard(self, samples):
        return sorted(samples, key=lambda sample: sample.key.encode())

    def open_writer(self, path):
        return LMDBShardWriter(path)


    def read_record(self, path, record) -> bytes:
        env = open_environment(path)
        try:
            with env.begin() as txn:
                value = txn.get(record.key.encode())
        finally:
            env.close()
        if value is None:
            raise LMDBFormatError(path, f"sample {record.key!r} is not in the shard")
        return value

    def iter_samples(self, location, start, stop, stream=None, label_offset=0, verify_crc=True):
        if stream is not None:
            raise LMDBFormatError(location, "LMDB shards are read from local files only (copy the shard locally)")
        offset = 0
        for key, value in iter_shard_values(location):
            if offset >= start and (stop is None or offset < stop):
                fields = decode_value(value, location)
                yield {"__key__": key, "__offset__": offset, fields["ext"]: fields["payload"],
                       "cls": str(fields["label"]).encode(), "json": fields["info"]}
            offset += len(value)

    def read_sample(self, location, record, label_offset=0):
        fields = decode_value(self.read_record(location, record), location)
        return {"__key__": fields["key"], "__offset__": record.record_offset, fields["ext"]: fields["payload"],
                "cls": str(fields["label"]).encode(), "json": fields["info"]}

    def read_run(self, shard, columns, rows, how=PLAIN):
        return read_rows(shard, columns, rows, how)

    def read_positions(self, shard, columns, rows, how=PLAIN):
        return read_rows(shard, columns, rows, how)

    def check_shard(self, task):
        return check_lmdb_shard(task)


LMDB = LMDBFormat()
