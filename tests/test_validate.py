"""validate_dataset.py: every fault of the matrix is found and named (shard or file, and sample key).

Converted mode: each fault is injected into a copy of the converted sample dataset (the tar
formats, from conftest's cached conversions) and checked with the functional core in-process
(fast); a few cases run the CLI as users do (exit codes, output lines, --json, --workers 2).
What every registered format must pass (clean dataset, flipped payload byte, truncated shard,
repartition) is in tests/test_format_conformance.py.
Raw mode: the reference checksum against an independent computation (coreutils md5sum), the
ImageNet comparison, and a manifest round trip.
"""

import hashlib
import json
import os
import shutil
import subprocess

import crc32c
import pytest

from conftest import flip_byte, run_script, run_scripts
from imagenet_shards.reference.checksum import IMAGENET, list_files, md5_sha256_of_file, reference_checksum
from imagenet_shards.validate import raw_checksum
from imagenet_shards.fileio import sha256_file
from imagenet_shards.index import encode_sample_index
from imagenet_shards.index import read_sample_index
from imagenet_shards.formats import FORMATS
from imagenet_shards.metadata_digest import sealed
from imagenet_shards.formats.tar import TarShardWriter, _checksum_ok, iter_tar_samples
from imagenet_shards.formats.webdataset import WebDatasetFormat
from imagenet_shards.formats.shard_check import ERROR, WARNING
from imagenet_shards.validate.validator import validate

# The fault matrix edits tar members and headers: the registry's WebDataset tar formats.
TAR_FORMATS = [name for name, fmt in FORMATS.items() if isinstance(fmt, WebDatasetFormat)]


# ------------------------------------------------------------------------------------------ helpers


@pytest.fixture(params=TAR_FORMATS)
def dataset(request, converted, tmp_path):
    """A private copy of the converted sample dataset (train: 36 samples in 5 shards of 8)."""
    copy = tmp_path / f"dataset-{request.param}"
    shutil.copytree(converted(request.param), copy)
    return copy


def records(ds, split="train"):
    return read_sample_index(ds / f"samples-{split}.index.tsv")


def shard_records(ds, shard, split="train"):
    return [r for r in records(ds, split) if r.shard == shard]


def metadata(ds):
    return json.loads((ds / "metadata.json").read_text())


def write_metadata(ds, meta):
    (ds / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")


def patch_bytes(path, offset, data):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)




def reseal(ds, index_records=None, split="train"):
    """Make metadata.json agree with the files again (sizes and sha256 of shards and index), as a
    buggy converter or a careful tamperer would: then only the deeper checks can find the fault."""
    meta = metadata(ds)
    if index_records is not None:
        data = encode_sample_index(index_records)
        (ds / f"samples-{split}.index.tsv").write_bytes(data)
    for name, entry in meta["splits"].items():
        for shard in entry["shards"]:
            if (ds / shard["name"]).exists():
                shard["sha256"], shard["bytes"] = sha256_file(ds / shard["name"])
        index = ds / entry["index"]["name"]
        entry["index"]["sha256"], entry["index"]["bytes"] = sha256_file(index)
    write_metadata(ds, sealed(meta))  # its own digest too (imagenet_shards.metadata_digest)


def rewrite_shard(path, change):
    """Rewrite a shard through the shared writer; change(key, members) -> (key, members)."""
    samples = []
    for sample in iter_tar_samples(path):
        members = [(ext, bytes(sample[ext])) for ext in ("cls", "json", "jpg", "npy") if ext in sample]
        samples.append(change(sample["__key__"], members))
    path.unlink()
    with TarShardWriter(path) as writer:
        for key, members in samples:
            writer.add_members(key, members)


def lines(report):
    return [p.line() for p in report.problems]


def find(report, severity, file, key, fragment):
    """The problems matching all given fields (None: any)."""
    return [p for p in report.problems if p.severity == severity and (file is None or p.file == file)
            and (key is None or p.key == key) and fragment in p.problem]


def assert_found(report, severity, file, key, fragment):
    assert find(report, severity, file, key, fragment), (
        f"no {severity} for {file} [{key}] containing {fragment!r}; got:\n" + "\n".join(lines(report)))


