"""Datasets of the reference harness (Graphcore's PyTorch CNN tooling) here, and ours in its tools.

The reference datasets are written by tests/reference_layout.py, a small writer made from the
layout's description (not from the reference code), with a real checksumdir-style md5 dirhash.
"""

import io
import json
import os
import tarfile
import warnings
from pathlib import Path

import pytest
import torch

from conftest import flip_byte, run_main, run_script, run_scripts
from imagenet_shards.cli.validate_dataset import main as validate_main
from reference_layout import folder_dirhash, write_reference_dataset, write_tar
from imagenet_shards.index import read_metadata, sample_index_name
from imagenet_shards.index import read_sample_index

SAMPLES_PER_SHARD = 8


@pytest.fixture(scope="module")
def reference(tmp_path_factory, sample_source):
    """reference(fmt) -> a fresh copy of a reference-made dataset of the sample source."""
    made = {}

    def make(fmt="img"):
        if fmt not in made:
            made[fmt] = tmp_path_factory.mktemp(f"reference-{fmt}")
            write_reference_dataset(sample_source, made[fmt], fmt, SAMPLES_PER_SHARD)
        copy = tmp_path_factory.mktemp(f"copy-{fmt}")
        for path in made[fmt].iterdir():
            (copy / path.name).write_bytes(path.read_bytes())
        return copy

    return make


def shard_payload_offset(shard, ext):
    """Offset of the first `ext` member's data in a tar shard."""
    with tarfile.open(shard) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("." + ext))
        return member.offset_data


@pytest.mark.parametrize("fmt", ["img", "tensor"])
def test_a_reference_dataset_validates_and_one_flipped_byte_fails_it(reference, fmt):
    dataset = reference(fmt)
    result = run_script("validate_dataset.py", dataset, "--deep")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("Dataset OK.")

    shard = dataset / "train-000001.tar"
    flip_byte(shard, shard_payload_offset(shard, "jpg" if fmt == "img" else "pth") + 700, mask=0x01)
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("Dataset is corrupted.")
    assert "cannot name the file" in result.stdout


def test_the_shard_walk_names_a_damaged_member_the_checksum_cannot(reference):
    dataset = reference("img")
    shard = dataset / "validation-000000.tar"
    with tarfile.open(shard) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    members = [(name, data) for name, data in members if name != "3.json"]  # one sample loses its json
    write_tar(shard, members)
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 1
    assert "validation-000000.tar [3]: members .cls, .jpg; a reference img sample holds .cls, .jpg, .json" in result.stdout


def test_counts_are_checked_against_the_metadata(reference):
    dataset = reference("img")
    metadata = json.loads((dataset / "metadata.json").read_text())
    metadata["train_length"] += 1
    (dataset / "metadata.json").write_text(json.dumps(metadata))  # metadata.json is outside the checksum
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 1
    assert f"train: 36 samples in 5 shards, metadata.json says train_length={metadata['train_length']}" in result.stdout


@pytest.mark.parametrize("fmt", ["img", "tensor"])
def test_adopt_writes_indexes_without_changing_a_shard_and_the_dataset_becomes_first_class(reference, fmt):
    dataset = reference(fmt)
    shards = {p.name: p.read_bytes() for p in dataset.glob("*.tar")}
    result = run_main(validate_main, dataset, "--adopt")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "adopted: wrote" in result.stdout
    assert {p.name: p.read_bytes() for p in dataset.glob("*.tar")} == shards
    metadata = read_metadata(dataset)
    assert metadata["train_length"] == 36 and metadata["validation_length"] == 12
    assert metadata["checksum"] == folder_dirhash(dataset)  # the reference validator still accepts it
    assert len(read_sample_index(dataset / sample_index_name("train"))) == 36
    assert not [p for p in os.listdir(dataset) if p.startswith(("train", "validation")) and not p.endswith(".tar")]

    result = run_main(validate_main, dataset, "--deep")
    assert result.returncode == 0, result.stdout + result.stderr
    # From now on a damaged sample is named.
    shard = dataset / "train-000002.tar"
    flip_byte(shard, shard_payload_offset(shard, "jpg" if fmt == "img" else "pth") + 700, mask=0x01)
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 1
    assert "train-000002.tar [16]" in result.stdout


