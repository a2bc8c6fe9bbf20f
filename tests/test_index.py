"""The per-sample index: its TSV round trip, and the messages for a damaged one."""

import pytest

from datasets.index import DatasetError, SampleRecord, encode_sample_index, parse_sample_index

RECORDS = [
    SampleRecord("n01_0001", "train-000000.tar", 0, 0, 4096, 2048, 1500, 0xDEADBEEF, "cls:0;json:512;jpg:1536"),
    SampleRecord("n01_0002", "train-000000.tar", 3, 4096, 8192, 6144, 5000, 0, "cls:4096;json:4608;jpg:5632"),
    SampleRecord("n02_0001", "train-000001.tar", 999, 0, 1024, 512, 10, 7, ""),
]


def test_round_trip_gives_the_same_records():
    assert parse_sample_index(encode_sample_index(RECORDS)) == RECORDS


def test_an_empty_index_has_no_records():
    assert parse_sample_index(encode_sample_index([])) == []


def test_without_hashes_every_other_field_is_kept():
    parsed = parse_sample_index(encode_sample_index(RECORDS), hashes=False)
    assert [r.payload_crc32c for r in parsed] == [None, None, None]
    assert [r._replace(payload_crc32c=None) for r in RECORDS] == parsed


def test_records_of_one_shard_share_its_name():
    parsed = parse_sample_index(encode_sample_index(RECORDS))
    assert parsed[0].shard is parsed[1].shard  # one string per shard, not one per line


@pytest.mark.parametrize("damage, message", [
    (lambda lines: lines[:2] + [lines[2] + "\textra"] + lines[3:], "line 3 has 10 fields, expected 9"),
    (lambda lines: lines[:2] + [lines[2].replace("\t4096\t", "\tfour\t", 1)] + lines[3:],
     "line 3 has a non-integer offset, size, label or CRC32C"),
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


LEGACY = [r._replace(payload_crc32c=None, payload_sha256=c * 64) for r, c in zip(RECORDS, "abc")]


def test_crc32c_is_written_as_eight_hex_digits():
    lines = encode_sample_index(RECORDS).decode().splitlines()
    assert lines[0].split("\t")[7] == "payload_crc32c"
    assert [line.split("\t")[7] for line in lines[1:]] == ["deadbeef", "00000000", "00000007"]


def test_an_index_of_the_earlier_version_reads_with_its_payload_sha256():
    data = encode_sample_index(LEGACY)
    assert data.split(b"\n")[0].split(b"\t")[7] == b"payload_sha256"
    assert parse_sample_index(data) == LEGACY
    assert all(r.payload_crc32c is None for r in parse_sample_index(data))


def test_one_index_never_mixes_crc32c_and_sha256_records():
    with pytest.raises(ValueError, match="mix"):
        encode_sample_index(RECORDS[:1] + LEGACY[1:])


def test_payload_problem_checks_whichever_checksum_the_record_has():
    import crc32c
    import hashlib

    from datasets.index import payload_problem

    payload = b"some payload bytes"
    record = RECORDS[0]._replace(payload_crc32c=crc32c.crc32c(payload))
    assert payload_problem(record, payload) is None
    assert "CRC32C" in payload_problem(record, payload[:-1] + b"t")
    legacy = LEGACY[0]._replace(payload_sha256=hashlib.sha256(payload).hexdigest())
    assert payload_problem(legacy, payload) is None
    assert "sha256" in payload_problem(legacy, payload[:-1] + b"t")
    assert payload_problem(RECORDS[0]._replace(payload_crc32c=None), b"anything") is None
