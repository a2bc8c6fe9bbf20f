"""Where a sample's bytes are written to and read from a tar shard.

Writing: `TarShardWriter` writes standard tar (GNU tar, Python's tarfile and
webdataset read it) with fixed mtime, owner and mode, members in the order given,
so the same samples always give the same bytes. It hashes while it writes, and
publishes the shard atomically (see fileio): no shard is ever visible half-written.

Reading: `iter_tar_members` parses the 512-byte headers directly instead of going
through `tarfile`, which costs several times more Python per member (docs/design-figures.md). It works on any
readable stream: a local file, an HTTP response, a byte range. `iter_tar_samples`
groups members into webdataset-style sample dicts.
"""

import mmap
import os
import tarfile
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from imagenet_shards.formats.base import ShardDataError
from imagenet_shards.fileio import HashingAtomicWriter

BLOCK = 512
RECORD = 20 * BLOCK  # tar's default blocking factor; the archive is padded to it
_ZERO_BLOCK = bytes(BLOCK)


class TarFormatError(ShardDataError):
    """A shard that is not valid tar: names the shard, the byte offset and the problem."""

    def __init__(self, source, offset, problem):
        super().__init__(f"{source}: {problem} (at byte {offset})")
        self.source = str(source)
        self.offset = offset
        self.problem = problem


def split_key(name: str):
    """webdataset's rule: the key is the path up to the first dot of the basename."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


def _tarfile_member_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.GNU_FORMAT, encoding="utf-8", errors="strict")


# tarfile's own header for a placeholder member; member_header patches its name, size and
# checksum fields: ~10x cheaper than building a TarInfo per member (3 members a sample).
_TEMPLATE = _tarfile_member_header("x", 0)
# Checksum of every field but name and size (mode/uid/gid, mtime, the rest), the checksum field as spaces.
_TEMPLATE_SUM = sum(_TEMPLATE[100:124]) + sum(_TEMPLATE[136:148]) + 8 * 0x20 + sum(_TEMPLATE[156:])
_MAX_OCTAL_SIZE = 8**11  # 11 octal digits; larger sizes need GNU base-256: left to tarfile


def member_header(name: str, size: int) -> bytes:
    """A deterministic header: mtime 0, uid/gid 0, no owner names, mode 0644.

    Byte-identical to tarfile's GNU_FORMAT header; names over 100 bytes (GNU long-name
    member) and sizes of 8 GiB or more go through tarfile itself.
    """
    encoded = name.encode("utf-8")
    if len(encoded) > 100 or not 0 <= size < _MAX_OCTAL_SIZE:
        return _tarfile_member_header(name, size)
    size_field = b"%011o\0" % size
    checksum = _TEMPLATE_SUM + sum(encoded) + sum(size_field)
    return b"".join((encoded.ljust(100, b"\0"), _TEMPLATE[100:124], size_field, _TEMPLATE[136:148],
                     b"%06o\0 " % checksum, _TEMPLATE[156:]))


def padding(size: int) -> int:
    return -size % BLOCK


@dataclass(frozen=True)
class WrittenMember:
    header_offset: int  # where the member's header starts in the shard
    data_offset: int  # where its data starts
    size: int


@dataclass(frozen=True)
class WrittenSample:
    record_offset: int  # first byte of the sample's first header
    record_size: int  # bytes from there to the end of its last member's padding
    members: dict  # extension -> WrittenMember


class TarShardWriter(HashingAtomicWriter):
    """Write one shard: `with TarShardWriter(path) as w: w.add_members(key, [(ext, data), ...])`.

    On a clean exit the shard is flushed, fsynced and renamed to `path`; `w.sha256` and
    `w.bytes_written` then describe it. On an exception the partial file is removed.
    """

    def __init__(self, path):
        super().__init__(path)
        self.samples = 0

    def add_members(self, key: str, members) -> WrittenSample:
        if "." in key.rsplit("/", 1)[-1]:
            raise ValueError(f"sample key {key!r} contains a dot; webdataset would split it")
        start = self.bytes_written
        written = {}
        for ext, data in members:
            header_offset = self.bytes_written
            self.write(member_header(f"{key}.{ext}", len(data)))
            written[ext] = WrittenMember(header_offset, self.bytes_written, len(data))
            self.write(data)
            self.write(_ZERO_BLOCK[: padding(len(data))])
        self.samples += 1
        return WrittenSample(start, self.bytes_written - start, written)

    def add_raw_record(self, raw) -> int:
        """Append one sample's pre-formed member blocks (headers, data, padding) verbatim.

        `raw` is a sample's whole byte range copied from another shard (a SampleRecord's
        record_offset/record_size): tar headers hold no offsets, so the copy is valid as it
        is and its payload stays byte-identical. Returns the shard offset it was written at.
        """
        if len(raw) % BLOCK:
            raise ValueError(f"a raw tar record must be whole {BLOCK}-byte blocks, got {len(raw)} bytes")
        start = self.bytes_written
        self.write(raw)
        self.samples += 1
        return start

    @staticmethod
    def finished_size(record_bytes: int) -> int:
        """The size of a shard whose member blocks total `record_bytes`, after `_write_trailer`'s padding."""
        end = record_bytes + 2 * BLOCK
        return end + (-end % RECORD)

    def _write_trailer(self):
        # End-of-archive: two zero blocks, then pad to a whole record like tarfile does.
        self.write(bytes(self.finished_size(self.bytes_written) - self.bytes_written))


