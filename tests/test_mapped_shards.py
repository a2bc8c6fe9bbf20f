"""imagenet_shards/formats/mapped_shards.py: a process's maps of local shards are reused while the file is
the same file, and what a reader sees is always the file as it is now."""

import mmap
import os

import pytest

from conftest import run_script

from imagenet_shards.formats.mapped_shards import MappedShards


def test_a_map_is_reused_until_the_file_changes(tmp_path):
    path = tmp_path / "a.tar"
    path.write_bytes(b"first" * 100)
    shards = MappedShards()
    size, view = shards.map(path)
    assert size == 500 and bytes(view[:5]) == b"first"
    assert shards.map(path)[1] is view  # the same map, no new one

    with open(path, "r+b") as handle:  # written in place: the maps show it as it is
        handle.write(b"FIRST")
    assert bytes(shards.map(path)[1][:5]) == b"FIRST" and bytes(view[:5]) == b"FIRST"

    replacement = tmp_path / "a.tar.new"
    replacement.write_bytes(b"other" * 100)
    os.replace(replacement, path)  # another file under the name (another inode): mapped anew
    size, again = shards.map(path)
    assert again is not view and bytes(again[:5]) == b"other"

    os.truncate(path, 200)  # shorter: mapped anew, with its new size
    size, short = shards.map(path)
    assert size == 200 and len(short) == 200


def test_maps_beyond_the_limits_are_let_go_least_recently_used_first(tmp_path):
    paths = []
    for name in "abcd":
        paths.append(tmp_path / f"{name}.tar")
        paths[-1].write_bytes(name.encode() * 1000)
    shards = MappedShards(limit=10_000, count=2)
    for path in paths[:2]:
        shards.map(path)
    shards.map(paths[0])  # a is now the most recently used
    shards.map(paths[2])
    assert list(shards.maps) == [str(paths[0]), str(paths[2])]
    small = MappedShards(limit=2_500, count=10)
    for path in paths:
        shards.map(path)
        small.map(path)
    assert list(small.maps) == [str(paths[2]), str(paths[3])] and small.mapped_bytes == 2_000
    assert len(shards.maps) == 2


def test_an_empty_file_and_a_missing_one(tmp_path):
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    shards = MappedShards()
    size, view = shards.map(empty)
    assert size == 0 and len(view) == 0 and not shards.maps
    empty.unlink()
    try:
        shards.map(empty)
    except FileNotFoundError as error:
        assert str(empty) in str(error)
    else:
        raise AssertionError("a missing file was mapped")


def test_pages_of_a_map_found_again_stay_and_others_are_released(tmp_path):
    """A map's pages go when its payloads are handed back, until the map is found again while kept
    (a split re-read while mapped): from then on they stay."""
    path = tmp_path / "a.tar"
    path.write_bytes(os.urandom(64 * mmap.PAGESIZE))
    shards = MappedShards()
    size, view = shards.map(path)
    data = path.read_bytes()
    payloads = shards.lend(view, 100, 30 * mmap.PAGESIZE), shards.lend(view, 31 * mmap.PAGESIZE + 900, size)
    assert [bytes(p) for p in payloads] == [data[100:30 * mmap.PAGESIZE], data[31 * mmap.PAGESIZE + 900:]]
    assert _resident_pages(view) == 64
    shards.release(payloads[1])  # handed back first (a shuffle buffer's order): only its own pages go
    assert _resident_pages(view) == 32  # pages 0-31: the first payload is still out
    shards.release(payloads[0])  # none out now: everything below the furthest byte lent goes
    assert _resident_pages(view) == 0
    assert bytes(payloads[0]) == data[100:30 * mmap.PAGESIZE]  # faulted in again: the same bytes
    shards.map(path)  # found again while kept: it pays
    payload = shards.lend(view, 0, size)
    bytes(payload)
    shards.release(payload)
    assert _resident_pages(view) == 64
    shards.release(view[0:size])  # not lent: left alone
    assert _resident_pages(view) == 64
    shards.release(b"not a map")  # anything else is left alone


