"""The per-sample index: its TSV round trip, and the messages for a damaged one."""

import pytest

from datasets.index import DatasetError, SampleRecord, encode_sample_index, parse_sample_index

RECORDS = [
    SampleRecord("n01_0001", "train-000000.tar", 0, 0, 4096, 2048, 1500, "a" * 64, "cls:0;json:512;jpg:1536"),
    SampleRecord("n01_0002", "train-000000.tar", 3, 4096, 8192, 6144, 5000, "b" * 64, "cls:4096;json:4608;jpg:5632"),
    SampleRecord("n02_0001", "train-000001.tar", 999, 0, 1024, 512, 10, "c" * 64, ""),
]


def test_round_trip_gives_the_same_records():
    assert parse_sample_index(encode_sample_index(RECORDS)) == RECORDS


def test_an_empty_index_has_no_records():
    assert parse_sample_index(encode_sample_index([])) == []


def test_without_hashes_every_other_field_is_kept():
    parsed = parse_sample_index(encode_sample_index(RECORDS), hashes=False)
    assert [r.payload_sha256 for r in parsed] == ["", "", ""]
    assert [r._replace(payload_sha256="") for r in RECORDS] == parsed


def test_records_of_one_shard_share_its_name():
    parsed = parse_sample_index(encode_sample_index(RECORDS))
    assert parsed[0].shard is parsed[1].shard  # one string per shard, not one per line


@pytest.mark.parametrize("damage, message", [
    (lambda lines: lines[:2] + [lines[2] + "\textra"] + lines[3:], "line 3 has 10 fields, expected 9"),
    (lambda lines: lines[:2] + [lines[2].replace("\t4096\t", "\tfour\t", 1)] + lines[3:],
     "line 3 has a non-integer offset, size or label"),
    (lambda lines: ["key\tshard"] + lines[1:], "not a sample index"),
])
def test_a_damaged_index_names_the_file_and_line(damage, message):
    lines = encode_sample_index(RECORDS).decode().splitlines()
    with pytest.raises(DatasetError, match=message) as raised:
        parse_sample_index(("\n".join(damage(lines)) + "\n").encode(), "samples-train.index.tsv")
    assert str(raised.value).startswith("samples-train.index.tsv: ")


def test_the_garbage_collector_is_left_as_it_was():
    import gc

    assert gc.isenabled()
    parse_sample_index(encode_sample_index(RECORDS))
    assert gc.isenabled()
    with pytest.raises(DatasetError):
        parse_sample_index(b"not an index\n")
    assert gc.isenabled()
    gc.disable()
    try:
        parse_sample_index(encode_sample_index(RECORDS))
        assert not gc.isenabled()
    finally:
        gc.enable()
