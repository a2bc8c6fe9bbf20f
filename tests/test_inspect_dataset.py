"""inspect_dataset.py: statistics, contact sheet, one sample's exact bytes, on every kind of dataset."""

import json
import shutil
from pathlib import Path

import crc32c
import pytest

from conftest import SAMPLE_SIZE, run_script
from imagenet_shards.formats import format_names
from imagenet_shards.index import read_metadata, sample_index_name
from imagenet_shards.index import read_sample_index
from test_plot_layout import text_outside_figure

TRAIN = SAMPLE_SIZE["classes"] * SAMPLE_SIZE["train_per_class"]
VALIDATION = SAMPLE_SIZE["classes"] * SAMPLE_SIZE["val_per_class"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def inspect(*args):
    return run_script("inspect_dataset.py", *args)


def inspect_json(*args) -> dict:
    result = inspect(*args, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def check_counts(report, train=TRAIN, validation=VALIDATION):
    splits = report["splits"]
    assert splits["train"]["samples"] == train and splits["validation"]["samples"] == validation
    assert splits["train"]["classes"] == SAMPLE_SIZE["classes"]
    assert splits["train"]["per_class"] == {"min": 9, "median": 9.0, "max": 9}
    assert splits["train"]["class_counts"] == [9] * SAMPLE_SIZE["classes"]
    assert splits["validation"]["per_class"] == {"min": 3, "median": 3.0, "max": 3}
    for entry in splits.values():
        assert entry["sample"]["sampled"] == entry["samples"] and not entry["sample"]["unreadable"]
        assert entry["sample"]["width"]["p0"] > 0 and entry["sample"]["height"]["p100"] >= entry["sample"]["height"]["p0"]


@pytest.mark.parametrize("fmt", format_names())
def test_statistics_of_every_format_come_from_its_index(converted, fmt):
    dataset = converted(fmt)
    report = inspect_json(dataset)
    check_counts(report)
    metadata = read_metadata(dataset)
    for split, entry in report["splits"].items():
        records = read_sample_index(dataset / sample_index_name(split))
        assert entry["format"] == fmt
        assert entry["shards"] == len(metadata["splits"][split]["shards"])
        assert entry["bytes"] == sum(s["bytes"] for s in metadata["splits"][split]["shards"])
        sizes = sorted(r.payload_size for r in records)
        assert entry["payload_bytes"]["p0"] == sizes[0] and entry["payload_bytes"]["p100"] == sizes[-1]
    if fmt == "tensor":  # the default steps: 256x256 train tensors
        assert report["splits"]["train"]["sample"]["width"]["p0"] == 256
        assert report["splits"]["train"]["steps"] == ["Resize(256)", "CenterCrop(256)"]


def test_text_report_names_the_figures(converted, sample_source):
    result = inspect(converted("img"), "--synsets", sample_source / "synsets.txt")
    assert result.returncode == 0, result.stderr
    for text in ("split", "samples", "train", "validation", "rarest classes", "payload bytes", "width", "quirks in"):
        assert text in result.stdout
    words = (sample_source / "synsets.txt").read_text().splitlines()[0].split(" ", 1)[1][:10]
    assert words in result.stdout


@pytest.mark.parametrize("fmt", format_names())
@pytest.mark.parametrize("as_trained", [False, True])
def test_contact_sheet_of_every_format(converted, sample_source, tmp_path, fmt, as_trained):
    out = tmp_path / "sheet.png"
    args = ["--png", out, "--count", 6, "--seed", 3, "--synsets", sample_source / "synsets.txt"]
    result = inspect(converted(fmt), *args, *(["--as-trained"] if as_trained else []))
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.read_bytes().startswith(PNG_MAGIC)
    from PIL import Image

    with Image.open(out) as image:
        assert image.width >= 800 and image.height >= 600


def test_contact_sheet_labels_tiles_and_keeps_text_inside(converted, sample_source):
    import matplotlib.pyplot as plt

    from imagenet_shards.inspect import reading, statistics
    from imagenet_shards.inspect.sheet import contact_sheet

    opened = reading.open_dataset(str(converted("img")), synset_file=str(sample_source / "synsets.txt"))
    view = opened.splits["train"]
    rows = reading.pick_rows(view, 12, seed=5)
    assert list(rows) == list(reading.pick_rows(view, 12, seed=5)) and list(rows) != list(reading.pick_rows(view, 12, 6))
    shown = list(reading.read_rows(view, rows))
    index_stats = statistics.index_statistics(view, opened.synsets)
    figure = contact_sheet(view, shown, opened.synsets, index_stats, statistics.sample_statistics(view, shown))
    try:
        assert text_outside_figure(figure) == []
        titles = [axis.get_title() for axis in figure.subfigs[0].axes if axis.get_title()]
        assert len(titles) == 12
        for item, title in zip(shown, titles):
            wnid = opened.splits["train"].source.classes[item.label]
            assert title.startswith(f"{wnid} ({item.label})") and item.key[-10:] in title
            assert opened.synsets[wnid][:5] in title
    finally:
        plt.close(figure)


@pytest.mark.parametrize("fmt", format_names())
def test_key_extracts_the_stored_bytes_exactly(converted, sample_source, tmp_path, fmt):
    dataset = converted(fmt)
    record = read_sample_index(dataset / sample_index_name("validation"))[4]
    out = tmp_path / "payload.bin"
    result = inspect(dataset, "--key", record.key, "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    data = out.read_bytes()
    assert len(data) == record.payload_size and crc32c.crc32c(data) == record.payload_crc32c
    metadata = json.loads(result.stdout)
    assert (metadata["key"], metadata["split"], metadata["label"]) == (record.key, "validation", record.label)
    assert metadata["index"]["payload_crc32c"] == record.payload_crc32c
    if fmt != "tfrecord":  # TF-slim records have no json member
        assert metadata["json"]["class"] == metadata["class"]
    if fmt == "img" and metadata["json"]["converted"] == "passthrough":
        assert data == (sample_source / metadata["json"]["source"]).read_bytes()


def test_key_to_stdout_is_the_bytes_and_metadata_goes_to_stderr(converted, tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    dataset = converted("img")
    record = read_sample_index(dataset / sample_index_name("train"))[0]
    result = subprocess.run([sys.executable, str(REPO / "inspect_dataset.py"), str(dataset), "--key", record.key,
                             "--out", "-"], capture_output=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert crc32c.crc32c(result.stdout) == record.payload_crc32c
    assert json.loads(result.stderr)["key"] == record.key


def test_extracted_folder(sample_source):
    report = inspect_json(sample_source)
    check_counts(report)
    assert report["splits"]["train"]["format"] == "image folder"
    assert report["splits"]["train"]["payload_bytes_from"] == "the files sampled"
    key = "n05704842/n05704842_173"
    result = inspect(sample_source, "--key", key)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["payload"]["bytes"] == (sample_source / "train" / f"{key}.JPEG").stat().st_size


def test_quirks_are_counted(tmp_path):
    from imagenet_shards.sample import build_sample_dataset

    build_sample_dataset(tmp_path / "quirky", seed=0, classes=2, train_per_class=6, val_per_class=2, quirks=True)
    quirks = json.loads((tmp_path / "quirky" / "quirks.json").read_text())
    expected = {}
    for quirk in quirks:
        if quirk["split"] == "train":
            expected[quirk["kind"]] = expected.get(quirk["kind"], 0) + 1
    report = inspect_json(tmp_path / "quirky", "--split", "train")
    found = {name: q["count"] for name, q in report["splits"]["train"]["sample"]["quirks"].items()}
    for kind in ("cmyk", "grayscale"):
        if kind in expected:
            assert found.get(kind, 0) >= expected[kind], (found, expected)
    if "png_as_jpeg" in expected:
        assert found.get("png_as_jpeg") == expected["png_as_jpeg"], (found, expected)


@pytest.mark.parametrize("fmt", ["img", "tensor"])
def test_reference_harness_dataset(sample_source, tmp_path, fmt):
    from reference_layout import write_reference_dataset

    write_reference_dataset(sample_source, tmp_path / "ref", fmt=fmt, tensor_size=32)
    report = inspect_json(tmp_path / "ref")
    check_counts(report)
    assert any("reference harness" in note for note in report["splits"]["train"]["notes"])
    if fmt == "tensor":  # .pth payloads: decoded through the payload registry's `pixels`
        assert report["splits"]["train"]["sample"]["width"]["p0"] == 32
        out = tmp_path / "sheet.png"
        for as_trained in ([], ["--as-trained"]):
            result = inspect(tmp_path / "ref", "--png", out, "--count", 4, *as_trained)
            assert result.returncode == 0, result.stdout + result.stderr
            assert out.read_bytes().startswith(PNG_MAGIC)


def test_tfrecords_without_metadata(converted, tmp_path):
    folder = tmp_path / "tfslim"
    folder.mkdir()
    for path in converted("tfrecord").iterdir():
        if path.name.startswith(("train-", "validation-")):
            shutil.copy(path, folder / path.name)
    refused = inspect(folder)  # TF-slim's labels 1..4 of 1000 classes: the offset cannot be told
    assert refused.returncode == 1 and "label offset" in refused.stderr
    report = inspect_json(folder, "--label-offset", 1)
    check_counts(report)
    assert report["splits"]["train"]["format"] == "tfrecord"


def test_over_http_reads_the_index_and_the_shown_samples_only(converted, tmp_path):
    import http_range_server

    dataset = converted("img")
    served = []

    class Counting(http_range_server.RangeHandler):
        def send_head(self):
            body = super().send_head()
            if body is not None:
                served.append((self.path, len(body.getbuffer()) if hasattr(body, "getbuffer")
                               else Path(body.name).stat().st_size))
            return body

    import functools
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Counting, directory=str(dataset)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        from imagenet_shards.inspect import reading

        url = f"http://127.0.0.1:{server.server_address[1]}/"
        opened = reading.open_dataset(url, ("train",))
        view = opened.splits["train"]
        before = len(served)
        rows = reading.pick_rows(view, 3, seed=0)
        shown = list(reading.read_rows(view, rows))
    finally:
        server.shutdown()
        server.server_close()
    assert [s.error for s in shown] == [None] * 3
    records = view.source.columns.records(rows)
    reads = served[before:]
    assert sum(size for _, size in reads) == sum(r.record_size for r in records)
    assert {path for path, _ in served[:before]} == {"/metadata.json", f"/{sample_index_name('train')}"}


def test_s3_copy(s3_server, s3_bucket, converted):
    dataset = converted("img")
    target = f"s3://{s3_bucket}/img"
    result = run_script("upload_dataset.py", dataset, target, "--s3-endpoint", s3_server.endpoint, "--no-progress",
                        env=s3_server.env())
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_script("inspect_dataset.py", target, "--s3-endpoint", s3_server.endpoint, "--json", "--sample", 5,
                        env=s3_server.env())
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["splits"]["train"]["samples"] == TRAIN and report["splits"]["train"]["sample"]["sampled"] == 5


# ---------------------------------------------------------------- bad input: one line, exit 1 or 2


def one_line_error(result, code, *words):
    assert result.returncode == code, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert str(word) in lines[0], lines[0]


def test_missing_path_is_a_usage_error(tmp_path):
    one_line_error(inspect(tmp_path / "nothing"), 2, tmp_path / "nothing", "no such file")


def test_bad_option_is_a_usage_error(converted):
    assert inspect(converted("img"), "--count", "0").returncode == 2
    assert inspect(converted("img"), "--out", "x").returncode == 2


def test_a_folder_that_is_no_dataset(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    one_line_error(inspect(tmp_path), 1, tmp_path)


def test_unknown_key(converted):
    one_line_error(inspect(converted("img"), "--key", "no-such-key"), 1, "no-such-key")


def test_garbage_metadata(converted, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(converted("img"), copy)
    (copy / "metadata.json").write_text("{not json")
    one_line_error(inspect(copy), 1, "metadata.json")


def test_a_damaged_shard_names_the_sample_and_exits_1(converted, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(converted("img"), copy)
    record = read_sample_index(copy / sample_index_name("validation"))[0]
    with open(copy / record.shard, "r+b") as handle:  # the payload member's header: its name no longer matches
        handle.seek(record.payload_offset - 512)
        handle.write(b"garbage-name.jpg\0")
    result = inspect(copy, "--key", record.key, "--out", tmp_path / "x")
    one_line_error(result, 1, record.shard, record.key)
    assert not (tmp_path / "x").exists()
    report = inspect(copy, "--json", "--split", "validation")
    assert report.returncode == 1
    assert json.loads(report.stdout)["splits"]["validation"]["sample"]["unreadable"][0]["key"] == record.key