def test_payloads_smaller_than_a_page_handed_back_in_shuffled_order_keep_the_map_bounded(tmp_path):
    """ImageNet-scale datasets of small images: no payload fills a page alone, so only the map's
    low-water mark (its oldest payload still out) lets pages go. Read in order through a shuffle
    buffer of 16, the map keeps about what the buffer spans, not the whole file (a worker grew by
    ~190 MB over 2,000 batches at imagenet_scale.py's full count before)."""
    import random

    path = tmp_path / "small.tar"
    path.write_bytes(os.urandom(256 * mmap.PAGESIZE))
    data = path.read_bytes()
    shards = MappedShards()
    size, view = shards.map(path)
    shuffle, buffer, most = random.Random(0), [], 0
    for start in range(0, size - 1500, 1500):  # 1,500-byte payloads with 500-byte "headers" between
        buffer.append((start + 500, shards.lend(view, start + 500, start + 1500)))
        if len(buffer) > 16:
            offset, payload = buffer.pop(shuffle.randrange(len(buffer)))
            assert bytes(payload) == data[offset:offset + 1000]
            shards.release(payload)
            most = max(most, _resident_pages(view))
    assert most < 256 // 4, most  # the buffer's span and a page either side, never the file
    for _, payload in buffer:
        shards.release(payload)
    assert _resident_pages(view) <= 1  # the page the last payload ends in


def _resident_pages(view) -> int:
    """Pages of `view`'s map in this process's RSS (its Rss line in /proc/self/smaps)."""
    import numpy as np

    address = np.frombuffer(view, np.uint8).ctypes.data
    inside = False
    with open("/proc/self/smaps") as handle:
        for line in handle:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                low, high = (int(part, 16) for part in first.split("-"))
                inside = low <= address < high
            elif inside and first == "Rss:":
                return int(line.split()[1]) * 1024 // mmap.PAGESIZE
    raise AssertionError("the map is not in /proc/self/smaps")


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    """A tensor dataset of 96 train samples (~200 KB each) in 12 shards: ~19 MB read an epoch."""
    from imagenet_shards.sample import build_sample_dataset

    source = tmp_path_factory.mktemp("many-shards-source")
    build_sample_dataset(source, seed=0, classes=4, train_per_class=24, val_per_class=1)
    target = tmp_path_factory.mktemp("many-shards")
    result = run_script("create_webdataset.py", "--source", source, "--target", target, "--format", "tensor",
                        "--samples-per-shard", 8, "--seed", 0)
    assert result.returncode == 0, result.stdout + result.stderr
    return target


def _shard_map_rss(pid) -> int:
    """Bytes of the process's RSS in maps of shard files (*.tar), from /proc/<pid>/smaps."""
    total, shard = 0, False
    with open(f"/proc/{pid}/smaps") as handle:
        for line in handle:
            fields = line.split()
            if "-" in fields[0] and not fields[0].endswith(":"):
                shard = len(fields) >= 6 and fields[-1].endswith(".tar")
            elif shard and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def test_a_worker_keeps_no_pages_of_a_train_split_read_once(many_shards):
    """One worker reads 12 shards (shuffled through an 8-sample buffer); its RSS in shard maps, sampled
    after each of the main process's first 6 batches (the worker is up to 5 ahead, still in epoch 1:
    the next epoch finds its maps kept, so they pay and keep their pages). Before, every page read
    stayed (~17 MB of the 18.4 by then, up to 512 MiB); now payloads' pages go as they are decoded."""
    from imagenet_shards.loader import Order, TrainCrop, get_data

    shard_bytes = sum(p.stat().st_size for p in many_shards.glob("train-*.tar"))
    loader = get_data(str(many_shards), "train", batch_size=8, workers=1, transform=TrainCrop(image_size=32),
                      order=Order(shuffle_buffer=8))
    try:
        batches, resident = iter(loader), []
        for _ in range(6):
            next(batches)
            resident.append(_shard_map_rss(loader._loader._iterator._workers[0].pid))
        assert max(resident) <= shard_bytes // 4, [f"{r / 2**20:.1f} MB" for r in resident]
    finally:
        loader._loader._iterator._shutdown_workers()