def test_adopt_refuses_a_damaged_dataset_and_writes_nothing(reference):
    dataset = reference("img")
    flip_byte(dataset / "train-000000.tar", 2000, mask=0x01)
    before = sorted(os.listdir(dataset))
    result = run_script("validate_dataset.py", dataset, "--adopt")
    assert result.returncode == 1
    assert "not adopted" in result.stdout
    assert sorted(os.listdir(dataset)) == before


def test_adopt_is_a_usage_error_on_our_own_datasets(converted):
    result = run_script("validate_dataset.py", converted("img"), "--adopt")
    assert result.returncode == 2 and "--adopt is for datasets made by the reference harness" in result.stderr


class _CreatesAFile:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_malicious_pth_is_refused_without_running_it(tmp_path):
    from imagenet_shards.reference.pth import PthFormatError, decode_pth

    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save(_CreatesAFile(str(marker)), buffer)
    with pytest.raises(PthFormatError, match="refused, not unpickled"):
        decode_pth(buffer.getvalue())
    assert not marker.exists()


@pytest.mark.parametrize("value, message", [
    (torch.zeros(3, 4, 5), "dtype float32, expected uint8"),
    (torch.zeros(4, 4, 5, dtype=torch.uint8), r"shape \(4, 4, 5\), expected 3xHxW"),
    (torch.zeros(3, 4, dtype=torch.uint8), r"shape \(3, 4\)"),
    ({"image": torch.zeros(3, 4, 5, dtype=torch.uint8)}, "holds a dict"),
])
def test_a_pth_that_is_not_a_plain_uint8_chw_tensor_is_named(value, message):
    from imagenet_shards.reference.pth import PthFormatError, decode_pth

    buffer = io.BytesIO()
    torch.save(value, buffer)
    with pytest.raises(PthFormatError, match=message):
        decode_pth(buffer.getvalue())


def test_deep_validation_names_a_malicious_pth_sample(reference, tmp_path):
    dataset = reference("tensor")
    marker = tmp_path / "pwned"
    shard = dataset / "validation-000001.tar"
    with tarfile.open(shard) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    buffer = io.BytesIO()
    torch.save(_CreatesAFile(str(marker)), buffer)
    members = [(name, buffer.getvalue() if name == "9.pth" else data) for name, data in members]
    write_tar(shard, members)
    result = run_script("validate_dataset.py", dataset, "--deep")
    assert result.returncode == 1
    assert "validation-000001.tar [9]: .pth payload refused, not unpickled" in result.stdout
    assert not marker.exists()


# ------------------------------------------------------------------ ours, in the reference's tools


def test_our_img_output_carries_the_reference_checksum_bbox_and_no_side_file_named_like_a_split(converted):
    dataset = converted("img")
    metadata = json.loads((dataset / "metadata.json").read_text())
    assert metadata["checksum"] == folder_dirhash(dataset)
    for name in os.listdir(dataset):
        if name.startswith(("train", "validation")):
            assert name.endswith(".tar") and name[-10:-4].isdigit(), name  # what the reference loader lists
    with tarfile.open(dataset / "train-000000.tar") as tar:
        infos = [json.loads(tar.extractfile(m).read()) for m in tar.getmembers() if m.name.endswith(".json")]
    assert infos and all("bbox" in info for info in infos)


# ------------------------------------------------------------------ the loader


def at_32_px(split: str):
    """The split's recipe at 32 px (small images: quick tests)."""
    from imagenet_shards.loader import TrainCrop, ValidationCrop

    return TrainCrop(image_size=32) if split == "train" else ValidationCrop(image_size=32)


def loaded_keys(source, split, workers=0, **options):
    from imagenet_shards.loader import get_data

    loader = get_data(str(source), split, batch_size=5, workers=workers, with_keys=True, transform=at_32_px(split),
                      **options)
    keys = [key for batch in loader for key in batch.keys]
    return keys, loader.report


@pytest.mark.parametrize("fmt", ["img", "tensor"])
@pytest.mark.parametrize("adopted", [False, True])
def test_the_loader_reads_reference_datasets_every_validation_sample_once(reference, fmt, adopted):
    dataset = reference(fmt)
    if adopted:
        assert run_main(validate_main, dataset, "--adopt").returncode == 0
        keys, report = loaded_keys(dataset, "validation", workers=2)
    else:
        with pytest.warns(UserWarning, match="made by the reference harness"):
            keys, report = loaded_keys(dataset, "validation", workers=2)
    assert sorted(keys, key=int) == [str(n) for n in range(12)]
    assert not report.skipped
    keys, report = loaded_keys(dataset, "train")
    assert len(keys) == 35 and len(set(keys)) == 35 and not report.skipped  # drop_last: 7 batches of 5


