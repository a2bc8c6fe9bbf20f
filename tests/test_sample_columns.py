"""The columnar sample index (imagenet_shards.index.columns) against the text index, and what it is for:
a DataLoader worker's private memory does not grow with the size of the index."""

import hashlib
import json
import random
import shutil

import numpy as np
import pytest

from imagenet_shards.errors import DatasetError
from imagenet_shards.index import SampleRecord, encode_sample_index, write_metadata, write_sample_index
from imagenet_shards.index import (check_columns_match, columns_from_records, parse_sample_columns, read_sample_columns,
                            read_sample_index)


def _records(count, shards=7, seed=0):
    rng = random.Random(seed)
    records = []
    offsets = [0] * shards
    for number in range(count):
        shard = rng.randrange(shards)  # shards interleaved in the text: the columns regroup them
        offset = offsets[shard]
        size = 1536 + 512 * rng.randrange(1, 5)
        key = f"n{rng.randrange(10**8):08d}/n{number:07d}_{'x' * rng.randrange(0, 30)}"
        records.append(SampleRecord(key, f"train-{shard:06d}.tar", rng.randrange(-1, 1000), offset, size,
                                    offset + 1536, size - 1536 - rng.randrange(0, 500),
                                    rng.getrandbits(32), f"cls:{offset};json:{offset + 512};jpg:{offset + 1024}"))
        offsets[shard] += size
    return records


def test_columns_equal_the_text_index(tmp_path):
    records = _records(3000)
    write_sample_index(tmp_path / "train.index.tsv", records)
    columns = read_sample_columns(str(tmp_path / "train.index.tsv"))
    assert check_columns_match(columns, read_sample_index(tmp_path / "train.index.tsv")) is None
    assert [columns.key(row) for row in range(len(columns))] == [r.key for r in records]
    assert columns.labels.tolist() == [r.label for r in records]
    assert columns.payload_sizes.tolist() == [r.payload_size for r in records]
    assert columns.payload_headers.tolist() == [r.record_offset + 1024 for r in records]
    assert {columns.exts[e] for e in columns.payload_exts} == {"jpg"}
    assert columns.has_checksums and columns.checksums.tolist() == [r.payload_crc32c for r in records]
    assert columns.nbytes / len(columns) <= 120

    grouped = columns.in_shard_order()
    starts, sizes = grouped.group_ranges()
    assert len(starts) == 7 and sizes.sum() == 3000
    by_shard = {}
    for record in records:
        by_shard.setdefault(record.shard, []).append(record)
    expected = [r for shard in dict.fromkeys(r.shard for r in records) for r in by_shard[shard]]
    assert check_columns_match(grouped, expected) is None


def test_columns_of_a_converted_dataset_and_of_records(converted):
    dataset = converted("img")
    for split in ("train", "validation"):
        records = read_sample_index(dataset / f"samples-{split}.index.tsv")
        columns = read_sample_columns(str(dataset / f"samples-{split}.index.tsv"))
        assert check_columns_match(columns, records) is None
        assert check_columns_match(columns_from_records(records), records) is None
        assert columns.record(0) == records[0]  # the line's record, members and all
        assert columns.record(0).members.endswith(f";jpg:{records[0].payload_offset - 512}")


def test_crc32c_checksums_are_kept():
    text = encode_sample_index(_records(50)).decode()
    lines = text.splitlines()
    crcs = [random.Random(n).getrandbits(32) for n in range(50)]
    rows = [line.split("\t") for line in lines[1:]]
    for row, crc in zip(rows, crcs):
        row[7] = f"{crc:08x}"
    columns = parse_sample_columns([lines[0].encode()] + ["\t".join(row).encode() for row in rows])
    assert columns.has_checksums and columns.checksums.dtype == np.uint32
    assert columns.checksums.tolist() == crcs


@pytest.mark.parametrize("line, problem", [("a\tb\t1", "line 2 has 3 fields"),
                                           ("k\ts.tar\tx\t0\t1\t0\t1\tab\t", "line 2 has a non-integer")])
def test_bad_lines_are_named(line, problem):
    header = encode_sample_index([]).splitlines()[0]
    with pytest.raises(DatasetError, match=problem):
        parse_sample_columns([header, line.encode()], "x.index.tsv")


def _private_bytes(pid) -> int:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if value.strip().endswith("kB"):
                fields[name] = int(value.split()[0]) * 1024
    return fields["Private_Clean"] + fields["Private_Dirty"]


def _epoch_worker_private(dataset, instance):
    """Private memory (bytes) of the one DataLoader worker after two validation epochs (the first
    epoch's plan is made before the fork; the (persistent) worker makes the second's itself)."""
    from imagenet_shards.loader import ValidationCrop, get_data

    loader = get_data(str(dataset), "validation", batch_size=4, workers=1, instance=instance,
                      transform=ValidationCrop(image_size=32), with_keys=True)
    for epoch in range(2):
        keys = [key for batch in loader for key in batch.keys]
    workers = loader._loader._iterator._workers
    assert len(workers) == 1
    private = _private_bytes(workers[0].pid)
    loader._loader._iterator._shutdown_workers()
    return keys, private


