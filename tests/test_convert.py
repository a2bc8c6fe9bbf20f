"""create_webdataset.py end to end: what it writes, that it is reproducible, resumable and honest
about bad input.

Outputs are read back with the stock tools (webdataset.WebDataset, GNU tar, Python's tarfile,
PIL), not with the project's own reader, so a writer bug cannot hide behind a matching reader bug.
"""

import hashlib
import io
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tarfile
import time
import zlib
from pathlib import Path

import crc32c
import numpy as np
import pytest
from PIL import Image

from conftest import (PYTHON, REPO, SAMPLES_PER_SHARD, SAMPLE_SIZE, convert, converted_ok, output_hashes, run_main,
                      run_script)
from imagenet_shards.cli.validate_dataset import main as validate_main
from reference_layout import folder_dirhash
from imagenet_shards.index import read_metadata
from imagenet_shards.index import read_sample_index
from imagenet_shards.preprocess import apply_steps, parse_steps

SPLIT_DIRS = {"train": "train", "validation": "validation"}


# ---------------------------------------------------------------- helpers


def assert_nothing_hidden_and_the_reference_checksum_matches(target: Path):
    """No hidden file or folder is left, and metadata.json's checksum is checksumdir's own dirhash of the folder
    (what the reference validate_dataset.py compares), also for a copy that skips hidden files."""
    assert [p.relative_to(target).as_posix() for p in target.rglob(".*")] == []
    assert folder_dirhash(target) == read_metadata(target)["checksum"]


def file_identities(directory: Path) -> dict:
    """(inode, mtime ns, size) of the folder and everything under it: a rewrite (atomic rename), a new or a
    removed file changes it."""
    return {p.relative_to(directory).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
            for p in [directory, *directory.rglob("*")]}


def convert_keeping_the_state(source: Path, folder: Path, copy: Path, *args) -> None:
    """Convert in-process with the CLI's arguments; `copy` receives every .convert-state/ file as it was
    before the conversion removed the state (the library's on_published hook runs after each record)."""
    import create_webdataset
    from imagenet_shards.convert.converter import convert as run_conversion
    from imagenet_shards.convert.plan import ConvertOptions

    parsed = create_webdataset.build_parser().parse_args(
        ["--source", str(source), "--target", str(folder), *map(str, args)])

    def copy_state(shard):
        shutil.copytree(folder / ".convert-state", copy / ".convert-state", dirs_exist_ok=True)

    run_conversion(ConvertOptions(
        source=parsed.source, target=folder, splits=tuple(parsed.splits), seed=parsed.seed,
        samples_per_shard=parsed.samples_per_shard, workers=parsed.workers, progress=False,
        on_published=copy_state))


def tar_samples(path: Path):
    """[(key, {ext: bytes})] read with Python's tarfile."""
    samples = []
    with tarfile.open(path) as archive:
        for member in archive.getmembers():
            key, ext = member.name.split(".", 1)
            if not samples or samples[-1][0] != key:
                samples.append((key, {}))
            samples[-1][1][ext] = archive.extractfile(member).read()
    return samples


def all_samples(directory: Path, split: str):
    return [s for shard in sorted(directory.glob(f"{split}-*.tar")) for s in tar_samples(shard)]


def class_index(source: Path, split_dir: str, class_name: str) -> int:
    return sorted(p.name for p in (source / "train").iterdir() if p.is_dir()).index(class_name)


def copy_folders(source: Path, destination: Path) -> Path:
    """A private copy of the folder layout, to damage."""
    for name in ("train", "validation"):
        shutil.copytree(source / name, destination / name)
    return destination


def first_image(folder: Path, split="train") -> Path:
    return sorted((folder / split).rglob("*.JPEG"))[0]


def png_bomb(side: int) -> bytes:
    """A real, valid PNG of side x side black pixels: ~300 KB on disk, side*side*3 bytes decoded."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    compressor = zlib.compressobj(1)
    row = bytes(1 + 3 * side)  # filter byte 0 + RGB zeros
    idat = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def session_processes(session_id: int):
    """Live processes of a session (from /proc), zombies excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[3]) == session_id:  # state, ..., session
                found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def quirk_source(tmp_path_factory):
    """The sample dataset with every quirk injected (both layouts)."""
    from imagenet_shards.sample import build_sample_dataset

    out = tmp_path_factory.mktemp("quirk-source")
    build_sample_dataset(out, classes=4, train_per_class=3, val_per_class=2, seed=1, quirks=True)
    return out


# ---------------------------------------------------------------- output format


def test_img_passthrough_is_standard_webdataset_byte_identical_to_the_source(converted, sample_source):
    import webdataset as wds

    target = converted("img")
    metadata = read_metadata(target)
    for split, per_class in (("train", SAMPLE_SIZE["train_per_class"]), ("validation", SAMPLE_SIZE["val_per_class"])):
        urls = [str(target / s["name"]) for s in metadata["splits"][split]["shards"]]
        seen = set()
        for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
            info = json.loads(sample["json"])
            source_file = sample_source / info["source"]
            assert info["converted"] == "passthrough"
            assert sample["jpg"] == source_file.read_bytes(), info["source"]
            class_name = source_file.parent.name
            assert info["class"] == class_name
            assert int(sample["cls"]) == class_index(sample_source, split, class_name) == metadata["classes"].index(class_name)
            assert sample["__key__"] == source_file.stem
            with Image.open(source_file) as image:
                assert (info["width"], info["height"]) == image.size
            seen.add(sample["__key__"])
        assert len(seen) == SAMPLE_SIZE["classes"] * per_class == metadata[f"{split}_length"]


