"""validate_dataset.py A --same-as B: the same samples across formats, copies and repartitions; every
kind of difference named by key and counted.

In-process (`same_as`) for the cases, the CLI for exit codes and output as users see them.
"""

import shutil

import pytest

from conftest import reseal_index, run_script, run_scripts
from imagenet_shards.index import encode_sample_index
from imagenet_shards.index import read_sample_index
from imagenet_shards.tools.same_as import LOSSY_BOUND, same_as
from imagenet_shards.validate.report import ValidationUsageError


def copy_of(converted, fmt, tmp_path):
    copy = tmp_path / f"copy-{fmt}"
    shutil.copytree(converted(fmt), copy)
    return copy


def kinds(report):
    return {problem.problem.split(":")[0] for problem in report.problems}


@pytest.mark.parametrize("other", ["tfrecord", "lmdb"])
def test_img_holds_the_same_samples_as_tfrecord_and_lmdb(converted, other):
    report = same_as(converted("img"), converted(other))
    assert report.ok, [p.line() for p in report.problems]
    assert report.stats["samples_compared"] == 48 and report.stats["byte_equal"] == 48  # same JPEG bytes


def test_img_holds_the_same_samples_as_its_repartition_dropped_keys_noted(converted, tmp_path):
    img = copy_of(converted, "img", tmp_path)
    result = run_script("distributed_webdataset.py", "--target", img, "--num-instances", 5, "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    report = same_as(img, img / "distributed" / "5-instances")
    assert report.ok, [p.line() for p in report.problems]
    assert report.stats["samples_compared"] == 35 + 12  # train: 36 less 1 dropped by policy; validation: all 12 (spread)
    assert any("drops by its policy" in note for note in report.notes)


def test_tensor_equals_img_under_its_recorded_steps_within_the_bound(converted):
    report = same_as(converted("img"), converted("tensor"))
    assert report.ok, [p.line() for p in report.problems]
    assert report.stats["compared_after_steps"] == 48
    assert report.stats["worst_mean_abs_difference_after_steps"] <= LOSSY_BOUND
    assert any("after applying Resize(256) CenterCrop(256)" in note for note in report.notes)
    # Either order: the steps go to whichever side has fewer.
    assert same_as(converted("tensor"), converted("img"), ["validation"]).ok


def test_a_swapped_label_is_named(converted, tmp_path):
    img = copy_of(converted, "img", tmp_path)
    records = read_sample_index(img / "samples-train.index.tsv")
    first = records[0]
    second = next(r for r in records if r.label != first.label)
    swapped = [r._replace(label=second.label) if r.key == first.key else r._replace(label=first.label)
               if r.key == second.key else r for r in records]
    (img / "samples-train.index.tsv").write_bytes(encode_sample_index(swapped))
    reseal_index(img, "train")  # B differs on purpose: its metadata agrees with its index
    result = run_script("validate_dataset.py", converted("tfrecord"), "--same-as", img)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("Datasets differ.")
    assert "differences: train label: 2" in result.stdout
    for key in (first.key, second.key):
        assert f"train [{key}]: label: A's class" in result.stdout


def test_missing_extra_and_corrupt_samples_are_each_counted(converted, tmp_path):
    img = copy_of(converted, "img", tmp_path)
    records = read_sample_index(img / "samples-validation.index.tsv")
    dropped, renamed, damaged = records[0], records[1], records[2]
    changed = [r._replace(key="not-in-a") if r.key == renamed.key else r for r in records if r.key != dropped.key]
    (img / "samples-validation.index.tsv").write_bytes(encode_sample_index(changed))
    reseal_index(img, "validation")  # B differs on purpose: its metadata agrees with its index
    with open(img / damaged.shard, "r+b") as handle:  # one payload byte: the index's CRC32C no longer matches
        handle.seek(damaged.payload_offset + damaged.payload_size // 2)
        value = handle.read(1)[0]
        handle.seek(-1, 1)
        handle.write(bytes([value ^ 0x55]))
    report = same_as(converted("img"), img, ["validation"])
    assert not report.ok
    counts = report.stats["differences"]
    assert counts == {"validation missing in B": 2, "validation only in B": 1, "validation unreadable": 1}
    named = {p.key for p in report.problems}
    assert {dropped.key, renamed.key, "not-in-a", damaged.key} <= named
    assert any("CRC32C" in p.problem for p in report.problems if p.key == damaged.key)


def test_a_remote_copy_over_http_is_compared_like_a_local_one(converted):
    from http_range_server import serve

    server, base_url = serve(converted("img"))
    try:
        report = same_as(base_url, converted("lmdb"), ["validation"])
    finally:
        server.shutdown()
        server.server_close()
    assert report.ok and report.stats["samples_compared"] == 12, [p.line() for p in report.problems]


def test_usage_errors(converted, tmp_path):
    with pytest.raises(ValidationUsageError, match="neither"):
        same_as(tmp_path, tmp_path)
    nothing, split, deep = run_scripts(
        ("validate_dataset.py", converted("img"), "--same-as", tmp_path / "nothing"),
        ("validate_dataset.py", converted("img"), "--split", "train"),
        ("validate_dataset.py", converted("img"), "--same-as", converted("lmdb"), "--deep"))
    assert nothing.returncode in (1, 2) and "Traceback" not in nothing.stderr
    assert split.returncode == 2 and "--split applies to --same-as only" in split.stderr
    assert deep.returncode == 2
