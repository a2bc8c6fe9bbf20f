"""--format tfrecord end to end: the converter's guarantees, the validator's CRC checks, repartitions.

Shards are read back with the `tfrecord` package's own reader and index tool (not only with
ours), and payloads are compared with the source files, so a writer bug cannot hide behind a
matching reader bug.
"""

import hashlib
import os
import shutil
import signal
import subprocess
import time

import crc32c
import pytest

import conftest
from conftest import PYTHON, REPO, flip_byte, output_hashes, run_script
from reference_layout import folder_dirhash
from imagenet_shards.index import read_metadata
from imagenet_shards.index import read_sample_index
from imagenet_shards.formats.tf_example import parse_example, serialize_example
from imagenet_shards.formats.tfrecord import (
    FRAMING_SIZE,
    HEADER_SIZE,
    frame_record,
    iter_tfrecord_records,
    parse_tfrecord_shard_name,
    read_tfrecord_index,
    tfrecord_index_path,
)
from imagenet_shards.formats.tfslim_imagenet import LABEL_OFFSET


def convert(source, target, *args):
    return conftest.convert(source, target, "--format", "tfrecord", *args)


def converted_ok(source, target, *args):
    return conftest.converted_ok(source, target, "--format", "tfrecord", *args)


def source_files(sample_source, split):
    """{key: (path, class folder)} of a split of the sample source."""
    return {p.stem: (p, p.parent.name) for p in (sample_source / split).rglob("*.JPEG")}


def shard_paths(directory, split):
    return sorted(p for p in directory.iterdir() if (parse_tfrecord_shard_name(p.name) or ("",))[0] == split)


# ---------------------------------------------------------------- the converter


def test_converted_shards_are_tfslim_and_hold_the_source_bytes(converted, sample_source):
    from tfrecord.reader import tfrecord_loader
    from tfrecord.tools.tfrecord2idx import create_index

    target = converted("tfrecord")
    metadata = read_metadata(target)
    assert metadata["format"] == "tfrecord" and metadata["label_offset"] == LABEL_OFFSET == 1
    classes = metadata["classes"]
    for split, shard_count in (("train", 5), ("validation", 2)):  # 36 and 12 samples, 8 a shard
        sources = source_files(sample_source, split)
        listed = metadata["splits"][split]["shards"]
        assert [s["name"] for s in listed] == [f"{split}-{n:05d}-of-{shard_count:05d}" for n in range(shard_count)]
        seen = []
        for shard in listed:
            path = target / shard["name"]
            assert hashlib.sha256(path.read_bytes()).hexdigest() == shard["sha256"] and path.stat().st_size == shard["bytes"]
            reference = target / "reference.idx"
            create_index(str(path), str(reference))  # the package's own index tool agrees with ours
            assert tfrecord_index_path(path).read_bytes() == reference.read_bytes()
            reference.unlink()
            examples = list(tfrecord_loader(str(path), None))  # the stock reader
            assert len(examples) == shard["samples"]
            for example in examples:
                key = bytes(example["image/key"]).decode()
                source, class_name = sources[key]
                assert bytes(example["image/encoded"]) == source.read_bytes()  # passthrough: byte-identical
                assert int(example["image/class/label"][0]) == classes.index(class_name) + 1  # TF-slim's 1..N
                assert bytes(example["image/class/synset"]).decode() == class_name
                assert bytes(example["image/filename"]).decode() == source.name
                assert bytes(example["image/format"]) == b"JPEG" and bytes(example["image/colorspace"]) == b"RGB"
                seen.append(key)
        assert sorted(seen) == sorted(sources)
        for record in read_sample_index(target / f"samples-{split}.index.tsv"):  # every sample found and checked alone
            with open(target / record.shard, "rb") as handle:
                handle.seek(record.payload_offset)
                payload = handle.read(record.payload_size)
            assert payload == sources[record.key][0].read_bytes()
            assert crc32c.crc32c(payload) == record.payload_crc32c
            assert record.label == classes.index(sources[record.key][1])  # the index keeps 0-based labels


def test_tfrecord_holds_the_same_samples_in_the_same_order_as_img(converted):
    img, tfrecord = converted("img"), converted("tfrecord")
    for split in ("train", "validation"):
        ours = [(r.key, r.label, r.payload_crc32c) for r in read_sample_index(tfrecord / f"samples-{split}.index.tsv")]
        theirs = [(r.key, r.label, r.payload_crc32c) for r in read_sample_index(img / f"samples-{split}.index.tsv")]
        assert ours == theirs


