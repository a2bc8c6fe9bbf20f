"""tar_tools.py: show, tsv, cat, split, sort, shuffle; their output validates and loads."""

import contextlib
import io
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO, SAMPLE_SIZE
from imagenet_shards.formats import format_names
from imagenet_shards.index import read_metadata, sample_index_name
from imagenet_shards.index import read_sample_index

TAR_FORMATS = ["img", "tensor"]
TRAIN = SAMPLE_SIZE["classes"] * SAMPLE_SIZE["train_per_class"]


def tools(*args, stdin=None):
    command = [sys.executable, str(REPO / "tar_tools.py"), *map(str, args)]
    return subprocess.run(command, capture_output=True, input=stdin, cwd=REPO)


def ok(result):
    assert result.returncode == 0, result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
    return result


def validates(folder):
    """validate_dataset's main in this process (its command line is tested in test_validate.py; a subprocess
    here would only add its imports): exit 0 and "Dataset OK."."""
    from imagenet_shards.cli.validate_dataset import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main([str(folder), "--no-progress"])
    assert code == 0 and "Dataset OK." in printed.getvalue(), printed.getvalue()


def index_of(folder, split="train"):
    return read_sample_index(folder / sample_index_name(split))


def payloads(folder, split="train") -> dict:
    """{key: (label, payload bytes)} of a dataset, read through its index."""
    out = {}
    for record in index_of(folder, split):
        with open(folder / record.shard, "rb") as handle:
            handle.seek(record.payload_offset)
            out[record.key] = (record.label, handle.read(record.payload_size))
    return out


def stock_tar(path, samples=7):
    """A WebDataset tar as `tar` or webdataset's TarWriter makes it (no index, no metadata)."""
    from PIL import Image

    with tarfile.open(path, "w") as archive:
        for n in range(samples):
            image = Image.new("RGB", (40 + n, 30), (n * 30 % 256, 100, 150))
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG")
            for ext, data in (("jpg", buffer.getvalue()), ("cls", str(n % 3).encode())):
                info = tarfile.TarInfo(f"shots/sample{n:04d}.{ext}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path


# ---------------------------------------------------------------- show and tsv: every format


@pytest.mark.parametrize("fmt", format_names())
def test_show_lists_members_and_sizes_on_every_format(converted, fmt):
    dataset = converted(fmt)
    shard = read_metadata(dataset)["splits"]["train"]["shards"][0]["name"]
    records = [r for r in index_of(dataset) if r.shard == shard]
    records.sort(key=lambda r: r.record_offset)
    out = ok(tools("show", dataset / shard, "--start", 1, "--count", 2)).stdout.decode().splitlines()
    assert len(out) == 2
    for line, record in zip(out, records[1:3]):
        assert record.key in line and f":{record.payload_size:,}" in line


@pytest.mark.parametrize("fmt", format_names())
def test_tsv_tabulates_every_sample_on_every_format(converted, fmt):
    dataset = converted(fmt)
    shards = [s["name"] for s in read_metadata(dataset)["splits"]["validation"]["shards"]]
    out = ok(tools("tsv", *[dataset / s for s in shards], "--fields", "__key__,cls,payload.size,json.class"))
    lines = out.stdout.decode().splitlines()
    assert lines[0] == "__key__\tcls\tpayload.size\tjson.class"
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in lines[1:]}
    classes = read_metadata(dataset)["classes"]
    assert len(rows) == len(index_of(dataset, "validation"))
    for record in index_of(dataset, "validation"):
        label, size, class_name = rows[record.key]
        assert (int(label), int(size)) == (record.label, record.payload_size)
        assert class_name == (classes[record.label] if fmt != "tfrecord" else "")  # TF-slim records: no json


def test_show_and_tsv_read_a_tar_on_stdin(converted):
    shard = converted("img") / "train-000000.tar"
    shown = ok(tools("show", "-", stdin=shard.read_bytes())).stdout.decode().splitlines()
    assert len(shown) == 8
    table = ok(tools("tsv", "-", stdin=shard.read_bytes())).stdout.decode().splitlines()
    assert len(table) == 9


# ---------------------------------------------------------------- the writing commands


@pytest.mark.parametrize("fmt", TAR_FORMATS)
@pytest.mark.parametrize("command, extra", [("cat", []), ("split", ["--samples-per-shard", 5]),
                                            ("sort", ["--max-shard-bytes", 300_000]),
                                            ("shuffle", ["--seed", 7, "--samples-per-shard", 11])])
