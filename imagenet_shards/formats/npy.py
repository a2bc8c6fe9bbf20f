"""uint8 tensors as .npy bytes: written with numpy, read with a cached header parse.

`np.load` (and webdataset's `.npy` decoder) parse the header text with
`ast.literal_eval` on every sample. Every sample of a shard has the same header, so
parsing it once and caching (dtype, shape, order) makes decoding a `np.frombuffer`
view over the payload, with no copy.
"""

import ast
import io
import struct

import numpy as np

from imagenet_shards.errors import Error

MAGIC = b"\x93NUMPY"
_header_cache = {}
HEADER_CACHE_ENTRIES = 64  # distinct headers kept (a dataset has one or a few): bounded for hostile data
HEADER_CACHE_BYTES = 4096  # a longer header is parsed each time, never kept


class NpyFormatError(Error, ValueError):
    pass


def encode_npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def _parse_header(text: bytes):
    try:
        fields = ast.literal_eval(text.decode("latin1"))
        dtype = np.dtype(fields["descr"])
        shape = tuple(fields["shape"])
        fortran = bool(fields["fortran_order"])
        count = int(np.prod(shape, dtype=np.int64))
    except Exception as error:  # any malformed header
        raise NpyFormatError(f"malformed .npy header {text[:80]!r}: {error}") from None
    if dtype.hasobject:
        raise NpyFormatError("refusing a .npy payload with Python objects (it would need pickle)")
    return dtype, shape, "F" if fortran else "C", count


def decode_npy(buffer) -> np.ndarray:
    """Return a read-only array viewing `buffer` (bytes or memoryview); no copy."""
    view = memoryview(buffer)
    if view[:6] != MAGIC:
        raise NpyFormatError("not a .npy payload (bad magic)")
    major = view[6]
    if major == 1:
        (header_len,) = struct.unpack_from("<H", view, 8)
        start = 10
    elif major in (2, 3):
        (header_len,) = struct.unpack_from("<I", view, 8)
        start = 12
    else:
        raise NpyFormatError(f"unsupported .npy version {major}")
    header = bytes(view[start : start + header_len])
    parsed = _header_cache.get(header)
    if parsed is None:
        parsed = _parse_header(header)
        if len(header) <= HEADER_CACHE_BYTES:
            if len(_header_cache) >= HEADER_CACHE_ENTRIES:
                _header_cache.clear()
            _header_cache[header] = parsed
    dtype, shape, order, count = parsed
    data_start = start + header_len
    if len(view) - data_start != count * dtype.itemsize:
        raise NpyFormatError(
            f".npy payload holds {len(view) - data_start} data bytes, its header says {count * dtype.itemsize}"
        )
    array = np.frombuffer(view, dtype=dtype, count=count, offset=data_start)
    return array.reshape(shape, order=order)