def test_workers_and_instances_give_identical_bytes(sample_source, tmp_path):
    args = ("--seed", 7, "--samples-per-shard", 5, "--splits", "validation", "--validation-preprocess-steps", "Resize(64)")
    converted_ok(sample_source, tmp_path / "w1", *args, "--workers", 1)
    converted_ok(sample_source, tmp_path / "w2", *args, "--workers", 2)
    converted_ok(sample_source, tmp_path / "multi", *args, "--workers", 1, "--instance-index", 1, "--instance-count", 2)
    assert sorted(p.name for p in (tmp_path / "multi").glob("validation-*-of-*")) == [
        "validation-00001-of-00003", "validation-00001-of-00003.tfindex"]
    converted_ok(sample_source, tmp_path / "multi", *args, "--workers", 1, "--instance-index", 0, "--instance-count", 2)
    one = output_hashes(tmp_path / "w1")
    assert len(one) == 3 * 2 + 2 and one == output_hashes(tmp_path / "w2") == output_hashes(tmp_path / "multi")


def test_sigkill_then_resume_gives_the_uninterrupted_bytes(sample_source, tmp_path):
    # Upscaling to 1024 px makes each sample slow enough (tens of ms) to be killed mid-run.
    args = ("--samples-per-shard", 2, "--seed", 3, "--workers", 2, "--splits", "train", "--train-preprocess-steps", "Resize(1024)")
    reference = tmp_path / "reference"
    converted_ok(sample_source, reference, *args)

    target = tmp_path / "killed"
    command = [PYTHON, str(REPO / "create_webdataset.py"), "--source", str(sample_source), "--target", str(target),
               "--no-progress", "--format", "tfrecord", *map(str, args)]
    process = subprocess.Popen(command, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list((target / ".convert-state").glob("train-*.json"))) < 3:
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)  # the whole job: main process and its workers
    process.wait()
    assert process.returncode == -signal.SIGKILL
    finished = [p for p in shard_paths(target, "train") if parse_tfrecord_shard_name(p.name) and "." not in p.name]
    assert 3 <= len(finished) < 18, "killed partway"
    assert not (target / "metadata.json").exists()
    for path in finished:  # nothing incomplete under a final name: every record whole, CRCs right, index there
        assert len(list(iter_tfrecord_records(path))) == 2
        assert len(read_tfrecord_index(tfrecord_index_path(path))) == 2
    (target / "train-00003-of-00099").write_bytes(b"stale shard of another plan")
    (target / "train-00003-of-00099.tfindex").write_bytes(b"0 28\n")
    resumed = converted_ok(sample_source, target, *args, "--resume")
    assert "verified shards kept" in resumed.stdout
    assert output_hashes(target) == output_hashes(reference)
    assert not list(target.glob("*.partial")) and not (target / "train-00003-of-00099").exists()
    # Nothing hidden is left, and the reference folder checksum (.tfindex files included) is checksumdir's.
    assert [p.name for p in target.rglob(".*")] == []
    assert folder_dirhash(target) == read_metadata(target)["checksum"]


def test_overwrite_replaces_an_img_conversion_entirely(sample_source, tmp_path):
    converted_ok(sample_source, tmp_path, "--seed", 0, "--splits", "validation", "--format", "img")
    assert list(tmp_path.glob("*.tar"))
    converted_ok(sample_source, tmp_path, "--seed", 0, "--splits", "validation", "--overwrite")
    assert not list(tmp_path.glob("*.tar")) and read_metadata(tmp_path)["format"] == "tfrecord"


# ---------------------------------------------------------------- the validator


def damaged_copy(converted, tmp_path):
    target = tmp_path / "dataset"
    shutil.copytree(converted("tfrecord"), target, ignore=shutil.ignore_patterns(".convert-state"))
    return target


def problems_of(report):
    return [(p.file, p.key, p.problem) for p in report.errors]


def test_validator_passes_a_clean_tfrecord_dataset_deeply(converted):
    from imagenet_shards.validate.validator import validate

    report = validate(converted("tfrecord"), deep=True)
    assert report.ok and not report.warnings, [p.line() for p in report.problems]
    assert report.stats["samples_checked"] == 48 and report.stats["payloads_decoded"] == 48


