"""The sample index's columns held narrow (imagenet_shards/index/compact.py): at most 60 bytes a sample for an
ImageNet-shaped index (a figure from the arrays' sizes), and every value read back as the text holds
it when it does not fit the narrow form (offsets past 4 GiB, negative deltas, 65,537 member patterns)."""

import pickle
import random

import numpy as np

from imagenet_shards.index import SampleRecord, check_columns_match, encode_sample_index, parse_sample_columns
from imagenet_shards.index.compact import RelativeColumn, held_bytes

BOUND = 60  # bytes a sample (issue 45: the main process at ImageNet's count)


def _imagenet_like(count, per_shard=1250, boxes=False, seed=0):
    """Records as the converter writes ImageNet's train split: wnid_number keys, 1,000 classes, JPEGs of
    20-300 KB in tar records (cls, json, jpg members), the bbox column present and (boxes=False) empty."""
    rng = random.Random(seed)
    records, offset = [], 0
    for number in range(count):
        if number % per_shard == 0:
            offset = 0
        label = rng.randrange(1000)
        payload = rng.randrange(20_000, 300_000)
        size = 1536 + (payload + 511) // 512 * 512
        bbox = "0.125,0.25,0.75,0.875" if boxes and number % 5 < 2 else ""
        key = f"n{1440764 + label * 7919:08d}_{number % 1300 + 1}"  # 12-15 characters, as ImageNet's
        records.append(SampleRecord(key, f"train-{number // per_shard:06d}.tar",
                                    label, offset, size, offset + 1536, payload, rng.getrandbits(32),
                                    f"cls:{offset};json:{offset + 512};jpg:{offset + 1024}", bbox))
        offset += size  # records touch: the next one starts where this one ends
    return records


def _columns(records):
    return parse_sample_columns(encode_sample_index(records).splitlines())


def _held(columns) -> int:
    """The bytes the columns' arrays hold, from each array's own size (not SampleColumns.nbytes)."""
    total = 0
    for name, value in vars(columns).items():
        if isinstance(value, RelativeColumn):
            value = value.delta  # its base is record_offsets, counted as itself
        if isinstance(value, np.ndarray):
            total += value.itemsize if value.ndim == 1 and value.strides == (0,) else value.size * value.itemsize
    return total


def test_an_imagenet_shaped_index_holds_at_most_60_bytes_a_sample():
    records = _imagenet_like(20_000)
    columns = _columns(records)
    rows = len(columns)
    keys = sum(len(r.key.encode()) for r in records)
    assert _held(columns) == columns.nbytes
    # keys + uint32 key offsets + int32 shard, label + int64 record offset + uint32 record size, payload size,
    # CRC32C + uint16 payload and header deltas, pattern id + uint8 ext; the empty bbox column: one value
    assert columns.nbytes == keys + 4 * (rows + 1) + rows * (4 + 4 + 8 + 4 + 4 + 4 + 2 + 2 + 2 + 1) + 4
    assert columns.nbytes / rows <= BOUND, f"{columns.nbytes / rows:.1f} bytes a sample"
    for grouped in (columns.in_shard_order(), columns.take(np.arange(rows)[::-1])):
        assert grouped.nbytes / rows <= BOUND
    assert check_columns_match(columns, records) is None
    unpickled = pickle.loads(pickle.dumps(columns))  # a spawned worker's or a pool task's copy: as compact
    assert unpickled.nbytes == columns.nbytes and unpickled.record(7) == records[7]


def test_boxes_cost_only_where_the_index_has_them():
    records = _imagenet_like(5_000, boxes=True)
    columns = _columns(records)
    assert check_columns_match(columns, records) is None
    boxed = sum(1 for r in records if r.bbox)
    empty = _columns([r._replace(bbox="") for r in records])
    assert columns.nbytes - empty.nbytes == 4 * len(records) - 4 + 32 * boxed  # a box id a row, 4 floats a box
    assert empty.has_boxes and empty.box(3) is None and held_bytes(empty.box_ids) == 4
    taken = columns.take([1, 2, 0])
    assert [taken.box(n) for n in range(3)] == [columns.box(1), columns.box(2), columns.box(0)]


def test_values_past_the_narrow_forms_read_back_as_written():
    """Record offsets past 4 GiB, a payload 5 GB after its record, a header 3 GB after it, a payload
    before its record: the deltas widen to int64 and every record reads back as its line."""
    big = 5 * 2**30
    records = [
        SampleRecord("a", "s.tar", 1, 0, 512, 1536, 10, 1, "cls:0;json:512;jpg:1024", ""),
        SampleRecord("b", "s.tar", 2, big, 512, big + 1536, 10, 2, f"cls:{big};jpg:{big + 1024}", ""),
        SampleRecord("c", "s.tar", 3, 2 * big, 512, 2 * big + big, 10, 3, f"jpg:{2 * big + 3 * 2**30}", ""),
        SampleRecord("d", "s.tar", 4, 4 * big, 512, 4 * big - 100, 10, 4, "", ""),
    ]
    for columns in (_columns(records), _columns(records).take([3, 2, 1, 0])):
        expected = records if columns.key(0) == "a" else records[::-1]
        assert check_columns_match(columns, expected) is None
        assert columns.payload_offsets[:].tolist() == [r.payload_offset for r in expected]
        assert int(columns.payload_offsets[1]) == expected[1].payload_offset
    columns = _columns(records)
    assert columns.payload_headers.tolist() == [1024, big + 1024, 2 * big + 3 * 2**30, -1]
    assert np.asarray(columns.payload_headers).dtype == np.int64
    assert _columns(records[:2]).nbytes < _columns(records).nbytes  # narrow while the values fit


def test_more_member_patterns_than_two_bytes_number():
    count = (1 << 16) + 2
    records = [SampleRecord(f"k{n}", "s.tar", 0, n * 4096, 4096, n * 4096 + 2048 + 512, 8, 0,
                            f"cls:{n * 4096};json:{n * 4096 + 512 + n % 1000};x{n // 1000}:{n * 4096 + 2048}", "")
               for n in range(count)]
    columns = _columns(records)
    assert len(columns.patterns) == count + 1 and columns.member_patterns.dtype == np.int32
    for row in (0, 999, 65_535, 65_536, count - 1):
        assert columns.record(row) == records[row]
