"""Crash-safe writes: a file appears complete under its final name, or not at all."""

import errno
import hashlib
import subprocess

import pytest

from imagenet_shards.fileio import HashingAtomicWriter, atomic_write_bytes, hash_file, sha256_file


def test_hashing_writer_describes_what_it_published(tmp_path):
    path = tmp_path / "shard.bin"
    with HashingAtomicWriter(path) as writer:
        writer.write(b"a" * 1000)
        writer.write(memoryview(b"b" * 10))
        assert not path.exists()  # still under its partial name
    data = path.read_bytes()
    assert writer.sha256 == hashlib.sha256(data).hexdigest() == sha256_file(path)[0]
    assert writer.bytes_written == len(data) == 1010
    assert [p.name for p in tmp_path.iterdir()] == ["shard.bin"]


def test_an_error_while_writing_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with HashingAtomicWriter(tmp_path / "shard.bin") as writer:
            writer.write(b"x" * 100)
            raise RuntimeError("worker died")
    assert list(tmp_path.iterdir()) == []


def test_hash_file_gives_several_digests_in_one_read(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 5000)
    (md5, sha), size = hash_file(path, ("md5", "sha256"), chunk_size=4096)
    assert size == 1280000
    assert md5 == hashlib.md5(path.read_bytes()).hexdigest()
    assert sha == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tiny_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.parametrize("how", ["atomic_write_bytes", "HashingAtomicWriter"])
def test_a_full_disk_leaves_no_partial_file(tiny_disk, how):
    target = tiny_disk / "big.bin"
    with pytest.raises(OSError) as raised:
        if how == "atomic_write_bytes":
            atomic_write_bytes(target, bytes(1 << 20))
        else:
            # Small writes stay in the file's buffer, so close() retries the failed flush and
            # raises a second time: the partial file must be removed all the same.
            with HashingAtomicWriter(target) as writer:
                for _ in range(1000):
                    writer.write(bytes(1000))
    assert raised.value.errno == errno.ENOSPC
    assert list(tiny_disk.iterdir()) == []