def _replace_payloads(shard, make_payload):
    with tarfile.open(shard) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    write_tar(shard, [(name, make_payload(name) if name.endswith(".pth") else data) for name, data in members])


def _torch_bytes(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_a_bad_pth_is_a_named_per_sample_error_and_a_malicious_one_does_not_run(reference, tmp_path):
    from imagenet_shards.loader.image_loader import SampleError

    dataset = reference("tensor")
    marker = tmp_path / "pwned"
    bad = {"0.pth": _torch_bytes(torch.zeros(3, 32, 32)), "1.pth": _torch_bytes(_CreatesAFile(str(marker)))}
    _replace_payloads(dataset / "validation-000000.tar", lambda name: bad.get(name) or _torch_bytes(
        torch.zeros(3, 32, 32, dtype=torch.uint8)))
    with pytest.warns(UserWarning):
        keys, report = loaded_keys(dataset, "validation")
    assert sorted(keys, key=int) == [str(n) for n in range(2, 12)]
    reasons = {s.key: s.reason for s in report.skipped}
    assert "dtype float32, expected uint8" in reasons["0"] and "refused, not unpickled" in reasons["1"]
    assert not marker.exists()
    with pytest.raises(SampleError, match="sample '0'.*dtype float32"):
        loaded_keys(dataset, "validation", on_error="fail")


@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_split_in_which_every_sample_fails_raises(reference, split):
    from imagenet_shards.loader.image_loader import SampleError

    dataset = reference("tensor")
    for shard in dataset.glob(f"{split}-*.tar"):
        _replace_payloads(shard, lambda name: _torch_bytes(torch.zeros(3, 32, 32)))
    with pytest.raises(SampleError, match="every sample"):
        loaded_keys(dataset, split)


# ------------------------------------------------------------------ host_benchmark.py

BENCH = ("--batch-size", 4, "--dataloader-worker", 1, "--iterations", 1, "--warmup-batches", 1)


@pytest.mark.parametrize("fmt, split", [("img", "train"), ("tensor", "validation")])
def test_host_benchmark_measures_a_reference_dataset_under_data_imagenet(reference, fmt, split):
    result = run_script("host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", reference(fmt),
                        "--split", split, *BENCH)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput of the iteration:" in result.stdout
    notices = [line for line in result.stderr.splitlines() if "made by the reference harness" in line]
    assert len(notices) == 1 and notices[0].startswith("host_benchmark: warning: "), result.stderr  # once, not also logged


def test_host_benchmark_data_imagenet_detects_ours_and_a_folder_and_accepts_synthetic(converted, sample_source):
    *detected, synthetic = run_scripts(
        *(("host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", path, *BENCH)
          for path in (converted("img"), sample_source)),
        ("host_benchmark.py", "--data", "synthetic", "--batches", 2, *BENCH))
    for result in detected:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Throughput of the iteration:" in result.stdout
    assert synthetic.returncode == 0 and "Throughput of the iteration:" in synthetic.stdout


def test_host_benchmark_reference_options(reference):
    dataset = reference("img")
    result, too_large = run_scripts(
        ("host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", dataset, "--dataloader-rebatch-size", 2,
         "--webdataset-percentage-to-use", 40, "--webdataset-memory-cache-ratio", 0.5, *BENCH),
        ("host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", dataset, "--dataloader-rebatch-size", 8,
         *BENCH))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the first 2 of 5 train shards" in result.stdout  # ceil(40% of 5)
    assert "1 of 2 shards" in result.stdout
    assert "12 images in" in result.stdout  # 16 samples in batches of 4 (joined from pairs), 1 warm-up batch
    assert too_large.returncode == 2 and "larger than --batch-size" in too_large.stderr


def test_host_benchmark_bad_input_is_one_line_never_a_traceback(tmp_path, reference):
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "train-000000.tar").write_bytes(os.urandom(5000))
    truncated = reference("img")
    shard = truncated / "train-000002.tar"
    shard.write_bytes(shard.read_bytes()[:20000])
    cases = ((garbage, 1), (garbage / "train-000000.tar", 1), (truncated, 1), (tmp_path / "missing", 2))
    results = run_scripts(*(("host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", path, *BENCH)
                            for path, _ in cases))
    for (path, code), result in zip(cases, results):
        assert result.returncode == code, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        if code == 1:
            errors = [line for line in result.stderr.splitlines()
                      if line.startswith("host_benchmark: ") and not line.startswith("host_benchmark: warning: ")]
            assert len(errors) == 1, result.stderr
        else:
            assert result.stderr.splitlines()[-1].startswith("host_benchmark.py: error: "), result.stderr