def test_worker_memory_does_not_grow_with_the_index(converted, tmp_path):
    """The same 12 samples read by one worker, from an index of 12 rows and from one of 12 x 40,000
    rows (this instance's 12 first, the rest dealt to the 39,999 other instances): the worker's
    private memory must not hold the large index (its columns are ~30 MB; forked tuples ~80 MB)."""
    small = converted("img")
    large = tmp_path / "large"
    shutil.copytree(small, large)
    instances = 40_000
    lines = (small / "samples-validation.index.tsv").read_bytes().splitlines()
    real = len(lines) - 1
    extra = []
    for number in range(real * (instances - 1)):
        offset = (number % 1000) * 3072
        extra.append(f"fake/n{number:09d}\tvalidation-{number // 1000 + 100:06d}.tar\t{number % 1000}\t{offset}\t"
                     f"3072\t{offset + 1536}\t1000\t{number:064x}\tcls:{offset};json:{offset + 512};jpg:{offset + 1024}"
                     f"\t{'0.0625,0.125,0.75,0.9375' if number % 5 < 2 else ''}")  # a box on 40%, as in ImageNet
    index_text = b"\n".join(lines + [line.encode() for line in extra]) + b"\n"
    (large / "samples-validation.index.tsv").write_bytes(index_text)
    metadata = json.loads((large / "metadata.json").read_text())  # the loader holds the index against it
    metadata["splits"]["validation"]["index"].update(bytes=len(index_text), sha256=hashlib.sha256(index_text).hexdigest())
    fake_shards = metadata["splits"]["validation"]["shards"]
    for shard in range(len(extra) // 1000 + 1):
        fake_shards.append({"name": f"validation-{shard + 100:06d}.tar", "samples": min(1000, len(extra) - shard * 1000),
                            "bytes": 0, "sha256": "0" * 64})
    write_metadata(large, metadata)

    small_keys, small_private = _epoch_worker_private(small, (0, 1))
    large_keys, large_private = _epoch_worker_private(large, (0, instances))
    assert len(small_keys) == real and sorted(large_keys) == sorted(small_keys)
    index_bytes = read_sample_columns(str(large / "samples-validation.index.tsv")).nbytes
    assert index_bytes > 25 * 2**20
    grown = large_private - small_private
    assert grown <= 10 * 2**20, f"the worker's private memory grew by {grown / 2**20:.1f} MB with the index"


def test_keys_found_by_hash_table_and_duplicates_named_in_order():
    from imagenet_shards.index import KeyTable

    records = _records(200)
    records = records[:150] + [records[7]._replace(shard="train-000099.tar"), records[3], records[7]] + records[150:]
    columns = columns_from_records(records, checksums=True)
    assert columns.duplicate_keys() == {records[7].key: 3, records[3].key: 2}  # first appearance order
    table = KeyTable(columns)
    assert table.rows_of_keys([records[0].key, "absent", records[7].key, records[3].key]).tolist() == [0, -1, 152, 151]
    other = columns_from_records(records[40:60] + [records[0]._replace(key="absent too")])
    assert table.rows_of_columns(other).tolist() == list(range(40, 60)) + [-1]
    assert columns_from_records(records[:150]).duplicate_keys() == {}


def test_shard_groups_build_one_shards_records_when_asked():
    from imagenet_shards.index import ShardGroups

    records = _records(500)
    columns = read_sample_columns_of(records)
    by_offset, in_index_order = ShardGroups(columns), ShardGroups(columns, by_offset=False)
    for shard in sorted({r.shard for r in records}):
        mine = [r for r in records if r.shard == shard]
        assert in_index_order[shard] == mine
        assert by_offset[shard] == sorted(mine, key=lambda r: r.record_offset)
        assert by_offset.count(shard) == len(mine)
    assert by_offset["train-000099.tar"] == [] and "train-000099.tar" not in by_offset
    assert len(by_offset) == 7 and set(by_offset) == {r.shard for r in records}


def read_sample_columns_of(records):
    return parse_sample_columns(encode_sample_index(records).splitlines())


def test_the_index_is_written_as_a_stream_with_the_same_bytes(tmp_path):
    from imagenet_shards.index import INDEX_CHUNK_LINES

    records = _records(INDEX_CHUNK_LINES * 2 + 5)
    info = write_sample_index(tmp_path / "a.index.tsv", (r for r in records))  # a generator: consumed once
    data = (tmp_path / "a.index.tsv").read_bytes()
    assert data == encode_sample_index(records) and info["bytes"] == len(data)
    assert read_sample_index(tmp_path / "a.index.tsv") == records
    mixed = records[:INDEX_CHUNK_LINES + 3] + [records[0]._replace(bbox="")]
    with pytest.raises(ValueError, match="mix"):
        write_sample_index(tmp_path / "b.index.tsv", iter(mixed))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.index.tsv"]  # nothing half-written is left
