"""datasets/formats/mapped_shards.py: a process's maps of local shards are reused while the file is
the same file, and what a reader sees is always the file as it is now."""

import os

from datasets.formats.mapped_shards import MappedShards


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
