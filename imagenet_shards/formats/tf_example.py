"""The `tf.train.Example` wire format, encoded and parsed by hand.

    Example { Features features = 1; }   Features { map<string, Feature> feature = 1; }
    Feature { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    each *List { repeated value = 1; }  (floats and int64s packed, but unpacked is legal too)

Encoding (`serialize_example`, `example_pieces`): not with the `tfrecord` package's
`TFRecordWriter.serialize_tf_example`, for two reasons measured here: (1) it leaves the feature
map in hash order, which changes from one process to the next (protobuf's upb backend), so
shards would not be byte-reproducible; (2) `import tfrecord` imports torch (2.6 s per process:
a 48-image conversion took 7 s instead of 0.7 s with 2 workers). The encoding is protobuf's
deterministic serialization (features sorted by name); the tests check it byte for byte against
the package's protobuf classes (`SerializeToString(deterministic=True)`).

Parsing (`parse_example`, `example_feature_spans`): decodes the wire format directly into
memoryviews of the record, so the image bytes are never copied, and so that reading needs
neither protobuf nor `import tfrecord` (which imports torch: 2.6 s here).
"""

import struct

from imagenet_shards.errors import Error

# ---------------------------------------------------------------------------------------
# Parsing


class ExampleFormatError(Error, ValueError):
    """The data of a record is not a valid tf.train.Example."""


def _varint(buf, pos, end):
    result = shift = 0
    while True:
        if pos >= end:
            raise ExampleFormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ExampleFormatError("varint longer than 10 bytes")


def _span(buf, pos, end):
    """(start, stop) of a length-delimited field's body whose length varint is at `pos`."""
    if pos >= end:
        raise ExampleFormatError("truncated length")
    size = buf[pos]
    if size < 0x80:  # the usual one-byte length, without a call
        pos += 1
    else:
        size, pos = _varint(buf, pos, end)
    stop = pos + size
    if stop > end:
        raise ExampleFormatError(f"{size} bytes announced, {end - pos} left")
    return pos, stop


def _skip(buf, pos, end, tag):
    """Position after a field we do not want (unknown fields are legal protobuf)."""
    if tag >= 0x80:  # a multi-byte tag: re-read it whole
        tag, pos = _varint(buf, pos - 1, end)
    wire = tag & 7
    if wire == 0:
        return _varint(buf, pos, end)[1]
    if wire == 2:
        return _span(buf, pos, end)[1]
    size = {1: 8, 5: 4}.get(wire)
    if size is None:
        raise ExampleFormatError(f"unsupported wire type {wire}")
    if pos + size > end:
        raise ExampleFormatError("truncated fixed-size field")
    return pos + size


# Tags are (field number << 3) | wire type; these are the one-byte tags of the fields we read.
_LEN_FIELD_1, _LEN_FIELD_2 = 0x0A, 0x12
_FEATURE_KINDS = {0x0A: "bytes", 0x12: "float", 0x1A: "int64"}
_VARINT_FIELD_1, _FIXED32_FIELD_1 = 0x08, 0x0D


def _signed64(value):
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature_values(buf, start, end):
    """(kind, values) of a Feature; bytes values as (start, end) spans of `buf`."""
    kind, values = None, []
    pos = start
    while pos < end:
        tag = buf[pos]
        pos += 1
        list_kind = _FEATURE_KINDS.get(tag)
        if list_kind is None:
            pos = _skip(buf, pos, end, tag)
            continue
        list_start, list_end = _span(buf, pos, end)
        pos = list_end
        if list_kind != kind:
            kind, values = list_kind, []  # oneof: the last kind written wins
        item = list_start
        while item < list_end:
            tag = buf[item]
            item += 1
            if tag == _LEN_FIELD_1:
                value_start, value_end = _span(buf, item, list_end)
                item = value_end
                if kind == "bytes":
                    values.append((value_start, value_end))
                elif kind == "int64":  # packed
                    while value_start < value_end:
                        number, value_start = _varint(buf, value_start, value_end)
                        values.append(_signed64(number))
                else:  # packed floats
                    if (value_end - value_start) % 4:
                        raise ExampleFormatError("packed floats not a multiple of 4 bytes")
                    values.extend(struct.unpack_from(f"<{(value_end - value_start) // 4}f", buf, value_start))
            elif tag == _VARINT_FIELD_1 and kind == "int64":
                number, item = _varint(buf, item, list_end)
                values.append(_signed64(number))
            elif tag == _FIXED32_FIELD_1 and kind == "float":
                if item + 4 > list_end:
                    raise ExampleFormatError("truncated float")
                values.append(struct.unpack_from("<f", buf, item)[0])
                item += 4
            else:
                item = _skip(buf, item, list_end, tag)
    return kind, values