@pytest.mark.parametrize("where, message", [
    ("payload", "data CRC mismatch"),  # the image bytes inside the Example
    ("label_field", "data CRC mismatch"),  # the Example's other fields
    ("length", "length CRC mismatch"),
    ("data_crc", "data CRC mismatch"),
])
def test_validator_names_a_flipped_byte_by_shard_and_record_number(converted, tmp_path, where, message):
    target = damaged_copy(converted, tmp_path)
    records = [r for r in read_sample_index(target / "samples-train.index.tsv") if r.shard == "train-00002-of-00005"]
    number = 5
    record = records[number]
    offset = {
        "payload": record.payload_offset + record.payload_size // 2,
        "label_field": record.record_offset + HEADER_SIZE + 4,
        "length": record.record_offset + 1,
        "data_crc": record.record_offset + record.record_size - 2,
    }[where]
    flip_byte(target / record.shard, offset, mask=0x01)
    result = run_script("validate_dataset.py", target)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Dataset is corrupted." in result.stdout
    line = next(line for line in result.stdout.splitlines() if message in line)
    assert f"{record.shard} [{record.key}]: record {number} (at byte {record.record_offset:,})" in line
    # Only that record is named: the walk goes on past it (by its length, or by the index).
    named = {line.split("]")[0] for line in result.stdout.splitlines() if line.startswith("error:") and "[" in line}
    assert named == {f"error: {record.shard} [{record.key}"}


def test_validator_truncation_index_file_and_wrong_label(converted, tmp_path):
    from imagenet_shards.validate.validator import validate

    target = damaged_copy(converted, tmp_path)
    # Truncated inside its last record.
    truncated = target / "validation-00001-of-00002"
    last = read_sample_index(target / "samples-validation.index.tsv")[-1]
    os.truncate(truncated, truncated.stat().st_size - 100)
    # An index file that no longer matches its shard, and one that is gone.
    tfrecord_index_path(target / "train-00000-of-00005").write_text("0 5\n")
    tfrecord_index_path(target / "train-00001-of-00005").unlink()
    # A record rewritten with another label and valid CRCs: only the label check can see it.
    shard = target / "train-00003-of-00005"
    victim = [r for r in read_sample_index(target / "samples-train.index.tsv") if r.shard == shard.name][2]
    raw = shard.read_bytes()
    data = raw[victim.record_offset + HEADER_SIZE : victim.record_offset + victim.record_size - 4]
    features = parse_example(data)
    wrong = (victim.label + 1) % 4
    rewritten = serialize_example({
        name: ([bytes(v) for v in values], "byte") if isinstance(values[0], memoryview) else (values, "int")
        for name, values in features.items() if name != "image/class/label"
    } | {"image/class/label": (wrong + LABEL_OFFSET, "int")})
    assert len(rewritten) == len(data)
    shard.write_bytes(raw[: victim.record_offset] + frame_record(rewritten) + raw[victim.record_offset + victim.record_size :])

    problems = problems_of(validate(target))
    assert ("validation-00001-of-00002", last.key, f"record 3 (at byte {last.record_offset:,}): truncated: a record of "
            f"{last.record_size - FRAMING_SIZE} bytes needs {last.record_size} bytes, only {last.record_size - 100} remain") in problems
    assert any(f == "train-00000-of-00005.tfindex" and "lists 1 records, the shard holds 8" in p for f, _, p in problems)
    assert any(f == "train-00001-of-00005.tfindex" and p.startswith("missing") for f, _, p in problems)
    assert any(f == shard.name and k == victim.key and f"label {wrong} in the shard, the index says {victim.label}" in p
               for f, k, p in problems)


# ---------------------------------------------------------------- repartitions