def test_writing_commands_keep_every_sample_byte_for_byte_and_validate(converted, tmp_path, fmt, command, extra):
    dataset = converted(fmt)
    out = tmp_path / "out"
    ok(tools(command, dataset, "--out", out, *extra))
    validates(out)
    before, after = payloads(dataset), payloads(out)
    assert after == before  # same keys, labels and payload bytes
    keys = [r.key for r in index_of(out)]
    source_order = [r.key for r in index_of(dataset)]
    metadata = read_metadata(out)
    assert metadata["format"] == fmt and metadata["classes"] == read_metadata(dataset)["classes"]
    assert metadata["derived"]["train"]["tool"] == f"tar_tools {command}"
    shards = metadata["splits"]["train"]["shards"]
    if command == "cat":
        assert keys == source_order and len(shards) == 1
    if command == "split":
        assert keys == source_order and [s["samples"] for s in shards] == [5] * 7 + [1]
    if command == "sort":
        assert keys == sorted(keys) and all(s["bytes"] <= 300_000 for s in shards) and len(shards) > 1
    if command == "shuffle":
        assert keys != source_order and [s["samples"] for s in shards] == [11, 11, 11, 3]


def test_shuffle_is_reproducible_and_the_seed_matters(converted, tmp_path):
    dataset = converted("img")
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        ok(tools("shuffle", dataset, "--seed", seed, "--out", tmp_path / name))
    order = {name: [r.key for r in index_of(tmp_path / name)] for name in "abc"}
    assert order["a"] == order["b"] != order["c"]
    assert (tmp_path / "a" / "train-000000.tar").read_bytes() == (tmp_path / "b" / "train-000000.tar").read_bytes()


def test_output_loads_with_get_data(converted, tmp_path):
    from imagenet_shards.loader import get_data

    ok(tools("split", converted("img"), "--split", "validation", "--out", tmp_path / "out", "--samples-per-shard", 5))
    loader = get_data(str(tmp_path / "out"), "validation", batch_size=4, workers=0, with_keys=True)
    keys, labels = [], []
    for _, batch_labels, batch_keys in loader:
        keys += batch_keys
        labels += batch_labels.tolist()
    expected = {r.key: r.label for r in index_of(converted("img"), "validation")}
    assert dict(zip(keys, labels)) == expected and len(keys) == len(expected)


def test_stock_webdataset_tars_are_scanned_and_indexed(tmp_path):
    first = stock_tar(tmp_path / "a.tar", 7)
    out = tmp_path / "out"
    ok(tools("split", first, "--out", out, "--samples-per-shard", 3))
    validates(out)
    records = index_of(out)
    assert [r.key for r in records] == [f"shots/sample{n:04d}" for n in range(7)]
    assert [r.label for r in records] == [n % 3 for n in range(7)]
    metadata = read_metadata(out)
    assert metadata["format"] == "img" and metadata["classes"] == ["0", "1", "2"]
    assert [s["samples"] for s in metadata["splits"]["train"]["shards"]] == [3, 3, 1]


def test_stdin_to_stdout_streams_one_tar(converted, tmp_path):
    shard = converted("img") / "train-000001.tar"
    result = ok(tools("cat", "-", "--out", "-", stdin=shard.read_bytes()))
    assert result.stdout == shard.read_bytes()  # the same samples, the same trailer: the same bytes
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as archive:
        assert len(archive.getnames()) == 24


def test_a_second_split_goes_beside_the_first(converted, tmp_path):
    out = tmp_path / "out"
    ok(tools("cat", converted("img"), "--out", out, "--split", "train"))
    ok(tools("cat", converted("img"), "--out", out, "--split", "validation"))
    validates(out)
    assert set(read_metadata(out)["splits"]) == {"train", "validation"}
    refused = tools("cat", converted("img"), "--out", out, "--split", "train")
    assert refused.returncode == 2 and b"already holds split 'train'" in refused.stderr


# ---------------------------------------------------------------- bad input: one line, exit 1 or 2


def one_line(result, code, *words):
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], result.stderr
    for word in words:
        assert str(word) in lines[0], lines[0]


def test_bad_input(converted, tmp_path):
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(b"not a tar at all" * 100)
    one_line(tools("show", garbage), 1, garbage)
    one_line(tools("split", garbage, "--out", tmp_path / "o", "--samples-per-shard", 2), 1, garbage)
    one_line(tools("show", tmp_path / "missing.tar"), 2, "missing.tar", "no such file")
    one_line(tools("cat", converted("tfrecord"), "--out", tmp_path / "t"), 2, "tfrecord")
    assert tools("split", converted("img"), "--out", tmp_path / "s").returncode == 2  # no limit given
    assert tools("shuffle", converted("img"), "--out", tmp_path / "s").returncode == 2  # no seed


def test_a_damaged_sample_is_named_and_nothing_is_published(converted, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(converted("img"), copy)
    record = index_of(copy)[3]
    with open(copy / record.shard, "r+b") as handle:
        handle.seek(record.payload_offset + 100)
        byte = handle.read(1)
        handle.seek(record.payload_offset + 100)
        handle.write(bytes([byte[0] ^ 0xFF]))
    out = tmp_path / "out"
    one_line(tools("cat", copy, "--out", out), 1, record.shard, record.key, "CRC32C")
    assert not (out / "metadata.json").exists()
