"""create_webdataset.py --source <converted dataset>: another format or resolution, without the source images."""

import hashlib
import io
import shutil

import pytest

from conftest import SAMPLES_PER_SHARD, run_script
from imagenet_shards.index import read_metadata, sample_index_name
from imagenet_shards.index import read_sample_index
from imagenet_shards.dataset_folder import SPLITS


def derive(parent, target, fmt, *extra):
    result = run_script("create_webdataset.py", "--source", parent, "--target", target, "--format", fmt,
                        "--seed", 1, "--samples-per-shard", SAMPLES_PER_SHARD, *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return target


def validates(folder):
    result = run_script("validate_dataset.py", folder)
    assert result.returncode == 0 and "Dataset OK." in result.stdout, result.stdout + result.stderr


def members(folder, split):
    """{key: (label, bbox)} from a dataset's sample index."""
    return {r.key: (r.label, r.bbox or None) for r in read_sample_index(folder / sample_index_name(split))}


def payloads(folder, split) -> dict:
    """{key: payload bytes}, read through the index (byte-range formats)."""
    out = {}
    for record in read_sample_index(folder / sample_index_name(split)):
        with open(folder / record.shard, "rb") as handle:
            handle.seek(record.payload_offset)
            out[record.key] = handle.read(record.payload_size)
    return out


def loaded(folder, split="validation"):
    from imagenet_shards.loader import get_data

    keys, labels = [], []
    for _, batch_labels, batch_keys in get_data(str(folder), split, batch_size=5, workers=0, with_keys=True):
        keys += batch_keys
        labels += batch_labels.tolist()
    return dict(zip(keys, labels))


@pytest.mark.parametrize("fmt, steps", [("tensor", []), ("img", ["--train-preprocess-steps", "Resize(160)"]),
                                        ("tfrecord", []), ("lmdb", [])])
def test_derived_dataset_validates_and_keeps_keys_labels_and_splits(converted, tmp_path, fmt, steps):
    parent = converted("img")
    child = derive(parent, tmp_path / "child", fmt, *steps)
    validates(child)
    for split in SPLITS:
        assert members(child, split) == members(parent, split)
    assert loaded(child) == {key: label for key, (label, _) in members(parent, "validation").items()}
    metadata = read_metadata(child)
    derived = metadata["derived_from"]
    assert derived["source"] == str(parent) and derived["format"] == "img"
    assert derived["metadata_sha256"] == hashlib.sha256((parent / "metadata.json").read_bytes()).hexdigest()
    assert derived["checksum"] == read_metadata(parent)["checksum"] and metadata["source_layout"] == "dataset"


def test_lower_resolution_copy(converted, tmp_path):
    from PIL import Image

    child = derive(converted("img"), tmp_path / "small", "img", "--train-preprocess-steps", "Resize(160)")
    for key, data in payloads(child, "train").items():
        with Image.open(io.BytesIO(data)) as image:
            assert min(image.size) == 160, (key, image.size)
    assert payloads(child, "validation") == payloads(converted("img"), "validation")  # no step: passed through


def test_passthrough_keeps_the_bytes(converted, tmp_path):
    parent = converted("img")
    child = derive(parent, tmp_path / "copy", "img")
    for split in SPLITS:
        assert payloads(child, split) == payloads(parent, split)


def test_from_tfrecord_back_to_img_gives_the_same_jpegs(converted, tmp_path):
    child = derive(converted("tfrecord"), tmp_path / "img", "img")
    validates(child)
    assert payloads(child, "train") == payloads(converted("img"), "train")


def test_reproducible_for_any_worker_count_and_resume_finds_it_complete(converted, tmp_path):
    parent = converted("img")
    one = derive(parent, tmp_path / "one", "tensor", "--workers", 1)
    two = derive(parent, tmp_path / "two", "tensor", "--workers", 2)
    shards = [s["sha256"] for split in SPLITS for s in read_metadata(one)["splits"][split]["shards"]]
    assert shards == [s["sha256"] for split in SPLITS for s in read_metadata(two)["splits"][split]["shards"]]
    again = run_script("create_webdataset.py", "--source", parent, "--target", one, "--format", "tensor", "--seed", 1,
                       "--samples-per-shard", SAMPLES_PER_SHARD, "--resume")
    assert again.returncode == 0 and "complete" in again.stdout, again.stdout + again.stderr


def test_from_an_s3_copy(s3_server, s3_bucket, converted, tmp_path):
    parent = converted("img")
    target = f"s3://{s3_bucket}/img"
    result = run_script("upload_dataset.py", parent, target, "--s3-endpoint", s3_server.endpoint, "--no-progress",
                        env=s3_server.env())
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_script("create_webdataset.py", "--source", target, "--target", tmp_path / "t", "--format", "tensor",
                        "--seed", 1, "--s3-endpoint", s3_server.endpoint, env=s3_server.env())
    assert result.returncode == 0, result.stdout + result.stderr
    validates(tmp_path / "t")
    assert members(tmp_path / "t", "train") == members(parent, "train")
    assert read_metadata(tmp_path / "t")["derived_from"]["source"] == target


def test_a_tensor_parent_is_refused(converted, tmp_path):
    result = run_script("create_webdataset.py", "--source", converted("tensor"), "--target", tmp_path / "t",
                        "--format", "img")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "decoded arrays" in lines[0] and str(converted("tensor")) in lines[0]


def test_a_damaged_parent_sample_is_named(converted, tmp_path):
    parent = tmp_path / "parent"
    shutil.copytree(converted("img"), parent)
    record = read_sample_index(parent / sample_index_name("validation"))[2]
    with open(parent / record.shard, "r+b") as handle:
        handle.seek(record.payload_offset + 50)
        byte = handle.read(1)
        handle.seek(record.payload_offset + 50)
        handle.write(bytes([byte[0] ^ 0xFF]))
    child = derive(parent, tmp_path / "child", "tensor")  # skipped and listed, as a bad source image is
    skipped = read_metadata(child)["splits"]["validation"]["skipped"]
    assert [item["path"] for item in skipped] == [f"{record.shard}:{record.key}.jpg"]
    assert "CRC32C" in skipped[0]["reason"]
    failed = run_script("create_webdataset.py", "--source", parent, "--target", tmp_path / "fail", "--format", "tensor",
                        "--on-error", "fail")
    assert failed.returncode == 1 and record.key in failed.stderr + failed.stdout