# ------------------------------------------------------------------ repartition


@pytest.mark.parametrize("fmt", ["img", "tensor"])
def test_distributed_webdataset_adopts_a_reference_dataset_then_repartitions_it(reference, fmt):
    from imagenet_shards.loader import get_data

    dataset = reference(fmt)
    shards = {p.name: p.read_bytes() for p in dataset.glob("*.tar")}
    dry = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 2, "--dry-run")
    assert dry.returncode == 0 and "dry run: nothing written" in dry.stdout
    assert sorted(p.name for p in dataset.iterdir()) == sorted([*shards, "metadata.json"])
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 2)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "adopted: wrote" in result.stdout
    assert {p.name: p.read_bytes() for p in dataset.glob("*.tar")} == shards
    result = run_main(validate_main, dataset)
    assert result.returncode == 0, result.stdout + result.stderr
    keys = []
    for instance in (0, 1):
        loader = get_data(str(dataset), "validation", batch_size=4, instance=(instance, 2), with_keys=True,
                          transform=at_32_px("validation"))
        keys += [key for batch in loader for key in batch.keys]
        assert loader.report.repartition is not None  # read through the repartition
    assert sorted(keys, key=int) == [str(n) for n in range(12)]


def test_distributed_webdataset_refuses_a_damaged_reference_dataset(reference):
    dataset = reference("img")
    flip_byte(dataset / "train-000003.tar", 4000, mask=0x01)
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 2)
    assert result.returncode == 1
    assert "folder checksum" in result.stderr and "not adopted, not repartitioned" in result.stderr
    assert not (dataset / "distributed").exists() and not list(dataset.glob("*.index.tsv"))


# ------------------------------------------------------------------ ours, read the reference's way


def test_our_img_output_reads_the_way_the_reference_loader_reads_it(converted):
    """The reference loader lists names starting with the split name, takes characters [-10:-4]
    as shard numbers, expands `<split>-{first..last}.tar`, decodes with webdataset and reads
    json["bbox"] unconditionally."""
    import braceexpand
    import webdataset

    dataset = converted("img")
    for split, length in (("train", 36), ("validation", 12)):
        numbers = sorted(name[-10:-4] for name in os.listdir(dataset) if name.startswith(split))
        urls = list(braceexpand.braceexpand(str(dataset / f"{split}-{{{numbers[0]}..{numbers[-1]}}}.tar")))
        samples = list(webdataset.WebDataset(urls, shardshuffle=False, empty_check=False).decode("pil")
                       .to_tuple("jpg;png", "cls", "json"))
        assert len(samples) == length == json.loads((dataset / "metadata.json").read_text())[f"{split}_length"]
        assert all(info["bbox"] is None and image.size[0] > 0 for image, _, info in samples)


@pytest.mark.parametrize("instances", [2, 3])
def test_our_img_repartition_reads_the_way_the_reference_loader_reads_it(converted, tmp_path, instances):
    """Under N > 1 instances the reference loader sorts the split's shards, deals all but the last r
    out whole (r = S mod N, or N when 0) and gives instance i distributed/<N>-instances/<split>-<i:06d>.tar,
    which must hold its share of the last r shards' samples: every instance then reads T//N samples
    (one more for the first T mod N) and the split is read once over all instances."""
    import shutil

    import webdataset

    dataset = tmp_path / "img"
    shutil.copytree(converted("img"), dataset)
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", instances)
    assert result.returncode == 0, result.stdout + result.stderr

    def keys(urls):
        if not urls:
            return []
        return [key for key, info in webdataset.WebDataset([str(u) for u in urls], shardshuffle=False,
                                                           empty_check=False).to_tuple("__key__", "json")
                if "bbox" in json.loads(info)]

    folder = dataset / "distributed" / f"{instances}-instances"
    for split, length in (("train", 36), ("validation", 12)):
        shards = sorted(p for p in dataset.iterdir() if p.name.startswith(split) and p.name.endswith(".tar"))
        last = len(shards) % instances or instances
        whole = shards[: len(shards) - last]
        read = keys(whole)
        for instance in range(instances):
            remainder = keys([folder / f"{split}-{instance:06d}.tar"])
            per_instance = len(whole) // instances * 8 + len(remainder)  # whole shards hold 8 samples each
            assert per_instance == length // instances + (1 if instance < length % instances else 0)
            read += remainder
        assert sorted(read) == sorted(r.key for r in read_sample_index(dataset / sample_index_name(split)))

    result = run_main(validate_main, dataset)
    assert result.returncode == 0 and "0 warnings" in result.stdout, result.stdout + result.stderr
    remainder = folder / "validation-000001.tar"
    flip_byte(remainder, shard_payload_offset(remainder, "jpg") + 100, mask=0x01)
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 1 and f"distributed/{instances}-instances/validation-000001.tar" in result.stdout