def test_gnu_tar_lists_shards_with_fixed_owner_time_and_member_order(converted):
    target = converted("img")
    listing = subprocess.run(["tar", "--numeric-owner", "-tvf", str(target / "train-000000.tar")],
                             capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(listing) == 3 * SAMPLES_PER_SHARD
    for line in listing:
        mode, owner, _size, date, _time, _name = line.split(maxsplit=5)
        assert (mode, owner, date) == ("-rw-r--r--", "0/0", "1970-01-01")
    names = [line.split()[-1] for line in listing]
    assert [n.split(".", 1)[1] for n in names[:3]] == ["cls", "json", "jpg"]


def test_metadata_and_sample_index_describe_every_shard_and_sample(converted):
    target = converted("img")
    metadata = read_metadata(target)
    for key in ("train_length", "validation_length", "format", "shuffle", "train_transform_pipeline",
                "validation_transform_pipeline", "seed", "image_quality", "format_version", "classes",
                "tensor_layout", "splits"):
        assert key in metadata
    assert (metadata["format"], metadata["shuffle"], metadata["seed"], metadata["image_quality"]) == ("img", True, 0, 95)
    for split, entry in metadata["splits"].items():
        assert entry["source_samples"] == entry["length"] + len(entry["skipped"])
        for shard in entry["shards"]:
            data = (target / shard["name"]).read_bytes()
            assert (len(data), hashlib.sha256(data).hexdigest()) == (shard["bytes"], shard["sha256"])
        records = read_sample_index(target / entry["index"]["name"])
        assert len(records) == entry["length"]
        for record in records:
            data = (target / record.shard).read_bytes()
            payload = data[record.payload_offset: record.payload_offset + record.payload_size]
            assert crc32c.crc32c(payload) == record.payload_crc32c
            # The record range is a complete run of tar members: parse it alone.
            piece = data[record.record_offset: record.record_offset + record.record_size] + bytes(1024)
            with tarfile.open(fileobj=io.BytesIO(piece)) as archive:
                names = archive.getnames()
                assert names == [f"{record.key}.cls", f"{record.key}.json", f"{record.key}.jpg"]
                assert int(archive.extractfile(names[0]).read()) == record.label
            offsets = record.member_offsets()
            assert list(offsets) == ["cls", "json", "jpg"] and offsets["cls"] == record.record_offset


def test_tensor_pixels_equal_the_source_decoded_and_preprocessed(converted, sample_source):
    target = converted("tensor")
    metadata = read_metadata(target)
    assert metadata["tensor_layout"] == "HWC"
    expected_shape = {"train": (256, 256, 3), "validation": (224, 224, 3)}
    for split in ("train", "validation"):
        steps = parse_steps(metadata[f"{split}_transform_pipeline"])
        assert steps, "tensor format records the default steps it used"
        samples = all_samples(target, split)
        assert len(samples) == metadata[f"{split}_length"]
        for key, members in samples:
            array = np.load(io.BytesIO(members["npy"]), allow_pickle=False)
            assert array.dtype == np.uint8 and array.shape == expected_shape[split]
            info = json.loads(members["json"])
            with Image.open(sample_source / info["source"]) as image:
                expected = np.asarray(apply_steps(steps, image.convert("RGB")))
            assert np.array_equal(array, expected), key
            assert info["converted"] == "tensor" and info["steps"] == metadata[f"{split}_transform_pipeline"]


def test_archive_layout_gives_the_folder_layouts_samples_labels_and_order(converted, sample_source, tmp_path):
    folders = converted("img")
    archives = tmp_path / "from-archives"
    converted_ok(sample_source, archives, "--source-layout", "archive", "--samples-per-shard", SAMPLES_PER_SHARD,
                 "--seed", 0)
    metadata = read_metadata(archives)
    assert metadata["source_layout"] == "archive" and metadata["classes"] == read_metadata(folders)["classes"]
    for split in ("train", "validation"):
        from_folders = [(r.key, r.label, r.payload_crc32c) for r in read_sample_index(folders / f"samples-{split}.index.tsv")]
        from_archives = [(r.key, r.label, r.payload_crc32c) for r in read_sample_index(archives / f"samples-{split}.index.tsv")]
        assert from_archives == from_folders
    info = json.loads(all_samples(archives, "train")[0][1]["json"])
    assert info["source"].startswith("ILSVRC2012_img_train.tar:n") and ".tar:" in info["source"]


# ---------------------------------------------------------------- reproducibility


def test_workers_do_not_change_the_bytes_and_the_seed_changes_the_order(sample_source, tmp_path):
    common = ("--samples-per-shard", 5, "--train-preprocess-steps", "Resize(64)")
    converted_ok(sample_source, tmp_path / "w1", "--workers", 1, "--seed", 7, *common)
    converted_ok(sample_source, tmp_path / "w2", "--workers", 2, "--seed", 7, *common)
    one, two = output_hashes(tmp_path / "w1"), output_hashes(tmp_path / "w2")
    assert len(one) > 10 and one == two

    converted_ok(sample_source, tmp_path / "seed8", "--workers", 2, "--seed", 8, *common)
    keys7 = [r.key for r in read_sample_index(tmp_path / "w1" / "samples-train.index.tsv")]
    keys8 = [r.key for r in read_sample_index(tmp_path / "seed8" / "samples-train.index.tsv")]
    assert keys7 != keys8 and sorted(keys7) == sorted(keys8)
    # Shuffled: the first shard mixes classes (class-sorted order would not).
    labels = [r.label for r in read_sample_index(tmp_path / "w1" / "samples-train.index.tsv")]
    assert len(set(labels[:5])) > 1


def test_a_drawn_seed_is_recorded_and_reproduces_the_output(sample_source, tmp_path):
    converted_ok(sample_source, tmp_path / "drawn", "--splits", "validation")
    seed = read_metadata(tmp_path / "drawn")["seed"]
    assert isinstance(seed, int)
    converted_ok(sample_source, tmp_path / "again", "--splits", "validation", "--seed", seed)
    assert output_hashes(tmp_path / "drawn") == output_hashes(tmp_path / "again")


def test_no_shuffle_keeps_imagefolder_order(sample_source, tmp_path):
    converted_ok(sample_source, tmp_path, "--no-shuffle", "--splits", "train")
    records = read_sample_index(tmp_path / "samples-train.index.tsv")
    assert read_metadata(tmp_path)["shuffle"] is False
    expected = sorted((p.parent.name, p.name) for p in (sample_source / "train").rglob("*.JPEG"))
    assert [r.key for r in records] == [Path(name).stem for _, name in expected]


def test_max_shard_bytes_bounds_passthrough_shards(sample_source, tmp_path):
    limit = 200_000
    converted_ok(sample_source, tmp_path, "--splits", "train", "--seed", 0, "--max-shard-bytes", limit)
    shards = read_metadata(tmp_path)["splits"]["train"]["shards"]
    assert len(shards) > 36 // 1024 + 1
    for shard in shards:
        assert shard["bytes"] <= limit or shard["samples"] == 1, shard


# ---------------------------------------------------------------- crash safety and resume


def test_sigkill_then_resume_gives_the_uninterrupted_bytes(sample_source, tmp_path):
    # Upscaling to 1024 px makes each sample slow enough (tens of ms) to be killed mid-run.
    args = ("--samples-per-shard", 2, "--seed", 3, "--workers", 2, "--splits", "train",
            "--train-preprocess-steps", "Resize(1024)")
    reference = tmp_path / "reference"
    converted_ok(sample_source, reference, *args)

    target = tmp_path / "killed"
    command = [PYTHON, str(REPO / "create_webdataset.py"), "--source", str(sample_source), "--target", str(target),
               "--no-progress", *map(str, args)]
    process = subprocess.Popen(command, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state = target / ".convert-state"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(state.glob("train-*.json"))) < 3:
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)  # kill -9 of the main process only
    process.wait()
    assert process.returncode == -signal.SIGKILL
    # Its workers die with it (none lives on to publish a shard while the resume runs).
    deadline = time.monotonic() + 20
    while session_processes(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not session_processes(process.pid)
    finished = sorted(p.name for p in target.glob("train-*.tar"))
    assert 3 <= len(finished) < 18, "killed partway"
    assert not (target / "metadata.json").exists()
    for name in finished:  # nothing incomplete under a final name
        with tarfile.open(target / name) as archive:
            assert len(archive.getnames()) == 6

    refused = convert(sample_source, target, *args)
    assert refused.returncode == 2 and "--resume" in refused.stderr
    resumed = converted_ok(sample_source, target, *args, "--resume")
    assert "verified shards kept" in resumed.stdout
    assert output_hashes(target) == output_hashes(reference)
    assert not list(target.glob("*.partial"))
    assert_nothing_hidden_and_the_reference_checksum_matches(target)


def test_resume_rewrites_a_damaged_shard_and_removes_stale_ones(sample_source, tmp_path):
    args = ("--seed", 0, "--splits", "validation", "--samples-per-shard", 4)
    converted_ok(sample_source, tmp_path, *args)
    reference = output_hashes(tmp_path)
    damaged = tmp_path / "validation-000001.tar"
    data = bytearray(damaged.read_bytes())
    data[3000] ^= 0xFF
    damaged.write_bytes(bytes(data))
    (tmp_path / "validation-000042.tar").write_bytes(b"stale shard of an earlier run")
    (tmp_path / "validation-000000.tar.partial").write_bytes(b"half-written")
    result = converted_ok(sample_source, tmp_path, *args, "--resume")
    assert "2 verified shards kept" in result.stdout and "1 shards" in result.stdout
    assert output_hashes(tmp_path) == reference
    assert not (tmp_path / "validation-000042.tar").exists() and not list(tmp_path.glob("*.partial"))


def test_resume_with_other_options_is_refused_and_overwrite_replaces(sample_source, tmp_path):
    converted_ok(sample_source, tmp_path, "--seed", 0, "--splits", "validation")
    result = convert(sample_source, tmp_path, "--seed", 1, "--splits", "validation", "--resume")
    assert result.returncode == 2
    assert "other options" in result.stderr and "seed: 0 -> 1" in result.stderr
    (tmp_path / "notes.txt").write_text("the user's file")
    stale_repartition = tmp_path / "distributed" / "2-instances"
    stale_repartition.mkdir(parents=True)
    (stale_repartition / "manifest.json").write_text("{}")
    result = converted_ok(sample_source, tmp_path, "--seed", 1, "--splits", "validation", "--overwrite")
    assert read_metadata(tmp_path)["seed"] == 1
    assert (tmp_path / "notes.txt").read_text() == "the user's file" and "kept 1 entries" in result.stderr
    assert not (tmp_path / "distributed").exists() and "repartitioned the replaced dataset" in result.stderr


def test_two_instances_write_alternate_shards_and_the_last_writes_metadata(sample_source, tmp_path):
    args = ("--seed", 5, "--splits", "train", "--samples-per-shard", 4)
    converted_ok(sample_source, tmp_path / "single", *args)
    target = tmp_path / "multi"
    first = converted_ok(sample_source, target, *args, "--instance-index", 1, "--instance-count", 2)
    assert "not finished yet" in first.stdout and not (target / "metadata.json").exists()
    assert sorted(p.name for p in target.glob("*.tar")) == [f"train-{n:06d}.tar" for n in (1, 3, 5, 7)]
    second = converted_ok(sample_source, target, *args, "--instance-index", 0, "--instance-count", 2)
    assert "dataset complete" in second.stdout
    assert output_hashes(target) == output_hashes(tmp_path / "single")
    assert_nothing_hidden_and_the_reference_checksum_matches(target)
    # Run again (a restarted job), each instance finds the dataset complete and writes nothing.
    before = file_identities(target)
    for index in (1, 0):
        again = converted_ok(sample_source, target, *args, "--instance-index", index, "--instance-count", 2)
        assert "dataset complete" in again.stdout and "nothing written" in again.stdout
    assert file_identities(target) == before

    needs_seed = convert(sample_source, tmp_path / "noseed", "--instance-index", 0, "--instance-count", 2)
    assert needs_seed.returncode == 2 and "--seed is required" in needs_seed.stderr


def test_an_instance_finishing_after_its_peer_removed_the_state_reports_complete(sample_source, tmp_path):
    """Two instances can reach finalize together: the one that comes second (the flock makes it wait) finds
    the state removed and metadata.json of its plan written, and reports the dataset complete, writing
    nothing. (Without the flock, on a network mount, its records vanish under it: same answer.)"""
    from imagenet_shards.convert.plan import ConvertOptions, make_plan
    from imagenet_shards.convert.target_state import finalize
    from imagenet_shards.convert.imagenet_source import open_source
    from imagenet_shards.launcher import Instance

    args = ("--seed", 5, "--splits", "train", "--samples-per-shard", 4)
    for index in (0, 1):
        converted_ok(sample_source, tmp_path, *args, "--instance-index", index, "--instance-count", 2)
    assert not (tmp_path / ".convert-state").exists()
    before = file_identities(tmp_path)
    options = ConvertOptions(sample_source, tmp_path, splits=("train",), seed=5, samples_per_shard=4,
                             instance=Instance(0, 2, "test"), progress=False)
    plan = make_plan(options, open_source(sample_source, ("train",), "auto"), 5)
    metadata, missing = finalize(options, plan)
    assert missing == 0 and metadata == read_metadata(tmp_path)
    assert file_identities(tmp_path) == before


def test_two_instances_started_together_leave_the_single_instance_bytes(sample_source, tmp_path):
    args = ["--seed", 5, "--splits", "train", "--samples-per-shard", 4]
    converted_ok(sample_source, tmp_path / "single", *args)
    target = tmp_path / "multi"
    command = [PYTHON, str(REPO / "create_webdataset.py"), "--source", str(sample_source), "--target", str(target),
               "--no-progress", *map(str, args), "--instance-count", "2", "--instance-index"]
    processes = [subprocess.Popen(command + [str(index)], cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for index in (0, 1)]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    assert any("dataset complete" in out for out, _ in outputs), outputs
    assert output_hashes(target) == output_hashes(tmp_path / "single")
    assert_nothing_hidden_and_the_reference_checksum_matches(target)


def test_resume_of_a_complete_dataset_writes_nothing_and_other_options_are_refused(sample_source, tmp_path):
    args = ("--seed", 0, "--splits", "validation", "--samples-per-shard", 4)
    converted_ok(sample_source, tmp_path, *args)
    assert_nothing_hidden_and_the_reference_checksum_matches(tmp_path)
    assert read_metadata(tmp_path)["convert_state_removed"] is True
    before = file_identities(tmp_path)
    result = converted_ok(sample_source, tmp_path, *args, "--resume")
    assert "dataset complete" in result.stdout and "nothing written" in result.stdout, result.stdout
    # The seed is taken from metadata.json when not given, as it was from the state.
    result = converted_ok(sample_source, tmp_path, "--splits", "validation", "--samples-per-shard", 4, "--resume")
    assert "nothing written" in result.stdout
    refused = convert(sample_source, tmp_path, "--seed", 0, "--splits", "validation", "--samples-per-shard", 3,
                      "--resume")
    assert refused.returncode == 2 and "other options" in refused.stderr and "samples_per_shard: 4 -> 3" in refused.stderr
    assert file_identities(tmp_path) == before


def test_resume_of_a_complete_dataset_keeps_its_repartition_valid(sample_source, tmp_path):
    args = ("--seed", 0, "--splits", "validation", "--samples-per-shard", 4)
    converted_ok(sample_source, tmp_path, *args)
    repartitioned = run_script("distributed_webdataset.py", "--target", tmp_path, "--num-instances", 2, "--quiet")
    assert repartitioned.returncode == 0, repartitioned.stdout + repartitioned.stderr
    before = file_identities(tmp_path)
    assert "nothing written" in converted_ok(sample_source, tmp_path, *args, "--resume").stdout
    assert file_identities(tmp_path) == before
    report = run_main(validate_main, tmp_path)
    assert report.returncode == 0 and "warning:" not in report.stdout, report.stdout
    assert "distributed/" in report.stdout  # checked, and named in the checksum note
    assert "note: the reference folder checksum matches without distributed/" in report.stdout, report.stdout


def test_a_state_left_by_a_crash_after_metadata_is_named_by_the_validator_and_removed_by_resume(
        sample_source, tmp_path):
    """A crash between writing metadata.json and removing .convert-state/ leaves both: the reference checksum
    fails (checksumdir counts the hidden files), validate_dataset.py names the folder, --resume removes it."""
    args = ("--seed", 0, "--splits", "validation", "--samples-per-shard", 4, "--workers", 1)
    target, state = tmp_path / "target", tmp_path / "state"
    convert_keeping_the_state(sample_source, target, state, *args)
    assert not (target / ".convert-state").exists()
    shutil.copytree(state / ".convert-state", target / ".convert-state")  # as the crash left it
    assert folder_dirhash(target) != read_metadata(target)["checksum"]
    report = run_main(validate_main, target)
    assert report.returncode == 0, report.stdout + report.stderr
    assert re.search(r"warning: \.convert-state/: left by a conversion stopped after writing metadata\.json.*"
                     r"Dataset is corrupted.*--resume", report.stdout), report.stdout
    kept = {name: identity for name, identity in file_identities(target).items()
            if name not in (".", ".convert-state") and not name.startswith(".convert-state/")}
    resumed = converted_ok(sample_source, target, *args, "--resume")
    assert "dataset complete" in resumed.stdout and "removed the .convert-state/" in resumed.stdout
    assert {name: identity for name, identity in file_identities(target).items() if name != "."} == kept
    assert_nothing_hidden_and_the_reference_checksum_matches(target)
    report = run_main(validate_main, target)
    assert report.returncode == 0 and "warning:" not in report.stdout, report.stdout


def test_a_dataset_whose_checksum_counts_its_state_is_resumed_without_it(sample_source, tmp_path):
    """The earlier version kept .convert-state/ inside metadata.json's checksum: the validator says so, and
    --resume verifies every shard against its record, rewrites metadata.json without it and removes it."""
    from imagenet_shards.index import write_metadata

    args = ("--seed", 0, "--splits", "validation", "--samples-per-shard", 4, "--workers", 1)
    target, state = tmp_path / "target", tmp_path / "state"
    convert_keeping_the_state(sample_source, target, state, *args)
    shutil.copytree(state / ".convert-state", target / ".convert-state")
    earlier = read_metadata(target)
    del earlier["convert_state_removed"]
    earlier["checksum"] = folder_dirhash(target)
    write_metadata(target, earlier)
    report = run_main(validate_main, target)
    assert report.returncode == 0 and "warning:" not in report.stdout, report.stdout
    assert "note: metadata.json's checksum counts .convert-state/" in report.stdout, report.stdout
    # What upload_dataset.py's copy of it (hidden files skipped) did in the reference validator, named here.
    copy = tmp_path / "copy"
    shutil.copytree(target, copy, ignore=shutil.ignore_patterns(".*"))
    assert folder_dirhash(copy) != earlier["checksum"]
    report = run_script("validate_dataset.py", copy)
    assert re.search(r"warning: .*reference folder checksum .* differs .*likely cause: made by an earlier "
                     r"create_webdataset\.py, whose checksum counted its \.convert-state/", report.stdout), report.stdout
    resumed = converted_ok(sample_source, target, *args, "--resume")
    assert "3 verified shards kept" in resumed.stdout, resumed.stdout
    assert read_metadata(target)["convert_state_removed"] is True
    assert_nothing_hidden_and_the_reference_checksum_matches(target)


def test_the_validator_names_files_added_after_the_conversion_when_the_reference_checksum_differs(
        converted, tmp_path):
    dataset = tmp_path / "copy"
    shutil.copytree(converted("img"), dataset)
    clean = run_main(validate_main, dataset)
    assert clean.returncode == 0 and "reference folder checksum" not in clean.stdout, clean.stdout
    (dataset / "notes.txt").write_text("the user's file")
    report = run_main(validate_main, dataset)
    assert report.returncode == 0, report.stdout
    assert re.search(r"the reference folder checksum .* differs .*likely cause: files added after the conversion "
                     r"\(notes\.txt\)", report.stdout), report.stdout


# ---------------------------------------------------------------- quirks


def test_every_quirk_converts_and_is_recorded(quirk_source, tmp_path):
    quirks = json.loads((quirk_source / "quirks.json").read_text())
    assert {q["kind"] for q in quirks} == {"png_as_jpeg", "cmyk", "grayscale", "exif_rotated"}
    converted_ok(quirk_source, tmp_path / "img", "--seed", 0)
    converted_ok(quirk_source, tmp_path / "tensor", "--seed", 0, "--format", "tensor")
    for fmt in ("img", "tensor"):
        samples = {key: members for split in ("train", "validation")
                   for key, members in all_samples(tmp_path / fmt, split)}
        for quirk in quirks:
            members = samples[Path(quirk["name"]).stem]
            info = json.loads(members["json"])
            assert quirk["kind"] in info["quirks"], info
            source_file = quirk_source / quirk["folder_path"]
            if fmt == "tensor":
                assert info["converted"] == "tensor"
                with Image.open(source_file) as image:
                    expected = np.asarray(apply_steps(parse_steps(info["steps"]), image.convert("RGB")))
                assert np.array_equal(np.load(io.BytesIO(members["npy"])), expected)
            elif quirk["kind"] == "exif_rotated":
                # Recorded, not applied: the bytes are the source's, orientation tag and all.
                assert info["converted"] == "passthrough" and info["exif_orientation"] == 6
                assert info["exif_orientation_applied"] is False
                assert members["jpg"] == source_file.read_bytes()
            else:
                assert info["converted"] == "reencoded"
                with Image.open(io.BytesIO(members["jpg"])) as stored, Image.open(source_file) as original:
                    assert (stored.format, stored.mode, stored.size) == ("JPEG", "RGB", original.size)
                    assert info["source_mode"] == original.mode and info["source_format"] == original.format
                    difference = np.abs(np.asarray(stored, dtype=int) - np.asarray(original.convert("RGB"), dtype=int))
                    assert difference.mean() < 4  # the same picture, after one JPEG generation at quality 95


# ---------------------------------------------------------------- bad input


def test_corrupt_images_are_skipped_counted_and_listed(sample_source, tmp_path):
    source = copy_folders(sample_source, tmp_path / "source")
    truncated = first_image(source)
    truncated.write_bytes(truncated.read_bytes()[:5000])
    garbage = sorted((source / "validation").rglob("*.JPEG"))[0]
    garbage.write_bytes(b"this is not an image" * 100)
    (truncated.parent / "bomb.png").write_bytes(png_bomb(10_000))  # 100M pixels > PIL's 89M default
    (truncated.parent / "notes.txt").write_text("not an image")
    target = tmp_path / "out"
    result = converted_ok(source, target, "--seed", 0)
    rel = lambda p: p.relative_to(source).as_posix()  # noqa: E731
    assert f"skipped: {rel(truncated)}: truncated or corrupt JPEG" in result.stdout
    assert f"skipped: {rel(garbage)}: not an image PIL can read" in result.stdout
    assert "decompression bomb guard: 10000x10000 = 100000000 pixels" in result.stdout
    assert "1 files ignored as not images" in result.stdout
    metadata = read_metadata(target)
    train, validation = metadata["splits"]["train"], metadata["splits"]["validation"]
    assert {s["path"] for s in train["skipped"]} == {rel(truncated), rel(truncated.parent / "bomb.png")}
    assert train["source_samples"] == 37 and train["length"] == 35
    assert validation["skipped"] == [{"path": rel(garbage), "reason": validation["skipped"][0]["reason"]}]
    assert validation["source_samples"] == validation["length"] + 1 == 12
    assert train["ignored"] == [{"path": rel(truncated.parent / "notes.txt"), "reason": "not an image file extension"}]


def test_on_error_fail_stops_naming_the_file(sample_source, tmp_path):
    source = copy_folders(sample_source, tmp_path / "source")
    broken = first_image(source)
    broken.write_bytes(broken.read_bytes()[:3000])
    for workers in (1, 2):
        target = tmp_path / f"out{workers}"
        result = convert(source, target, "--on-error", "fail", "--workers", workers, "--seed", 0)
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"error: {broken.relative_to(source).as_posix()}: truncated or corrupt JPEG" in result.stderr
        assert not (target / "metadata.json").exists()
        assert not list(target.glob("*.partial"))


def test_a_tight_pixel_limit_guards_like_a_bomb(sample_source, tmp_path):
    result = convert(sample_source, tmp_path, "--splits", "validation", "--max-image-pixels", 1000,
                     "--on-error", "fail", "--seed", 0)
    assert result.returncode == 1
    assert "decompression bomb guard" in result.stderr and "exceeds the limit of 1000 (--max-image-pixels)" in result.stderr


def test_empty_class_folder_is_an_error_naming_it(sample_source, tmp_path):
    source = copy_folders(sample_source, tmp_path / "source")
    empty = source / "validation" / sorted(os.listdir(source / "validation"))[0]
    for image in empty.iterdir():
        image.unlink()
    result = convert(source, tmp_path / "out")
    assert result.returncode == 1
    assert f"error: {empty}: empty class folder" in result.stderr


@pytest.mark.parametrize("steps, expected", [
    (["Resize(256", "CenterCrop(224)"], "'Resize(256' does not parse"),
    (["Blur(3)"], "unknown preprocessing step 'Blur(3)'"),
    (["RandomResizedCrop(224)"], "'RandomResizedCrop(224)' is random"),
])
def test_unknown_step_is_a_usage_error_quoting_it(sample_source, tmp_path, steps, expected):
    result = convert(sample_source, tmp_path, "--train-preprocess-steps", *steps)
    assert result.returncode == 2
    assert "--train-preprocess-steps" in result.stderr and expected in result.stderr
    assert not tmp_path.joinpath("metadata.json").exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, expected", [
    (["--image-quality", "0"], "--image-quality: 0 must be at least 1"),
    (["--image-quality", "101"], "--image-quality: 101 is above 100"),
    (["--samples-per-shard", "0"], "--samples-per-shard: 0 must be at least 1"),
    (["--format", "png"], "invalid choice: 'png'"),
])
def test_bad_arguments_exit_2(sample_source, tmp_path, args, expected):
    result = convert(sample_source, tmp_path / "out", *args)
    assert result.returncode == 2 and expected in result.stderr


