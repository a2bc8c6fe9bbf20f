"""Small files the loader and the validator read beside the shards are named when damaged, never trusted
blindly and never a traceback: a `.tfindex` with bytes that are not text, and a sample index
(`samples-<split>.index.tsv`) that disagrees with the sealed metadata.json (issue 35)."""

import hashlib
import shutil

import pytest

from conftest import run_script


@pytest.fixture
def copy_of(converted, tmp_path):
    def copy(fmt):
        target = tmp_path / f"{fmt}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(converted(fmt), target)
        return target
    return copy


def test_a_tfindex_with_non_text_bytes_is_named_exit_1(copy_of):
    dataset = copy_of("tfrecord")
    index = dataset / "train-00001-of-00005.tfindex"
    data = bytearray(index.read_bytes())
    data[3:5] = b"\xff\xfe"
    index.write_bytes(bytes(data))
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "train-00001-of-00005.tfindex" in result.stdout and "not text" in result.stdout, result.stdout


def test_reading_a_non_text_tfindex_raises_the_format_error_naming_it(copy_of):
    from imagenet_shards.formats.tfrecord import TFRecordFormatError, read_tfrecord_index

    index = copy_of("tfrecord") / "train-00000-of-00005.tfindex"
    index.write_bytes(b"0 12\n\x80\x81 9\n")
    with pytest.raises(TFRecordFormatError, match="train-00000-of-00005.tfindex"):
        read_tfrecord_index(index)


def _edit_index(dataset, split, edit, reseal=False):
    """Edit the split's index lines; with `reseal`, metadata.json records the edited index's size and
    sha256 (a buggy writer, a careful editor), so only the counts and keys can tell."""
    from imagenet_shards.index import read_metadata, write_metadata

    path = dataset / f"samples-{split}.index.tsv"
    lines = path.read_bytes().split(b"\n")
    edit(lines)
    data = b"\n".join(lines)
    path.write_bytes(data)
    if reseal:
        metadata = read_metadata(dataset)
        metadata["splits"][split]["index"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        write_metadata(dataset, metadata)
    return path


def _first_batch_keys(dataset, split="train", **options):
    from imagenet_shards.loader import Order, get_data

    loader = get_data(str(dataset), split, batch_size=64, workers=0, with_keys=True,
                      order=Order(shuffle=False, drop_last=False), **options)
    return [key for batch in loader for key in batch.keys]


@pytest.mark.parametrize("fmt", ["tensor", "img", "tfrecord", "lmdb"])
def test_the_loader_names_a_duplicated_index_line(copy_of, fmt):
    from imagenet_shards.loader.sources import SourceError

    dataset = copy_of(fmt)
    path = _edit_index(dataset, "train", lambda lines: lines.insert(1, lines[3]))
    with pytest.raises(SourceError) as caught:
        _first_batch_keys(dataset)
    message = str(caught.value)
    assert str(path) in message and "metadata.json" in message, message


def test_the_loader_names_a_dropped_index_line_and_a_key_listed_twice(copy_of):
    from imagenet_shards.loader.sources import SourceError

    dataset = copy_of("tensor")
    path = _edit_index(dataset, "validation", lambda lines: lines.pop(2), reseal=True)
    with pytest.raises(SourceError, match="samples-validation.index.tsv.*shard validation-000000.tar"):
        _first_batch_keys(dataset, "validation")

    dataset = copy_of("img")
    # the same count in every shard, one key twice: line 2's key written over line 3's
    def repeat_key(lines):
        fields = lines[2].split(b"\t")
        fields[0] = lines[1].split(b"\t")[0]
        lines[2] = b"\t".join(fields)
    path = _edit_index(dataset, "train", repeat_key, reseal=True)
    with pytest.raises(SourceError) as caught:
        _first_batch_keys(dataset)
    assert str(path) in str(caught.value) and "listed 2 times" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("fmt", ["img", "lmdb"])
def test_the_loader_names_an_index_whose_bytes_are_not_the_ones_metadata_records(copy_of, fmt):
    """A flipped label digit keeps every count and key (it delivered a wrong label with no word); a
    flipped key byte that is no longer UTF-8 (it broke the loader with a UnicodeDecodeError)."""
    from imagenet_shards.loader.sources import SourceError

    dataset = copy_of(fmt)
    def flip_label(lines):
        fields = lines[3].split(b"\t")
        fields[2] = str(int(fields[2]) ^ 1).encode()
        lines[3] = b"\t".join(fields)
    path = _edit_index(dataset, "validation", flip_label)
    with pytest.raises(SourceError, match="sha256 is not the one metadata.json records") as caught:
        _first_batch_keys(dataset, "validation")
    assert str(path) in str(caught.value)

    dataset = copy_of(fmt)
    path = _edit_index(dataset, "validation", lambda lines: lines.__setitem__(2, b"\xd6" + lines[2][1:]))
    with pytest.raises(SourceError) as caught:
        _first_batch_keys(dataset, "validation")
    assert str(path) in str(caught.value)


def test_an_intact_index_is_read_as_before(converted):
    keys = _first_batch_keys(converted("tensor"))
    assert len(keys) == len(set(keys)) == 36