def test_repartition_copies_records_with_their_crcs_and_names_a_flipped_byte(converted, tmp_path):
    from imagenet_shards.repartition.run import repartition
    from imagenet_shards.validate.validator import validate

    target = damaged_copy(converted, tmp_path)
    result = repartition(target, 3)
    originals = {}
    for split in ("train", "validation"):
        for r in read_sample_index(target / f"samples-{split}.index.tsv"):
            with open(target / r.shard, "rb") as handle:
                handle.seek(r.record_offset)
                originals[r.key] = handle.read(r.record_size)
    remainders = sorted((target / "distributed" / "3-instances").glob("*-remainder-*.tfrecord"))
    assert remainders and result.output == target / "distributed" / "3-instances"
    copied = 0
    for path in remainders:
        for record in iter_tfrecord_records(path):  # CRCs verified while reading
            key = bytes(parse_example(record.data)["image/key"][0]).decode()
            raw = path.read_bytes()[record.offset : record.offset + FRAMING_SIZE + len(record.data)]
            assert raw == originals[key]  # byte for byte, length and CRCs included
            copied += 1
    assert copied > 0
    assert validate(target).ok

    # A flipped byte inside a copied record: the validator names the remainder shard and the record.
    remainder = remainders[0]
    records = list(iter_tfrecord_records(remainder))
    flip_byte(remainder, records[1].offset + HEADER_SIZE + len(records[1].data) // 2, mask=0x01)
    relative = remainder.relative_to(target).as_posix()
    named = [(f, p) for f, _, p in problems_of(validate(target)) if f == relative]
    assert any(p.startswith(f"record 1 (at byte {records[1].offset:,}): data CRC mismatch") for _, p in named), named


def test_repartition_refuses_a_source_shard_with_a_flipped_byte_naming_the_record(converted, tmp_path):
    from imagenet_shards.repartition.run import repartition

    target = damaged_copy(converted, tmp_path)
    plan = repartition(target, 3, dry_run=True).plans[0]
    shard_name = sorted({r.shard for i in plan.instances for r in i.copied})[0]
    record = [r for r in read_sample_index(target / f"samples-{plan.split}.index.tsv") if r.shard == shard_name][4]
    flip_byte(target / shard_name, record.payload_offset + 10, mask=0x01)
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3)
    assert result.returncode == 1, result.stdout + result.stderr
    assert shard_name in result.stderr and f"record 4 (at byte {record.record_offset})" in result.stderr
    assert not (target / "distributed" / "3-instances" / "manifest.json").exists()


# ---------------------------------------------------------------- the loader on TF-slim data without metadata