# ------------------------------------------------------------------------------------------ clean datasets


# ------------------------------------------------------------------------------------------ the fault matrix


def test_flipped_tar_header_byte(dataset):
    target = records(dataset)[10]
    # a byte of the .json member's header, in the NUL padding of its name field
    flip_byte(dataset / target.shard, target.member_offsets()["json"] + 90)
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, target.shard, target.key, "corrupt tar header: checksum mismatch")
    # the walk resynchronises on the next sample: none of the others is reported missing
    assert not find(report, ERROR, target.shard, None, "not in the shard")


def test_flipped_byte_after_the_end_of_archive_marker(dataset):
    shard = dataset / "train-000000.tar"
    flip_byte(shard, shard.stat().st_size - 100)
    report = validate(dataset)
    assert_found(report, ERROR, "train-000000.tar", None, "non-zero bytes after the end-of-archive marker")


def test_shards_without_metadata_are_an_unfinished_conversion(dataset):
    (dataset / "metadata.json").unlink()
    result = run_script("validate_dataset.py", dataset, "--workers", 1)
    assert result.returncode == 1
    assert result.stdout.startswith("Dataset is corrupted.\nerror: metadata.json: missing, but the folder holds")
    assert "create_webdataset.py --resume" in result.stdout


def test_truncated_shard(dataset):
    shard = "train-000001.tar"
    in_shard = shard_records(dataset, shard)
    cut = in_shard[4]
    os.truncate(dataset / shard, cut.record_offset + 700)
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, shard, None, "size")
    assert_found(report, ERROR, shard, cut.key, "truncated")
    for lost in in_shard[5:]:
        assert_found(report, ERROR, shard, lost.key, "listed in the sample index but not in the shard")
    for kept in in_shard[:4]:
        assert not find(report, ERROR, shard, kept.key, "")


def test_deleted_shard(dataset):
    shard = "train-000002.tar"
    first = shard_records(dataset, shard)[0]
    (dataset / shard).unlink()
    report = validate(dataset)
    assert report.exit_code == 1
    [problem] = find(report, ERROR, shard, None, "missing shard")
    assert first.key in problem.problem and "8 samples" in problem.problem


def test_extra_shard_is_a_warning_only(dataset):
    shutil.copy(dataset / "train-000000.tar", dataset / "train-000099.tar")
    (dataset / "notes.txt").write_text("mine")
    report = validate(dataset)
    assert report.exit_code == 0 and report.verdict_lines() == ["Dataset OK."]
    assert_found(report, WARNING, "train-000099.tar", None, "extra file not listed in metadata.json")
    assert_found(report, WARNING, "notes.txt", None, "extra file")
    assert not report.errors


def test_two_shards_swapped_by_name(dataset):
    a, b = dataset / "train-000000.tar", dataset / "train-000001.tar"
    a.rename(dataset / "swap.tmp")
    b.rename(a)
    (dataset / "swap.tmp").rename(b)
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, "train-000000.tar", None, "its content is that of train-000001.tar")
    assert_found(report, ERROR, "train-000001.tar", None, "its content is that of train-000000.tar")
    moved = shard_records(dataset, "train-000001.tar")[0]
    assert_found(report, ERROR, "train-000000.tar", moved.key, "belongs to train-000001.tar")
    expected_here = shard_records(dataset, "train-000000.tar")[0]
    assert_found(report, ERROR, "train-000000.tar", expected_here.key, "listed in the sample index but not in the shard")


def test_zero_length_shard(dataset):
    shard = "train-000003.tar"
    os.truncate(dataset / shard, 0)
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, shard, None, "empty file (zero bytes)")
    for lost in shard_records(dataset, shard):
        assert_found(report, ERROR, shard, lost.key, "not in the shard")


def test_wrong_label(dataset):
    target = records(dataset)[5]
    wrong = (target.label + 1) % 4
    patch_bytes(dataset / target.shard, target.member_offsets()["cls"] + 512, str(wrong).encode())
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, target.shard, target.key, f"label {wrong} in the shard, the index says {target.label}")
    assert_found(report, ERROR, target.shard, target.key, "but the sample's json says class=")