def test_a_dataset_with_the_earlier_index_name_still_loads_and_validates(converted, tmp_path):
    from imagenet_shards.loader import get_data

    dataset = tmp_path / "earlier"
    dataset.mkdir()
    for path in converted("img").iterdir():
        if path.is_file():
            (dataset / path.name).write_bytes(path.read_bytes())
    metadata = json.loads((dataset / "metadata.json").read_text())
    for split, entry in metadata["splits"].items():
        (dataset / entry["index"]["name"]).rename(dataset / f"{split}.index.tsv")
        entry["index"]["name"] = f"{split}.index.tsv"
    metadata.pop("metadata_digest")  # the earlier version recorded none
    (dataset / "metadata.json").write_text(json.dumps(metadata))
    result = run_main(validate_main, dataset)
    assert result.returncode == 0, result.stdout + result.stderr
    loader = get_data(str(dataset), "validation", batch_size=4, with_keys=True, transform=at_32_px("validation"))
    assert len({key for batch in loader for key in batch.keys}) == 12


# ------------------------------------------------------------------ bounding boxes


def test_bbox_crop_prefers_crops_overlapping_the_box_with_x_and_y_extents_kept_apart():
    import random

    from imagenet_shards.loader.transform.pipeline import bbox_crop_box, random_resized_crop_box

    width, height, scale, ratio = 400, 300, (0.08, 1.0), (3 / 4, 4 / 3)
    bbox = [0.0, 0.8, 1.0, 1.0]  # a wide strip along the bottom: x extent 400 px, y extent 60 px

    def overlap(box):
        top, left, h, w = box
        ow = min(left + w, bbox[2] * width) - max(left, bbox[0] * width)
        oh = min(top + h, bbox[3] * height) - max(top, bbox[1] * height)
        return max(ow, 0) * max(oh, 0) / (w * h)

    plain = [overlap(random_resized_crop_box(width, height, scale, ratio, random.Random(n))) for n in range(400)]
    steered = [overlap(bbox_crop_box(width, height, scale, ratio, random.Random(n), bbox)) for n in range(400)]
    assert sum(o >= 0.1 for o in steered) > 0.9 * 400 > 1.5 * sum(o >= 0.1 for o in plain)
    for n in range(200):  # the first of up to 10 draws that overlaps by >= 0.1, else the 10th
        rng, replay = random.Random(n), random.Random(n)
        chosen = bbox_crop_box(width, height, scale, ratio, rng, bbox)
        draws = [random_resized_crop_box(width, height, scale, ratio, replay) for _ in range(10)]
        expected = next((box for box in draws if overlap(box) >= 0.1), draws[-1])
        assert chosen == expected