class TarMember(NamedTuple):
    name: str
    header_offset: int
    data_offset: int
    data: memoryview  # zero-copy view; bytes(member.data) for text members


def _octal(field: bytes, source, offset, what) -> int:
    try:  # the common case, digits then NULs/spaces: one call (identical result when it parses)
        return int(field.rstrip(b"\0 "), 8)
    except ValueError:
        pass
    if field[:1] == b"\x80":  # GNU base-256 for large values
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarFormatError(source, offset, f"corrupt tar header: {what} field {bytes(field)!r} is not octal") from None


def _checksum_ok(header: bytes, stored: int) -> bool:
    # The unsigned sum of the header's bytes, the checksum field counting as eight spaces
    # (0x20 * 8 = 256). Summed with zlib.adler32, whose low half is 1 + the byte sum modulo
    # 65521: exact for pieces of at most 256 bytes (256 * 255 < 65521), and ~6x faster than
    # sum() over the bytes, which was half the cost of parsing a header.
    adler = zlib.adler32
    return (adler(header[:148]) & 0xFFFF) + (adler(header[156:412]) & 0xFFFF) + (adler(header[412:512]) & 0xFFFF) \
        + 256 - 3 == stored


def _parse_header(header: bytes, source, offset, verify_checksums):
    """Return (name, size, typeflag) of one header block."""
    if verify_checksums:
        stored = _octal(header[148:156], source, offset, "checksum")
        if not _checksum_ok(header, stored):
            raise TarFormatError(source, offset, "corrupt tar header: checksum mismatch")
    size = _octal(header[124:136], source, offset, "size")
    name = header[:100].split(b"\0", 1)[0]
    if header[257:263] == b"ustar\0":  # POSIX ustar: a name may continue in the prefix field
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape"), size, header[156:157]


def _describe(what) -> str:
    """`what` of a read: a text, or (name, size) of a member, formatted only when a read fails."""
    if isinstance(what, tuple):
        return f"member {what[0]!r} ({what[1]} bytes)"
    return what