def write_tfslim_shards(directory, split, labels, shards):
    """Files as TF-slim's build_imagenet_data.py writes them, with the tfrecord package's own writer:
    TF-slim names, labels as given (1..1000), no image/key, no metadata, no index files."""
    import io

    from PIL import Image
    from tfrecord.writer import TFRecordWriter

    images = []
    for n in range(4):  # a few distinct real JPEGs (decoded by the loader)
        buffer = io.BytesIO()
        Image.new("RGB", (40 + n, 30), (60 * n, 20, 200 - 40 * n)).save(buffer, "JPEG", quality=90)
        images.append(buffer.getvalue())
    per_shard = -(-len(labels) // shards)
    paths = []
    for shard in range(shards):
        path = directory / f"{split}-{shard:05d}-of-{shards:05d}"
        writer = TFRecordWriter(str(path))
        for number in range(shard * per_shard, min((shard + 1) * per_shard, len(labels))):
            writer.write({
                "image/encoded": (images[number % 4], "byte"),
                "image/format": (b"JPEG", "byte"),
                "image/colorspace": (b"RGB", "byte"),
                "image/channels": (3, "int"),
                "image/height": (30, "int"),
                "image/width": (40 + number % 4, "int"),
                "image/class/label": (labels[number], "int"),
                "image/class/synset": (f"n{labels[number]:08d}".encode(), "byte"),
                "image/filename": (f"ILSVRC2012_{split}_{number + 1:08d}.JPEG".encode(), "byte"),
            })
        writer.close()
        paths.append(path)
    return paths


def test_loader_reads_tfslim_files_without_metadata_as_0_to_999_with_a_message(tmp_path):
    from collections import Counter

    from imagenet_shards.launcher import Instance
    from imagenet_shards.loader import DataSource, get_data

    labels = [1 + (7 * n) % 1000 for n in range(1000)]  # TF-slim: 1..1000, each once
    paths = write_tfslim_shards(tmp_path, "validation", labels, shards=3)
    expected = [f"{path}#{n}" for path in paths for n in range(len(list(iter_tfrecord_records(path))))]
    label_of = dict(zip(expected, (label - 1 for label in labels)))
    seen = []
    for index in range(3):  # every record exactly once across instances and workers
        with pytest.warns(UserWarning, match=r"label offset 1 \(TF-slim convention\)"):
            loader = get_data(tmp_path, "validation", 64, 2, instance=Instance(index, 3, "explicit"), with_keys=True,
                              normalization="device")
        for batch in loader:
            seen += batch.keys
            assert [label_of[key] for key in batch.keys] == batch.labels.tolist()
        assert loader.report.complete and not loader.report.skipped
    assert Counter(seen) == Counter(expected)
    assert sorted(label_of[key] for key in seen) == list(range(1000))

    with pytest.warns(UserWarning, match="label offset 0: given explicitly"):
        loader = get_data(DataSource(tmp_path, label_offset=0), "validation", 500, 0,
                          instance=Instance(0, 1, "explicit"), normalization="device")
    assert sorted(label for _, batch_labels in loader for label in batch_labels.tolist()) == list(range(1, 1001))


def test_loader_refuses_to_guess_the_label_offset(tmp_path):
    from imagenet_shards.launcher import Instance
    from imagenet_shards.loader import DataSource, get_data
    from imagenet_shards.loader.sources import SourceError

    write_tfslim_shards(tmp_path, "train", [1, 2, 3, 4, 5, 6, 7, 8, 9], shards=2)  # 0-based or 1-based?
    with pytest.raises(SourceError, match="cannot tell whether the labels start at 0 or at 1.*give the label offset"):
        get_data(tmp_path, "train", 2, 0, instance=Instance(0, 1, "explicit"))
    (tmp_path / "train-00001-of-00002").unlink()
    with pytest.raises(SourceError, match="1 of 2 train shards are missing: train-00001-of-00002"):
        get_data(DataSource(tmp_path, label_offset=1), "train", 2, 0, instance=Instance(0, 1, "explicit"))


def test_a_given_label_offset_holds_for_a_local_brace_pattern(tmp_path):
    """Issue 46: the offset given for local TF-slim shards named by a brace pattern is used, not detected
    (it was dropped for patterns that are no path of their own)."""
    from imagenet_shards.launcher import Instance
    from imagenet_shards.loader import DataSource, get_data
    from imagenet_shards.loader.sources import SourceError

    write_tfslim_shards(tmp_path, "train", [1, 2, 3, 4, 5, 6, 7, 8, 9], shards=2)  # 0-based or 1-based: ambiguous
    pattern = f"{tmp_path}/train-{{00000..00001}}-of-00002"
    with pytest.raises(SourceError, match="cannot tell whether the labels start at 0 or at 1"):
        get_data(pattern, "train", 9, 0, instance=Instance(0, 1, "explicit"))
    with pytest.warns(UserWarning, match="label offset 1: given explicitly"):
        loader = get_data(DataSource(pattern, label_offset=1), "train", 9, 0, instance=Instance(0, 1, "explicit"),
                          normalization="device")
    assert sorted(label for _, labels in loader for label in labels.tolist()) == list(range(9))


def test_loader_reads_a_tfslim_shard_over_http_equal_to_local(tmp_path):
    import socket
    import sys

    from imagenet_shards.launcher import Instance
    from imagenet_shards.loader import get_data

    paths = write_tfslim_shards(tmp_path, "validation", [1000, *range(1, 40)], shards=1)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/{paths[0].name}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)

        def read(source):
            with pytest.warns(UserWarning, match="label offset 1"):
                loader = get_data(source, "validation", 8, 0, instance=Instance(0, 1, "explicit"),
                                  normalization="device", with_keys=True)
            return [(images.clone(), batch_labels.tolist()) for images, batch_labels, _ in loader]

        remote, local = read(url), read(str(paths[0]))
    finally:
        server.terminate()
        server.wait()
    assert len(remote) == len(local) == 5
    assert all(torch_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(remote, local))


def torch_equal(a, b):
    import torch

    return torch.equal(a, b)


# ---------------------------------------------------------------- the format comparison


def test_host_benchmark_compare_has_the_tfrecord_rows(filtered_compare_run):
    """The shared `--compare --formats img,tfrecord,lmdb` run (conftest.filtered_compare_run)."""
    import json

    result, out_json = filtered_compare_run
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out_json.read_text())
    assert [row["id"] for row in report["rows"] if row["format"] in ("img", "tfrecord")] == [
        "baseline_webdataset_pil", "img/host", "img/device", "img/device-pil", "img/device-noverify",
        "img/device-order-global", "img/device-tv-rrc-flip", "img/device-strong", "img/device-strong-mix", "baseline_tfrecord_torch", "tfrecord/host", "tfrecord/device", "tfrecord/device-pil", "tfrecord/device-noverify"]
    for row in report["rows"]:
        assert "error" not in row, row
        assert row["images"] == 8 and row["images_per_s"] > 0, row["id"]
    assert "tfrecord, device normalisation" in result.stdout and "tfrecord TFRecordDataset + PIL (baseline)" in result.stdout