def test_label_outside_the_class_table_resealed(dataset):
    """The shard's sha256 in metadata is updated too: only the class table check can find it (from the index,
    without reading the shard, whose bytes are as metadata records them)."""
    target = records(dataset)[20]
    patch_bytes(dataset / target.shard, target.member_offsets()["cls"] + 512, b"7")
    index = records(dataset)
    index[20] = index[20]._replace(label=7)
    reseal(dataset, index)
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, target.shard, target.key, "label 7 is outside the class table (4 classes")
    assert not find(report, ERROR, target.shard, None, "sha256")


def test_duplicated_key(dataset):
    original = records(dataset)
    dup = shard_records(dataset, "train-000000.tar")[2].key
    renamed = shard_records(dataset, "train-000003.tar")[1].key
    rewrite_shard(dataset / "train-000003.tar", lambda key, members: (dup if key == renamed else key, members))
    reseal(dataset)  # metadata agrees with the new shard: the key itself must give it away
    # The shard's sha256 matches metadata: only --deep walks it (and finds what the resealing hid).
    assert validate(dataset).exit_code == 0
    report = validate(dataset, deep=True)
    assert report.exit_code == 1
    assert_found(report, ERROR, "train-000003.tar", dup, "duplicated key: the train split also has this key in "
                                                        "train-000000.tar")
    assert_found(report, ERROR, "train-000003.tar", renamed, "listed in the sample index but not in the shard")
    assert len(original) == 36


def test_unsafe_member_names(dataset):
    in_shard = shard_records(dataset, "train-000004.tar")
    names = {in_shard[0].key: "../escape", in_shard[1].key: "/abs/olute"}
    rewrite_shard(dataset / "train-000004.tar", lambda key, members: (names.get(key, key), members))
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, "train-000004.tar", "../escape", "unsafe member name '../escape.cls'")
    assert_found(report, ERROR, "train-000004.tar", "/abs/olute", "unsafe member name '/abs/olute.json'")


def test_duplicated_key_within_one_shard(dataset):
    in_shard = shard_records(dataset, "train-000004.tar")
    first, second = in_shard[0].key, in_shard[1].key
    rewrite_shard(dataset / "train-000004.tar", lambda key, members: (first if key == second else key, members))
    report = validate(dataset)
    assert_found(report, ERROR, "train-000004.tar", first, "duplicated key: a second sample with this key")


def test_edited_metadata_class_table(dataset):
    meta = metadata(dataset)
    meta["classes"][0], meta["classes"][1] = meta["classes"][1], meta["classes"][0]
    write_metadata(dataset, meta)
    # Every shard's sha256 matches metadata: only --deep reads the samples' json to compare.
    report = validate(dataset, deep=True)
    assert report.exit_code == 1
    first = next(r for r in records(dataset) if r.shard == "train-000000.tar" and r.label in (0, 1))
    assert_found(report, ERROR, "train-000000.tar", first.key, "in the class table, but the sample's json says")


def test_edited_metadata_counts_and_hash(dataset):
    meta = metadata(dataset)
    meta["train_length"] = 35
    meta["splits"]["train"]["shards"][1]["sha256"] = "0" * 64
    meta["splits"]["validation"]["shards"][0]["samples"] = 9
    write_metadata(dataset, meta)
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, "metadata.json", None, "train_length is 35, the train shards hold 36 samples")
    assert_found(report, ERROR, "train-000001.tar", None, "every sample still matches the index")
    assert_found(report, ERROR, "validation-000000.tar", None, "8 samples in the shard, metadata says 9")


def test_metadata_not_json(dataset):
    (dataset / "metadata.json").write_text('{"format": "img", ')
    report = validate(dataset)
    assert report.exit_code == 1 and report.verdict_lines() == ["Dataset is corrupted."]
    assert_found(report, ERROR, "metadata.json", None, "not valid JSON")