def _blocks_from_mmap(path, stop_at):
    """(header, data view) pairs from a local file, mapped: no copy of the data."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            raise TarFormatError(path, 0, "empty file (zero bytes)")
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    return _blocks_from_buffer(memoryview(mapped), path, stop_at)


def _blocks_from_buffer(view, source, stop_at):
    """Reads from a whole shard already in memory (or mapped): views, no copy."""
    size = len(view)
    if size == 0:
        raise TarFormatError(source, 0, "empty file (zero bytes)")
    end = size if stop_at is None else min(stop_at, size)

    def read(n, position, what):
        if position + n > size:
            raise TarFormatError(source, position, f"truncated: {_describe(what)} needs {n} bytes, only "
                                                   f"{max(size - position, 0)} remain")
        return view[position : position + n]

    return read, end


STREAM_CHUNK = 1 << 24  # a claimed size above this is read in chunks: memory follows the bytes that arrive


def read_exactly(stream, n: int) -> bytes:
    """Up to `n` bytes of `stream` (fewer only at its end): one read when `n` is at most STREAM_CHUNK, else
    chunks, so a hostile claimed size (a tar member, a TFRecord length) allocates only what the stream holds."""
    if n <= STREAM_CHUNK:
        return stream.read(n)
    parts, left = [], n
    while left > 0:
        chunk = stream.read(min(STREAM_CHUNK, left))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _blocks_from_stream(stream, source, end=None):
    def read(n, where, what):
        if end is not None and where + n > end:
            raise TarFormatError(source, where, f"truncated: {_describe(what)} needs {n} bytes, only "
                                                f"{max(end - where, 0)} remain in the range read")
        data = read_exactly(stream, n)
        if len(data) != n:
            raise TarFormatError(source, where, f"truncated: {_describe(what)} needs {n} bytes, only {len(data)} remain")
        return memoryview(data)

    return read


def iter_tar_members(source, offset=0, verify_checksums=True, stop_at=None, stream=None, buffer=None):
    """Yield the regular-file members of a tar shard as `TarMember`s.

    `source` is a local path (read through mmap, so member data are views with no
    copy) or, with `stream` given, the name used in messages for that readable
    stream (an HTTP response, a byte range). With `buffer` (a bytes-like object holding
    the whole shard, e.g. a mapping the caller already made), the shard is walked in
    place and `source` only names it in messages. `offset` is where the stream starts in
    the shard, so reported offsets are always shard offsets; `stop_at` ends the walk
    at that shard offset (the end of a byte range). Raises TarFormatError for a bad
    header checksum, a non-octal field or a truncated member.
    """
    if buffer is not None:
        read, end = _blocks_from_buffer(memoryview(buffer), source, stop_at)
    elif stream is None:
        read, end = _blocks_from_mmap(source, stop_at)
    else:
        read, end = _blocks_from_stream(stream, source, stop_at), stop_at
    long_name = None
    pax_name = None
    while end is None or offset < end:
        header = bytes(read(BLOCK, offset, "a header" if offset else "the first header"))
        if header == _ZERO_BLOCK:
            return
        name, size, kind = _parse_header(header, source, offset, verify_checksums)
        data_offset = offset + BLOCK
        pad = -size % BLOCK
        data = read(size + pad, data_offset, (name, size))[:size]
        header_offset, offset = offset, data_offset + size + pad
        if kind == b"L":  # GNU long name for the next member
            long_name = bytes(data).rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if kind in (b"x", b"g"):  # pax extended header: only the path matters here
            for line in bytes(data).decode("utf-8", "surrogateescape").splitlines():
                _, _, record = line.partition(" ")
                if record.startswith("path="):
                    pax_name = record[5:]
            continue
        if kind not in (b"0", b"\0", b"7"):
            long_name = pax_name = None
            continue  # directories, links: not samples
        if long_name or pax_name:
            name = pax_name or long_name
            long_name = pax_name = None
        yield TarMember(name, header_offset, data_offset, data)
    if stop_at is None:
        raise TarFormatError(source, offset, "truncated: the end-of-archive marker is missing")


def iter_tar_samples(source, offset=0, verify_checksums=True, stop_at=None, stream=None):
    """Group consecutive members with one key into webdataset-style sample dicts.

    Each dict has `__key__`, `__url__` (the shard), `__offset__` (its first header's
    shard offset) and one entry per extension, holding the member's data as a
    memoryview (`bytes(sample["cls"])` for text members).
    """
    sample = None
    for member in iter_tar_members(source, offset, verify_checksums, stop_at, stream):
        key, ext = split_key(member.name)
        if sample is None or key != sample["__key__"]:
            if sample is not None:
                yield sample
            sample = {"__key__": key, "__url__": str(source), "__offset__": member.header_offset}
        sample[ext] = member.data
    if sample is not None:
        yield sample


def read_member(location: str, record, ext: str):
    """The data of a sample's `<key>.<ext>` member in a local tar shard, or None if the sample has
    no such member. Walks the member headers inside the sample's byte range: a few small reads."""
    end = record.record_offset + record.record_size
    with open(location, "rb") as handle:
        offset, long_name = record.record_offset, None
        while offset + BLOCK <= end:
            header = os.pread(handle.fileno(), BLOCK, offset)
            try:
                size = int(header[124:136].strip(b"\0 ") or b"0", 8)
            except ValueError:  # not a tar header (another container): no member to find
                return None
            data_offset = offset + BLOCK
            if data_offset + size > end:  # a claimed size past the sample's range: never allocated nor read
                return None
            offset = data_offset + size + (-size % BLOCK)
            if header[156:157] == b"L":  # GNU long name of the next member
                long_name = os.pread(handle.fileno(), size, data_offset).rstrip(b"\0").decode("utf-8", "replace")
                continue
            name = long_name or header[:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            long_name = None
            if split_key(name)[1] == ext:
                return os.pread(handle.fileno(), size, data_offset)
    return None