def example_feature_spans(data, wanted=None):
    """{feature name: (kind, values)} of a serialized Example, bytes values as (start, end) spans.

    `wanted`: a set of feature names to decode (the others are left out: about half the
    cost for a reader that needs the image, label and key of a TF-slim record).

    The spans let a writer find where its payload lies inside the record, and let a reader
    take views of it without copying. Written out as loops rather than a generic field
    walker: this runs once per sample in the loader (as fast as protobuf's own parse, which
    would also copy the image; docs/design-figures.md).
    """
    buf = memoryview(data)
    end = len(buf)
    features = {}
    pos = 0
    try:
        while pos < end:  # Example
            tag = buf[pos]
            pos += 1
            if tag != _LEN_FIELD_1:
                pos = _skip(buf, pos, end, tag)
                continue
            features_start, features_end = _span(buf, pos, end)
            pos = features_end
            entry = features_start
            while entry < features_end:  # Features: map entries
                tag = buf[entry]
                entry += 1
                if tag != _LEN_FIELD_1:
                    entry = _skip(buf, entry, features_end, tag)
                    continue
                entry_start, entry_end = _span(buf, entry, features_end)
                entry = entry_end
                name, value_span = "", None
                item = entry_start
                while item < entry_end:  # one entry: key, value
                    tag = buf[item]
                    item += 1
                    if tag == _LEN_FIELD_1:
                        start, item = _span(buf, item, entry_end)
                        name = str(buf[start:item], "utf-8")
                    elif tag == _LEN_FIELD_2:
                        value_span = _span(buf, item, entry_end)
                        item = value_span[1]
                    else:
                        item = _skip(buf, item, entry_end, tag)
                if wanted is None or name in wanted:  # a repeated map key: the last one wins, as in protobuf
                    features[name] = _feature_values(buf, *value_span) if value_span else (None, [])
    except UnicodeDecodeError as error:
        raise ExampleFormatError(f"a feature name is not UTF-8: {error}") from None
    return features


def parse_example(data, wanted=None) -> dict:
    """{feature name: list of values}: bytes values are memoryviews of `data` (no copy).

    `wanted`: only these features (see `example_feature_spans`)."""
    view = memoryview(data)
    result = {}
    for name, (kind, values) in example_feature_spans(view, wanted).items():
        result[name] = [view[start:end] for start, end in values] if kind == "bytes" else values
    return result


# ---------------------------------------------------------------------------------------
# Encoding


def _encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # protobuf int64: negative values as 10-byte two's complement
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_ONE_BYTE = [bytes((n,)) for n in range(256)]


def _prefix(tag: int, size: int) -> bytes:
    """A length-delimited field's tag and length."""
    return _ONE_BYTE[tag] + _encode_varint(size)


def _feature_pieces(values, dtype: str):
    """(pieces, size) of one Feature message's body. Bytes values stay separate pieces, uncopied."""
    if dtype == "byte":
        pieces = []
        for value in values:
            pieces += (_prefix(_LEN_FIELD_1, len(value)), value)
        size = sum(map(len, pieces))
        return [_prefix(0x0A, size), *pieces], size + len(_prefix(0x0A, size))  # Feature.bytes_list
    if dtype == "int":
        packed = b"".join(_encode_varint(int(v)) for v in values)
    elif dtype == "float":
        packed = struct.pack(f"<{len(values)}f", *values)
    else:
        raise ValueError(f"feature dtype {dtype!r}: expected 'byte', 'int' or 'float'")
    body = _prefix(_LEN_FIELD_1, len(packed)) + packed if packed else b""
    piece = _prefix(0x1A if dtype == "int" else 0x12, len(body)) + body  # Feature.int64_list / float_list
    return [piece], len(piece)


def example_pieces(features: dict, locate=None):
    """A tf.train.Example as a list of byte strings to join (see `serialize_example`), and the
    index in that list of the first value of feature `locate` (a bytes feature), or None.

    Built with the sizes computed up front, so each bytes value (the image) is one piece of
    the list, copied once when the pieces are joined.
    """
    entries, located = [], None
    for name in sorted(features):
        value, dtype = features[name]
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if dtype == "byte":
            values = [v if isinstance(v, bytes) else bytes(v) for v in values]
        name_bytes = name.encode("utf-8")
        feature, feature_size = _feature_pieces(values, dtype)
        key = _prefix(_LEN_FIELD_1, len(name_bytes)) + name_bytes
        value_prefix = _prefix(_LEN_FIELD_2, feature_size)
        if name == locate and dtype == "byte" and values:
            # 1 (the Example's prefix) + entries so far + entry prefix, key, value prefix, bytes_list prefix, value prefix
            located = 1 + len(entries) + 5
        entries += (_prefix(_LEN_FIELD_1, len(key) + len(value_prefix) + feature_size), key, value_prefix, *feature)
    return [_prefix(_LEN_FIELD_1, sum(map(len, entries))), *entries], located  # Example.features


def serialize_example(features: dict) -> bytes:
    """Serialize {name: (value or list, "byte" | "int" | "float")} as a tf.train.Example.

    The datum format of the tfrecord package's `serialize_tf_example`; the bytes of
    protobuf's deterministic serialization (map entries sorted by name, lists packed).
    """
    return b"".join(example_pieces(features)[0])