def test_the_converter_stores_the_union_of_each_train_images_boxes(sample_source, tmp_path):
    source = tmp_path / "source"
    for split in ("train", "validation"):
        for path in (sample_source / split).rglob("*"):
            if path.is_file():
                (source / path.relative_to(sample_source)).parent.mkdir(parents=True, exist_ok=True)
                (source / path.relative_to(sample_source)).write_bytes(path.read_bytes())
    images = sorted(p for p in (source / "train").rglob("*") if p.is_file())
    rows = [f"{images[0].name},0.1,0.2,0.3,0.4", f"{images[0].name},0.2,0.1,0.5,0.3",
            f"{images[1].name},0.0,0.0,1.0,1.0"]
    (source / "imagenet_2012_bounding_boxes.csv").write_text("\n".join(rows) + "\n")
    target = tmp_path / "img"
    result = run_script("create_webdataset.py", "--source", source, "--target", target, "--format", "img",
                        "--samples-per-shard", SAMPLES_PER_SHARD, "--seed", 0)
    assert result.returncode == 0, result.stdout + result.stderr
    boxes = {}
    for shard in target.glob("train-*.tar"):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    info = json.loads(tar.extractfile(member).read())
                    boxes[info["source"].rsplit("/", 1)[-1]] = info["bbox"]
    assert boxes[images[0].name] == [0.1, 0.1, 0.5, 0.4]
    assert boxes[images[1].name] == [0.0, 0.0, 1.0, 1.0]
    assert sum(box is not None for box in boxes.values()) == 2 and len(boxes) == 36
    assert json.loads((target / "metadata.json").read_text())["checksum"] == folder_dirhash(target)


@pytest.mark.parametrize("adopted", [False, True])
def test_use_bbox_info_steers_the_crops_of_samples_with_a_box(sample_source, tmp_path, adopted):
    """Without boxes the option changes nothing; with a box on every sample the crops change
    (which crop is chosen is tested above)."""
    from imagenet_shards.loader import DataSource, get_data

    stems = [path.stem for path, _ in __import__("reference_layout").list_images(sample_source / "train")]
    with_boxes, without = tmp_path / "boxes", tmp_path / "none"
    write_reference_dataset(sample_source, with_boxes, "img", SAMPLES_PER_SHARD,
                            bboxes={stem: [0.0, 0.8, 1.0, 1.0] for stem in stems})  # a strip along the bottom
    write_reference_dataset(sample_source, without, "img", SAMPLES_PER_SHARD)
    if adopted:
        for dataset in (with_boxes, without):
            assert run_main(validate_main, dataset, "--adopt").returncode == 0

    def crops(dataset, use_bbox_info):
        loader = get_data(DataSource(str(dataset), use_bbox_info=use_bbox_info), "train", batch_size=4, with_keys=True,
                          transform=at_32_px("train"), seed=3)
        return {key: image for batch in loader for key, image in zip(batch.keys, batch.images)}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain, steered = crops(without, False), crops(without, True)
        assert plain.keys() == steered.keys() and all(torch.equal(plain[k], steered[k]) for k in plain)
        plain, steered = crops(with_boxes, False), crops(with_boxes, True)
    assert plain.keys() == steered.keys()
    assert sum(not torch.equal(plain[k], steered[k]) for k in plain) > len(plain) // 2


def test_a_repartition_made_by_the_reference_harness_is_named_as_such(reference):
    dataset = reference("img")
    folder = dataset / "distributed" / "2-instances"
    folder.mkdir(parents=True)
    for instance in (0, 1):  # the reference's layout: distributed/<N>-instances/<split>-<i>.tar
        (folder / f"train-{instance:06d}.tar").write_bytes((dataset / f"train-00000{instance + 3}.tar").read_bytes())
    result = run_script("validate_dataset.py", dataset, "--adopt")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "matches without distributed/" in result.stdout
    result = run_script("validate_dataset.py", dataset)
    assert result.returncode == 0
    assert "distributed/2-instances: a repartition made by the reference harness" in result.stdout


def test_two_instances_share_a_reference_validation_split_every_sample_once(reference):
    dataset = reference("tensor")
    keys = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for instance in (0, 1):
            instance_keys, report = loaded_keys(dataset, "validation", instance=(instance, 2))
            keys += instance_keys
            assert not report.skipped
    assert sorted(keys, key=int) == [str(n) for n in range(12)]


def test_resume_replaces_the_earlier_index_name(sample_source, tmp_path):
    target = tmp_path / "img"
    args = ("--source", sample_source, "--target", target, "--format", "img", "--samples-per-shard",
            SAMPLES_PER_SHARD, "--seed", 0)
    assert run_script("create_webdataset.py", *args).returncode == 0
    (target / sample_index_name("train")).rename(target / "train.index.tsv")  # as the earlier version named it
    result = run_script("create_webdataset.py", *args, "--resume")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (target / "train.index.tsv").exists() and (target / sample_index_name("train")).is_file()
    assert json.loads((target / "metadata.json").read_text())["checksum"] == folder_dirhash(target)
    assert run_main(validate_main, target).returncode == 0