def test_edited_sample_index(dataset):
    index = records(dataset)
    target = index[7]
    index[7] = target._replace(payload_crc32c=target.payload_crc32c ^ 1)
    (dataset / "samples-train.index.tsv").write_bytes(encode_sample_index(index))
    report = validate(dataset)
    assert_found(report, ERROR, "samples-train.index.tsv", None, "sha256 differs from metadata")


def test_repartition_remainder_corrupt_and_duplicate_reader(dataset):
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 3)
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = json.loads((dataset / "distributed/3-instances/manifest.json").read_text())
    instances = manifest["splits"]["train"]["instances"]
    with_remainder = next(i for i in instances if i["remainder"])
    copied = [r for r in read_sample_index(dataset / with_remainder["index"]) if r.shard == with_remainder["remainder"]]
    flip_byte(dataset / with_remainder["remainder"], copied[0].payload_offset + 5)
    # another instance also claims a sample it does not own
    other = next(i for i in instances if i is not with_remainder)
    other_index = read_sample_index(dataset / other["index"])
    (dataset / other["index"]).write_bytes(encode_sample_index(other_index + [copied[1]]))
    report = validate(dataset)
    assert_found(report, ERROR, with_remainder["remainder"], copied[0].key, "payload CRC32C differs")
    assert_found(report, ERROR, "distributed/3-instances/manifest.json", copied[1].key, "not named as padding")


def test_malformed_metadata_and_manifest_are_problems_not_crashes(dataset):
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    manifest_path = dataset / "distributed/2-instances/manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["splits"]["train"]["instances"][0] = "not an object"
    manifest["splits"]["validation"]["instances"][1]["index"] = "../../../etc/passwd"
    manifest_path.write_text(json.dumps(manifest))
    report = validate(dataset)
    assert_found(report, ERROR, "distributed/2-instances/manifest.json", None, "malformed repartition manifest")
    meta = metadata(dataset)
    meta["splits"]["train"]["shards"] = 5
    write_metadata(dataset, meta)
    report = validate(dataset)
    assert report.exit_code == 1
    assert_found(report, ERROR, "metadata.json", None, "malformed")


