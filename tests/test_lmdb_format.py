"""The lmdb format, added through the registry: convert, validate, repartition, load, --compare.

The sample dataset converted to `lmdb` must hold exactly the img conversion's samples (same
keys, labels and JPEG bytes), in self-describing values (no pickle), in cursor order equal to
the index order; a flipped payload byte is named by the validator and refused by the
repartitioner. Exactly-once loading under torchrun is in test_loader_distributed.py.
"""

import json
import pickle
import shutil

import lmdb
import pytest

from conftest import run_script
from imagenet_shards.hostbench.stock_baselines import STOCK_BASELINES
from imagenet_shards.formats.lmdb_format import MAGIC, LMDBFormatError, decode_value, encode_value
from imagenet_shards.index import read_metadata
from imagenet_shards.loader import get_data


def index_records(target, split):
    from imagenet_shards.index import read_sample_index

    metadata = read_metadata(target)
    return read_sample_index(target / metadata["splits"][split]["index"]["name"])


def shard_entries(path):
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        entries = [(bytes(k).decode(), bytes(v)) for k, v in txn.cursor()]
    env.close()
    return entries


def test_lmdb_holds_the_img_samples_in_self_describing_values(converted):
    img, target = converted("img"), converted("lmdb")
    metadata = read_metadata(target)
    assert metadata["format"] == "lmdb"
    for split in ("train", "validation"):
        img_records = {r.key: r for r in index_records(img, split)}
        records = index_records(target, split)
        assert sorted(r.key for r in records) == sorted(img_records)
        by_shard = {}
        for record in records:
            by_shard.setdefault(record.shard, []).append(record)
        for shard in metadata["splits"][split]["shards"]:
            assert shard["name"].endswith(".lmdb") and (target / shard["name"]).is_file()
            entries = shard_entries(target / shard["name"])
            # the cursor walks the shard in the index's order (keys sorted), one value per sample
            assert [key for key, _ in entries] == [r.key for r in by_shard[shard["name"]]]
            for (key, value), record in zip(entries, by_shard[shard["name"]]):
                assert value.startswith(MAGIC) and not value.startswith(b"\x80")  # not a pickle
                fields = decode_value(value)
                assert fields["key"] == key and fields["label"] == record.label == img_records[key].label
                source = img_records[key]
                img_payload = (img / source.shard).read_bytes()[source.payload_offset:
                                                                source.payload_offset + source.payload_size]
                assert bytes(fields["payload"]) == img_payload
                start = record.payload_offset - record.record_offset
                assert value[start:start + record.payload_size] == img_payload
                assert json.loads(fields["info"])["class"] == metadata["classes"][record.label]
    # no lock files or partial environments are left beside the shards
    assert not [p.name for p in target.iterdir() if p.name.endswith(("-lock", ".partial"))]


def test_values_round_trip_and_damaged_values_are_named():
    value, header = encode_value("n01_1", 7, "jpg", b'{"a":1}', b"\xff\xd8payload")
    fields = decode_value(value)
    assert (fields["key"], fields["label"], fields["ext"], fields["info"]) == ("n01_1", 7, "jpg", b'{"a":1}')
    assert bytes(fields["payload"]) == b"\xff\xd8payload" and fields["payload_start"] == header
    with pytest.raises(LMDBFormatError, match="does not start with"):
        decode_value(pickle.dumps({"key": "x"}), "shard.lmdb")
    with pytest.raises(LMDBFormatError, match="shard.lmdb: .*shorter"):
        decode_value(value[: header - 3], "shard.lmdb")


def test_validator_accepts_lmdb_deeply_and_names_a_flipped_payload_byte(converted, tmp_path):
    target = tmp_path / "lmdb"
    shutil.copytree(converted("lmdb"), target)
    result = run_script("validate_dataset.py", target, "--deep", "--no-progress")
    assert result.returncode == 0 and "Dataset OK." in result.stdout, result.stdout + result.stderr

    record = index_records(target, "train")[3]
    path = target / record.shard
    data = bytearray(path.read_bytes())
    payload = shard_entries(path)[3][1][record.payload_offset - record.record_offset:][:record.payload_size]
    position = bytes(data).index(payload) + len(payload) // 2  # inside the payload, in the file
    data[position] ^= 0x01
    path.write_bytes(bytes(data))
    result = run_script("validate_dataset.py", target, "--no-progress")
    assert result.returncode == 1 and "Dataset is corrupted." in result.stdout, result.stdout + result.stderr
    assert f"{record.shard} [{record.key}]: payload CRC32C differs from the sample index" in result.stdout


def test_repartition_copies_values_verbatim_and_the_loader_reads_each_instance(converted, tmp_path):
    target = tmp_path / "lmdb"
    shutil.copytree(converted("lmdb"), target)
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3, "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    result = run_script("validate_dataset.py", target, "--no-progress")
    assert result.returncode == 0 and "Dataset OK." in result.stdout, result.stdout + result.stderr
    remainders = sorted((target / "distributed" / "3-instances").glob("*-remainder-*.lmdb"))
    assert remainders
    originals = {}
    for shard in read_metadata(target)["splits"]["validation"]["shards"] + read_metadata(target)["splits"]["train"]["shards"]:
        originals.update(shard_entries(target / shard["name"]))
    for remainder in remainders:
        for key, value in shard_entries(remainder):
            assert value == originals[key]  # byte for byte
    keys = []
    for index in range(3):
        loader = get_data(str(target), "validation", 4, 0, normalization="device", with_keys=True,
                          instance=(index, 3))
        keys += [key for _, _, batch in loader for key in batch]
    assert sorted(keys) == sorted(r.key for r in index_records(target, "validation"))


def test_repartition_refuses_a_damaged_value(converted, tmp_path):
    target = tmp_path / "lmdb"
    shutil.copytree(converted("lmdb"), target)
    names = []
    for shard in read_metadata(target)["splits"]["validation"]["shards"]:  # whole or copied from: both refused
        path = target / shard["name"]
        data = bytearray(path.read_bytes())
        key, value = shard_entries(path)[0]
        data[bytes(data).index(value[-200:]) + 100] ^= 0x01
        path.write_bytes(bytes(data))
        names.append(shard["name"])
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3, "--quiet")
    assert result.returncode == 1, result.stdout + result.stderr
    assert any(name in result.stdout + result.stderr for name in names), result.stdout + result.stderr


def test_host_benchmark_compare_has_the_lmdb_rows(filtered_compare_run):
    """The shared `--compare --formats img,tfrecord,lmdb` run (conftest.filtered_compare_run)."""
    result, out_json = filtered_compare_run
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out_json.read_text())
    report["rows"] = [row for row in report["rows"] if row["format"] == "lmdb"]
    assert [row["id"] for row in report["rows"]] == ["baseline_lmdb_map", "lmdb/host", "lmdb/device", "lmdb/device-pil",
                                                     "lmdb/device-noverify"]
    for row in report["rows"]:
        assert "error" not in row, row
        assert row["images"] == 8 and row["images_per_s"] > 0, row["id"]
    assert STOCK_BASELINES["lmdb"].label in result.stdout
