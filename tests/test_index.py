"""The per-sample index: its TSV round trip, and the messages for a damaged one."""

import pytest

from imagenet_shards.errors import DatasetError
from imagenet_shards.index import SampleRecord, encode_sample_index, parse_sample_columns


def parse_sample_index(data: bytes, source="<index>"):
    """Every record of an index's bytes, through the one reader (imagenet_shards.index.columns)."""
    return list(parse_sample_columns(data.splitlines(), source).iter_records())


RECORDS = [
    SampleRecord("n01_0001", "train-000000.tar", 0, 0, 4096, 2048, 1500, 0xDEADBEEF, "cls:0;json:512;jpg:1536"),
    SampleRecord("n01_0002", "train-000000.tar", 3, 4096, 8192, 6144, 5000, 0, "cls:4096;json:4608;jpg:5632"),
    SampleRecord("n02_0001", "train-000001.tar", 999, 0, 1024, 512, 10, 7, ""),
]


def test_round_trip_gives_the_same_records():
    assert parse_sample_index(encode_sample_index(RECORDS)) == RECORDS


def test_an_empty_index_has_no_records():
    assert parse_sample_index(encode_sample_index([])) == []


def test_an_empty_checksum_reads_as_none():
    lines = encode_sample_index(RECORDS).decode().splitlines()
    fields = lines[2].split("\t")
    fields[7] = ""
    parsed = parse_sample_index(("\n".join(lines[:2] + ["\t".join(fields)] + lines[3:]) + "\n").encode())
    assert [r.payload_crc32c for r in parsed] == [0xDEADBEEF, None, 7]


def test_members_and_boxes_are_written_back_as_they_were():
    boxed = [r._replace(bbox=box) for r, box in zip(RECORDS, ["0.1,0.2,0.30000000000000004,1.0", "", "0.0,0.0,1.0,1.0"])]
    data = encode_sample_index(boxed)
    assert encode_sample_index(parse_sample_index(data)) == data


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


def test_crc32c_is_written_as_eight_hex_digits():
    lines = encode_sample_index(RECORDS).decode().splitlines()
    assert lines[0].split("\t")[7] == "payload_crc32c"
    assert [line.split("\t")[7] for line in lines[1:]] == ["deadbeef", "00000000", "00000007"]


def test_an_index_of_the_earlier_version_is_refused_naming_the_command_that_re_creates_it():
    lines = encode_sample_index(RECORDS).decode().splitlines()
    lines[0] = lines[0].replace("payload_crc32c", "payload_sha256")
    with pytest.raises(DatasetError) as raised:
        parse_sample_index(("\n".join(lines) + "\n").encode(), "samples-train.index.tsv")
    assert str(raised.value).startswith("samples-train.index.tsv: a sample index of the earlier version")
    assert "tar_tools.py reindex" in str(raised.value)


def test_payload_problem_checks_the_records_crc32c():
    import crc32c

    from imagenet_shards.index import payload_problem

    payload = b"some payload bytes"
    record = RECORDS[0]._replace(payload_crc32c=crc32c.crc32c(payload))
    assert payload_problem(record, payload) is None
    assert "CRC32C" in payload_problem(record, payload[:-1] + b"t")
    assert payload_problem(RECORDS[0]._replace(payload_crc32c=None), b"anything") is None