def test_missing_source_and_non_empty_target_are_usage_errors(sample_source, tmp_path):
    missing = tmp_path / "nowhere"
    result = convert(missing, tmp_path / "out")
    assert result.returncode == 2 and f"--source {missing} does not exist" in result.stderr
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "something").write_text("x")
    result = convert(sample_source, occupied)
    assert result.returncode == 2 and "is not empty" in result.stderr and "--resume" in result.stderr


def test_duplicate_keys_and_a_truncated_archive_are_errors(sample_source, tmp_path):
    source = copy_folders(sample_source, tmp_path / "source")
    classes = sorted(os.listdir(source / "train"))
    original = first_image(source)
    clash = source / "train" / classes[1] / original.name
    shutil.copy(original, clash)
    result = convert(source, tmp_path / "out1", "--splits", "train")
    assert result.returncode == 1
    assert "give the same sample key" in result.stderr and original.name in result.stderr

    archives = tmp_path / "archives"
    archives.mkdir()
    data = (sample_source / "ILSVRC2012_img_train.tar").read_bytes()
    (archives / "ILSVRC2012_img_train.tar").write_bytes(data[: len(data) // 2])
    result = convert(archives, tmp_path / "out2", "--splits", "train")
    assert result.returncode == 1
    assert "ILSVRC2012_img_train.tar" in result.stderr and "not a readable tar archive" in result.stderr


# ---------------------------------------------------------------- full disk

# What the converter prints when the disk fills, whichever file it was writing.
FULL_DISK = re.compile(r"^error: (?P<path>\S+): cannot write the (?P<what>.+?): the disk is full "
                       r"\(No space left on device\).*run again with --resume", re.MULTILINE)


@pytest.fixture
def small_disk(tmp_path):
    """small_disk(size) -> a fresh tmpfs of that size (mount needs root: skipped otherwise)."""
    mounted = []

    def mount(size):
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"mounting a tmpfs needs root: {result.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


class ReferenceConversion:
    """A conversion on a roomy disk: `folder` as it ends, and `written`, a folder holding a copy of every
    .convert-state/ file as it was before the conversion removed the state."""

    def __init__(self, folder: Path, written: Path):
        self.folder, self.written = folder, written

    def every_file(self) -> dict:
        """sha256 by relative path of every file the conversion wrote (the removed state included)."""
        return {**every_file(self.written), **every_file(self.folder)}

    def size(self, name: str) -> int:
        return (self.folder / name if (self.folder / name).exists() else self.written / name).stat().st_size


@pytest.fixture(scope="module")
def reference_conversion(sample_source, tmp_path_factory):
    """reference_conversion(*args) -> the ReferenceConversion of those arguments (cached). Run in-process:
    the library's on_published hook (called after each state record is written) copies the state."""
    cache = {}

    def reference(*args):
        if args not in cache:
            folder, written = tmp_path_factory.mktemp("full-disk-reference"), tmp_path_factory.mktemp("state-copy")
            convert_keeping_the_state(sample_source, folder, written, *args)
            cache[args] = ReferenceConversion(folder, written)
        return cache[args]

    return reference


def every_file(directory: Path) -> dict:
    """sha256 of every file under `directory` (state records and any .partial included), by relative path."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def assert_clean_full_disk_failure(result, target: Path, reference: ReferenceConversion) -> Path:
    """Exit 1 naming the file being written and saying the disk is full; nothing incomplete left.

    Returns the file the message names (relative to the target).
    """
    assert result.returncode == 1, result.stdout + result.stderr
    named = FULL_DISK.search(result.stderr)
    assert named, result.stderr
    failed = Path(named["path"])
    assert failed.is_relative_to(target), result.stderr
    failed = failed.relative_to(target)
    left = every_file(target)
    expected = reference.every_file()
    assert failed.as_posix() in expected, f"names a file the converter writes: {result.stderr}"
    assert not [name for name in left if name.endswith(".partial")], left
    # The run is deterministic: whatever has a final name is byte for byte the complete file.
    assert {name: digest for name, digest in left.items() if expected.get(name) != digest} == {}
    assert failed.as_posix() not in left and "metadata.json" not in left
    return failed


def fill_disk(disk: Path, room: int) -> Path:
    """Fill the tmpfs with a file that leaves exactly `room` bytes (whole pages) free; return it."""
    stat = os.statvfs(disk)
    free = stat.f_bavail * stat.f_frsize
    assert room % stat.f_frsize == 0 and room < free
    filler = disk / "filler"
    filler.write_bytes(bytes(free - room))
    stat = os.statvfs(disk)
    assert stat.f_bavail * stat.f_frsize == room
    return filler


def test_full_disk_fails_cleanly_naming_the_file(sample_source, small_disk, reference_conversion):
    """A disk that fills partway (here 1 MiB for ~1.9 MB of shards, two workers racing): whichever file
    was being written when it filled - a shard, a shard's state record - is named, and a --resume
    after freeing space finishes the job."""
    args = ("--seed", 0, "--splits", "train", "--samples-per-shard", 8, "--workers", 2)
    reference = reference_conversion(*args)
    disk = small_disk("1m")
    target = disk / "out"
    result = convert(sample_source, target, *args)
    assert_clean_full_disk_failure(result, target, reference)

    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # free space
    resumed = converted_ok(sample_source, target, *args, "--resume")
    assert "dataset complete" in resumed.stdout
    assert every_file(target) == every_file(reference.folder)  # no .convert-state/ left


def _pages(size: int, page: int) -> int:
    return -(-size // page) * page


# Validation split, 2 shards, one worker: the files are written in this order.
WRITE_ORDER = ["validation-000000.tar", ".convert-state/validation-000000.tar.json",
               "validation-000001.tar", ".convert-state/validation-000001.tar.json",
               "samples-validation.index.tsv", "metadata.json"]


@pytest.mark.parametrize("fills_in, what", [
    ("validation-000001.tar", "shard"),
    (".convert-state/validation-000000.tar.json", "state record of validation-000000.tar"),
    ("samples-validation.index.tsv", "validation sample index"),
    ("metadata.json", "metadata"),
])
def test_full_disk_during_each_kind_of_write(sample_source, small_disk, reference_conversion, fills_in, what):
    """The disk fills exactly while `fills_in` is written: room is left for every file written before it
    (sizes from a reference run, in whole tmpfs pages) and, for a shard, for half of it."""
    args = ("--seed", 0, "--splits", "validation", "--samples-per-shard", 8, "--workers", 1)
    reference = reference_conversion(*args)
    assert sorted(reference.every_file()) == sorted(WRITE_ORDER + [".convert-state/plan.json"])
    assert sorted(every_file(reference.folder)) == sorted(n for n in WRITE_ORDER if not n.startswith(".convert-state"))
    disk = small_disk("4m")
    page = os.statvfs(disk).f_frsize
    before = [".convert-state/plan.json"] + WRITE_ORDER[: WRITE_ORDER.index(fills_in)]
    room = sum(_pages(reference.size(name), page) for name in before)
    if fills_in.endswith(".tar"):  # fill in the middle of the shard, not at its first byte
        room += _pages(reference.size(fills_in) // 2, page)
    filler = fill_disk(disk, room)
    target = disk / "out"
    result = convert(sample_source, target, *args)
    failed = assert_clean_full_disk_failure(result, target, reference)
    assert failed.as_posix() == fills_in and FULL_DISK.search(result.stderr)["what"] == what
    assert sorted(every_file(target)) == sorted(before)  # everything written before it is kept

    filler.unlink()  # free space
    resumed = converted_ok(sample_source, target, *args, "--resume")
    assert every_file(target) == every_file(reference.folder)  # the state is removed once metadata.json is written
    kept = WRITE_ORDER.index(fills_in) // 2  # shards whose file and record were both written
    assert (f"{kept} verified shards kept" in resumed.stdout) == (kept > 0), resumed.stdout


def test_fast_tar_member_header_is_byte_identical_to_tarfiles():
    """imagenet_shards.formats.tar.member_header patches a template (the converter's hot path): same bytes as tarfile."""
    import random

    from imagenet_shards.formats.tar import _tarfile_member_header, member_header

    rng = random.Random(0)
    for _ in range(3000):
        name = "".join(rng.choice("abz_019./é") for _ in range(rng.randint(1, 110))) + rng.choice([".jpg", ".cls"])
        size = rng.choice([0, 1, 511, 512, rng.randint(0, 10**10), 8**11 - 1, 8**11, 8**12])
        assert member_header(name, size) == _tarfile_member_header(name, size), (name, size)


def test_a_shard_whose_record_failed_is_not_recorded_again_while_stopping(tmp_path):
    """run_in_pool: when recording one finished shard fails (its state record hit a full disk), the
    shards still running are recorded while stopping - but not the failed one a second time: a retry
    that succeeds once space is freed would leave the error naming a file that is there, complete."""
    from concurrent.futures import ProcessPoolExecutor

    from imagenet_shards.convert.converter import run_in_pool
    from imagenet_shards.convert.encode import EncodeOptions, ShardToWrite
    from imagenet_shards.convert.failures import WriteFailure

    encode = EncodeOptions("img", (), 95, 10**8, "fail")
    tasks = [ShardToWrite("train", n, f"train-{n:06d}.tar", (), encode) for n in range(4)]
    calls = []

    def record(result):
        calls.append(result.number)
        if len(calls) == 1:
            raise WriteFailure(tmp_path / f"{result.shard.name}.json", "cannot write the state record: disk full")

    with ProcessPoolExecutor(max_workers=2) as executor, pytest.raises(WriteFailure):
        run_in_pool(executor, str(tmp_path), tasks, record)
    assert len(calls) == len(set(calls)), calls