def test_deep_finds_what_only_decoding_can(dataset):
    """A payload corrupted and resealed everywhere (index and metadata): only --deep finds it."""
    index = records(dataset)
    target = index[14]
    path = dataset / target.shard
    data = bytearray(path.read_bytes()[target.payload_offset: target.payload_offset + target.payload_size])
    if data[:6] == b"\x93NUMPY":
        data[:6] = b"XXNUMP"
    else:  # JPEG: zero everything after the first third, end-of-image marker included
        data[len(data) // 3:] = bytes(len(data) - len(data) // 3)
    patch_bytes(path, target.payload_offset, bytes(data))
    index[14] = target._replace(payload_crc32c=crc32c.crc32c(bytes(data)))
    reseal(dataset, index)
    assert validate(dataset).ok
    report = validate(dataset, deep=True)
    assert report.exit_code == 1
    assert_found(report, ERROR, target.shard, target.key, "does not decode")


def test_leftover_partial_and_unfinished_repartition_are_warnings(dataset):
    (dataset / "train-000005.tar.partial").write_bytes(b"x" * 100)
    (dataset / "distributed" / "2-instances").mkdir(parents=True)
    report = validate(dataset)
    assert report.exit_code == 0
    assert_found(report, WARNING, "train-000005.tar.partial", None, "interrupted write")
    assert_found(report, WARNING, "distributed/2-instances", None, "without a manifest.json")


# ------------------------------------------------------------------------------------------ the CLI


def test_cli_corrupted_exit_1_lines_json_and_two_workers(converted, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(converted("img"), ds)
    target = records(ds)[30]
    flip_byte(ds / target.shard, target.payload_offset + 100)
    report_path = tmp_path / "report.json"
    result = run_script("validate_dataset.py", ds, "--workers", 2, "--json", report_path)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert out[0] == "Dataset is corrupted."
    assert f"error: {target.shard} [{target.key}]: payload CRC32C differs from the sample index: the payload is " \
           f"corrupt" in out
    report = json.loads(report_path.read_text())
    assert report["exit_code"] == 1 and report["verdicts"] == ["Dataset is corrupted."]
    assert {"severity": "error", "file": target.shard, "key": target.key,
            "problem": "payload CRC32C differs from the sample index: the payload is corrupt"} in report["problems"]
    assert report["stats"]["workers"] == 2


def test_cli_usage_errors_exit_2(tmp_path, converted):
    (tmp_path / "empty").mkdir()
    missing, neither, no_path, manifest_on_converted, bad_workers = run_scripts(
        ("validate_dataset.py", "--imagenet-data-path", tmp_path / "nowhere"),
        ("validate_dataset.py", tmp_path / "empty"),
        ("validate_dataset.py",),
        ("validate_dataset.py", converted("img"), "--write-manifest"),
        ("validate_dataset.py", converted("img"), "--workers", 0))
    assert missing.returncode == 2 and "nowhere: no such file or directory" in missing.stderr
    assert neither.returncode == 2 and "neither a converted dataset" in neither.stderr
    assert no_path.returncode == 2 and "the dataset path is required" in no_path.stderr
    assert manifest_on_converted.returncode == 2 and "--write-manifest is for raw image folders" in manifest_on_converted.stderr
    assert bad_workers.returncode == 2


# ------------------------------------------------------------------------------------------ raw folders


def coreutils_dirhash(folder):
    """checksumdir's md5 dirhash, computed without Python: md5sum every file, sort the digests,
    concatenate them without separators, md5 the result."""
    command = "find . -type f -print0 | xargs -0 md5sum | cut -c1-32 | LC_ALL=C sort | tr -d '\\n' | md5sum | cut -c1-32"
    return subprocess.run(["sh", "-c", command], cwd=folder, capture_output=True, text=True, check=True).stdout.strip()


def test_reference_checksum_small_folder(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one.JPEG").write_bytes(b"first")
    (tmp_path / "b" / "deeper").mkdir(parents=True)
    (tmp_path / "b" / "deeper" / "two.JPEG").write_bytes(b"second")
    (tmp_path / ".hidden").write_bytes(b"")  # checksumdir counts hidden and empty files too
    digests = sorted(hashlib.md5(data).hexdigest() for data in (b"first", b"second", b""))
    expected = hashlib.md5("".join(digests).encode()).hexdigest()
    files, broken, unreadable = list_files(tmp_path)
    assert sorted(path for path, _ in files) == [".hidden", "a/one.JPEG", "b/deeper/two.JPEG"]
    got = reference_checksum(md5_sha256_of_file(tmp_path / path)[0] for path, _ in files)
    assert got == expected == coreutils_dirhash(tmp_path)


def test_raw_sample_folder_reference_checksum_and_imagenet_comparison(sample_source):
    result = run_script("validate_dataset.py", "--imagenet-data-path", sample_source, "--workers", 1,
                        "--json", "/dev/stdout")
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert out[:2] == ["Train data is corrupted.", "Validation data is corrupted."]
    report = json.loads(result.stdout[result.stdout.index("{"):])
    for split in ("train", "validation"):
        got = report["stats"]["splits"][split]["reference_checksum"]
        assert got == coreutils_dirhash(sample_source / split)
        assert f"error: {split}/: checksum {got} differs from the standard ImageNet layout " \
               f"({IMAGENET[split].checksum})" in out
    assert "error: train/: 36 images, the standard ImageNet train split has 1,281,167" in out
    assert "error: validation/: 12 images, the standard ImageNet validation split has 50,000" in out
    assert "error: train/: 4 classes, the standard ImageNet train split has 1,000" in out
    assert any("--write-manifest" in line for line in out)


def test_raw_manifest_round_trip(sample_source, tmp_path):
    root = tmp_path / "mine"
    for split in ("train", "validation"):
        shutil.copytree(sample_source / split, root / split)
    written = run_script("validate_dataset.py", root, "--write-manifest", "--workers", 1)
    assert written.returncode == 0, written.stdout + written.stderr
    assert written.stdout.splitlines()[:2] == ["Train data OK.", "Validation data OK."]
    assert "differs from the standard ImageNet layout" in written.stdout  # as a note: informational
    assert (root / raw_checksum.MANIFEST_FILE).is_file()
    again = run_script("validate_dataset.py", root, "--workers", 2)
    assert again.returncode == 0 and again.stdout.splitlines()[:2] == ["Train data OK.", "Validation data OK."]

    classes = sorted(p.name for p in (root / "train").iterdir())
    train_files = sorted((root / "train" / classes[0]).iterdir())
    val_files = sorted((root / "validation" / sorted(os.listdir(root / "validation"))[0]).iterdir())
    added = root / "train" / classes[1] / "added.JPEG"
    added.write_bytes(b"not really a jpeg")
    val_files[0].unlink()
    changed = train_files[1]
    flip_byte(changed, 1000)
    moved_from = train_files[2]
    moved_to = root / "train" / classes[2] / moved_from.name
    moved_from.rename(moved_to)
    report = validate(root)
    assert report.exit_code == 1
    assert report.verdict_lines() == ["Train data is corrupted.", "Validation data is corrupted."]
    rel = lambda p: p.relative_to(root).as_posix()  # noqa: E731
    assert_found(report, ERROR, rel(added), None, "added: not in the manifest")
    assert_found(report, ERROR, rel(val_files[0]), None, "missing: listed in the manifest")
    assert_found(report, ERROR, rel(changed), None, "changed: sha256")
    assert_found(report, ERROR, rel(moved_from), None, f"its content is now at {rel(moved_to)}")
    assert len(report.errors) == 5, lines(report)  # added, removed, changed, and the move's two ends
    assert any("informational" in note for note in report.notes)


def test_raw_rename_is_invisible_to_the_reference_checksum_but_not_to_the_manifest(sample_source, tmp_path):
    root = tmp_path / "mine"
    shutil.copytree(sample_source / "train", root / "train")
    assert validate(root, write_manifest=True).ok
    first = validate(root).stats["splits"]["train"]["reference_checksum"]
    a, b = sorted((root / "train").rglob("*.JPEG"))[:2]
    a.rename(root / "swap")
    b.rename(a)
    (root / "swap").rename(b)
    report = validate(root)
    assert report.stats["splits"]["train"]["reference_checksum"] == first
    rel = lambda p: p.relative_to(root).as_posix()  # noqa: E731
    assert_found(report, ERROR, rel(a), None, f"it holds the content of {rel(b)} (swapped?)")
    assert_found(report, ERROR, rel(b), None, f"it holds the content of {rel(a)} (swapped?)")


def test_raw_deep_finds_a_truncated_image(sample_source, tmp_path):
    root = tmp_path / "mine"
    shutil.copytree(sample_source / "validation", root / "validation")
    victim = sorted((root / "validation").rglob("*.JPEG"))[3]
    os.truncate(victim, victim.stat().st_size // 2)
    report = validate(root, deep=True, write_manifest=True)
    assert_found(report, ERROR, victim.relative_to(root).as_posix(), None, "does not decode")


# ------------------------------------------------------------------------------------------ shared core


def test_fast_header_checksum_equals_the_plain_byte_sum():
    for seed in range(200):
        header = hashlib.shake_256(str(seed).encode()).digest(512) if seed else bytes([255]) * 512
        total = sum(header[:148]) + 256 + sum(header[156:])
        assert _checksum_ok(header, total) and not _checksum_ok(header, total - 65521)


def test_keys_in_several_shards_are_found_by_hash_and_named_in_order():
    from imagenet_shards.validate.converted import _KeyList, _keys_in_several_shards

    checked = [("a", _KeyList(["k1", "k2", "k2", "k3"])), ("b", _KeyList([])), ("c", _KeyList(["k3", "k9", "k1"]))]
    assert _keys_in_several_shards(checked) == {"k1": ["a", "c"], "k3": ["a", "c"]}
    assert _keys_in_several_shards([("a", _KeyList([])), ("b", _KeyList([]))]) == {}  # an index that did not read
    assert list(_KeyList(["x", "\udcff"])) == ["x", "\udcff"]  # a key that is not utf-8 survives
