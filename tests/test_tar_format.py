"""The tar shard writer's bytes, against Python's tarfile writing the same members."""

import io
import tarfile

import pytest

from imagenet_shards.formats.tar import TarShardWriter, iter_tar_members

SAMPLES = [
    ("n01_0001", [("cls", b"0"), ("json", b'{"class":"n01"}'), ("jpg", bytes(range(256)) * 40)]),  # payload > 4 KB
    ("n01_0002", [("cls", b"17"), ("json", b"{}"), ("jpg", b"\xff\xd8" + b"x" * 4094)]),  # payload of exactly 4 KB
    ("n02_0001", [("cls", b"999"), ("json", b"{}" * 300), ("npy", b"\x93NUMPY" + bytes(150_522))]),
    ("n02_0002", [("cls", b"3"), ("json", b""), ("jpg", b"")]),  # empty members
    ("n03_" + "long" * 30, [("cls", b"1"), ("jpg", b"y" * 600)]),  # name over 100 bytes: a GNU long-name header
]


def tarfile_bytes(samples) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for key, members in samples:
            for ext, data in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = \
                    len(data), 0, 0o644, 0, 0, "", ""
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("count", [1, 2, len(SAMPLES)])
def test_shard_bytes_equal_tarfiles(tmp_path, count):
    path = tmp_path / "train-000000.tar"
    with TarShardWriter(path) as writer:
        for key, members in SAMPLES[:count]:
            writer.add_members(key, members)
    assert path.read_bytes() == tarfile_bytes(SAMPLES[:count])
    assert writer.bytes_written == path.stat().st_size


def test_reported_offsets_point_at_each_member(tmp_path):
    path = tmp_path / "train-000000.tar"
    with TarShardWriter(path) as writer:
        written = [writer.add_members(key, members) for key, members in SAMPLES]
    data = path.read_bytes()
    found = {m.name: m for m in iter_tar_members(path)}
    for (key, members), sample in zip(SAMPLES, written):
        assert sample.record_offset == sample.members[members[0][0]].header_offset
        for ext, payload in members:
            member = sample.members[ext]
            # header_offset is where the member's headers start: for a long name, its GNU long-name
            # block, which the reader passes over to the member's own header.
            assert found[f"{key}.{ext}"].data_offset == member.data_offset
            assert member.header_offset <= found[f"{key}.{ext}"].header_offset < member.data_offset
            assert data[member.data_offset:member.data_offset + member.size] == payload
    # Each sample's byte range runs from its first header to the end of its last member's padding.
    for sample, following in zip(written, written[1:]):
        assert sample.record_offset + sample.record_size == following.record_offset
    last_member = written[-1].members[SAMPLES[-1][1][-1][0]]
    assert written[-1].record_offset + written[-1].record_size == last_member.data_offset + -(-last_member.size // 512) * 512
