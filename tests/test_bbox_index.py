"""Bounding boxes in the sample index (the bbox column): written by the converter for every format,
kept by repartition, filled by --adopt, checked against the sample json by the validator, and read by
the loader's use_bbox_info instead of each sample's json member."""

import hashlib
import json
import shutil
import warnings

import pytest
import torch

from conftest import SAMPLES_PER_SHARD, run_main, run_script
from imagenet_shards.cli.validate_dataset import main as validate_main
from reference_layout import folder_dirhash, list_images, write_reference_dataset
from imagenet_shards.formats import format_names
from imagenet_shards.index import SampleRecord, bbox_text, encode_sample_index, parse_bbox, read_metadata, write_metadata
import imagenet_shards.formats.webdataset as tar_format  # where the tar formats read a json member (mapped_rows)
from imagenet_shards.loader import DataSource, TrainCrop, get_data
from imagenet_shards.index import check_columns_match, columns_from_records, parse_sample_columns, read_sample_index

CSV = "imagenet_2012_bounding_boxes.csv"


@pytest.fixture(scope="module")
def boxed_source(tmp_path_factory, sample_source):
    """The sample source with a box CSV: two rows (their union is the box) for every third train
    image, one row for every third, none for the rest; small boxes in a corner, so crops change."""
    source = tmp_path_factory.mktemp("boxed-source")
    for split in ("train", "validation"):
        shutil.copytree(sample_source / split, source / split)
    rows, expected = [], {}
    for number, (path, _) in enumerate(list_images(source / "train")):
        if number % 3 == 0:
            rows += [f"{path.name},0.0,0.05,0.2,0.25", f"{path.name},0.1,0.0,0.3,0.2"]
            expected[path.stem] = [0.0, 0.0, 0.3, 0.25]
        elif number % 3 == 1:
            rows.append(f"{path.name},0.7,0.7,0.95,0.9")
            expected[path.stem] = [0.7, 0.7, 0.95, 0.9]
    (source / CSV).write_text("\n".join(rows) + "\n")
    return source, expected


@pytest.fixture(scope="module")
def boxed(tmp_path_factory, boxed_source):
    """boxed(fmt) -> the boxed source converted to `fmt` (one conversion per format)."""
    made = {}

    def convert(fmt="img"):
        if fmt not in made:
            made[fmt] = tmp_path_factory.mktemp(f"boxed-{fmt}")
            result = run_script("create_webdataset.py", "--source", boxed_source[0], "--target", made[fmt],
                                "--format", fmt, "--samples-per-shard", SAMPLES_PER_SHARD, "--seed", 0)
            assert result.returncode == 0, result.stdout + result.stderr
        return made[fmt]

    return convert


def copy_of(dataset, tmp_path, name="copy"):
    shutil.copytree(dataset, tmp_path / name)
    return tmp_path / name


def reseal_index(dataset, split, records):
    """Write `records` as the split's index and make metadata.json (index bytes, sha256, md5, folder
    checksum) agree, so that only what the records say differs."""
    metadata = read_metadata(dataset)
    entry = metadata["splits"][split]["index"]
    data = encode_sample_index(records)
    (dataset / entry["name"]).write_bytes(data)
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), md5=hashlib.md5(data).hexdigest())
    metadata["checksum"] = folder_dirhash(dataset)
    write_metadata(dataset, metadata)


def without_bbox_column(dataset):
    """The dataset as written before the bbox column existed: 9-column indexes."""
    for split in ("train", "validation"):
        reseal_index(dataset, split, [r._replace(bbox=None) for r in read_sample_index(
            dataset / f"samples-{split}.index.tsv")])
    header = (dataset / "samples-train.index.tsv").read_text().split("\n")[0].split("\t")
    assert len(header) == 9 and "bbox" not in header
    return dataset


def json_members(dataset, split="train"):
    """{key: (shard path, data offset, size)} of each sample's json member (tar formats)."""
    found = {}
    for r in read_sample_index(dataset / f"samples-{split}.index.tsv"):
        header = r.member_offsets()["json"]
        with open(dataset / r.shard, "rb") as handle:
            handle.seek(header + 124)
            size = int(handle.read(12).strip(b"\0 "), 8)
        found[r.key] = (dataset / r.shard, header + 512, size)
    return found


def crops(dataset, use_bbox_info=True, workers=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader = get_data(DataSource(str(dataset), use_bbox_info=use_bbox_info), "train", batch_size=4, workers=workers,
                          with_keys=True, transform=TrainCrop(image_size=32), seed=3, on_error="fail")
        return {key: image for batch in loader for key, image in zip(batch.keys, batch.images)}


def assert_same_crops(a, b):
    assert a.keys() == b.keys() and a
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


# ------------------------------------------------------------------ the converter


@pytest.mark.parametrize("fmt", format_names())
def test_the_converter_writes_each_train_images_box_to_the_index(boxed, boxed_source, fmt):
    """The union of a train image's CSV rows, "" for images without a row and for validation, in
    every format (the index is the only place a TF-slim record keeps it); --deep validation
    checks the index box against each json that exists."""
    dataset, expected = boxed(fmt), boxed_source[1]
    train = read_sample_index(dataset / "samples-train.index.tsv")
    assert len(train) == 36 and {r.key for r in train} >= set(expected)
    assert {r.key: parse_bbox(r.bbox) for r in train} == {r.key: expected.get(r.key) for r in train}
    assert sum(r.bbox == "" for r in train) == 12
    assert next(r.bbox for r in train if r.key in expected and expected[r.key][0] == 0.0) == "0.0,0.0,0.3,0.25"
    validation = read_sample_index(dataset / "samples-validation.index.tsv")
    assert validation and all(r.bbox == "" for r in validation)
    header = (dataset / "samples-train.index.tsv").read_text().split("\n")[0].split("\t")
    assert header[-1] == "bbox"
    result = run_main(validate_main, dataset, "--deep", "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr


def test_without_a_csv_the_column_is_there_and_empty(converted):
    """The index says "no box" (not "unknown"), so the loader never reads a json for it."""
    for split in ("train", "validation"):
        records = read_sample_index(converted("img") / f"samples-{split}.index.tsv")
        assert records and all(r.bbox == "" for r in records)


def test_the_index_box_is_the_json_box(boxed, boxed_source):
    dataset = boxed("img")
    members = json_members(dataset)
    boxes = {}
    for key, (path, offset, size) in members.items():
        with open(path, "rb") as handle:
            handle.seek(offset)
            boxes[key] = json.loads(handle.read(size))["bbox"]
    records = read_sample_index(dataset / "samples-train.index.tsv")
    assert {r.key: parse_bbox(r.bbox) for r in records} == boxes
    assert sum(box is not None for box in boxes.values()) == len(boxed_source[1]) == 24


# ------------------------------------------------------------------ repartition, adopt, validator


@pytest.mark.parametrize("fmt", format_names())
def test_repartition_keeps_the_boxes(boxed, tmp_path, fmt):
    dataset = copy_of(boxed(fmt), tmp_path)
    original = {r.key: r.bbox for r in read_sample_index(dataset / "samples-train.index.tsv")}
    result = run_script("distributed_webdataset.py", "--target", dataset, "--num-instances", 3)
    assert result.returncode == 0, result.stdout + result.stderr
    folder = dataset / "distributed" / "3-instances"
    copied = 0
    for instance in range(3):
        records = read_sample_index(folder / f"train-instance-{instance:04d}.index.tsv")
        assert records and all(r.bbox == original[r.key] for r in records)
        copied += sum("remainder" in r.shard for r in records)
    assert copied, "no sample was copied into a remainder shard: the test would not see a copied box"
    result = run_main(validate_main, dataset, "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("fmt", ["img", "tensor"])
def test_adopt_takes_each_box_from_the_reference_json(sample_source, tmp_path, fmt):
    stems = [path.stem for path, _ in list_images(sample_source / "train")]
    boxes = {stem: [0.125, 0, 1, 0.5 + n / 100] for n, stem in enumerate(stems) if n % 2}  # ints as json writes them
    dataset = tmp_path / "reference"
    write_reference_dataset(sample_source, dataset, fmt, SAMPLES_PER_SHARD, bboxes=boxes)
    result = run_main(validate_main, dataset, "--adopt")
    assert result.returncode == 0, result.stdout + result.stderr
    records = read_sample_index(dataset / "samples-train.index.tsv")
    # reference keys are positions in the split, in list_images order
    assert {r.key: parse_bbox(r.bbox) for r in records} == {str(n): boxes.get(stem) for n, stem in enumerate(stems)}
    assert records[0].bbox == "" and "0.125,0.0,1.0,0.51" in {r.bbox for r in records}
    assert all(r.bbox == "" for r in read_sample_index(dataset / "samples-validation.index.tsv"))
    result = run_main(validate_main, dataset, "--deep", "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("fmt", ["img", "lmdb"])
def test_the_validator_names_an_index_box_that_differs_from_the_json(boxed, boxed_source, tmp_path, fmt):
    dataset = copy_of(boxed(fmt), tmp_path)
    records = read_sample_index(dataset / "samples-train.index.tsv")
    boxed_key = next(r.key for r in records if r.bbox)
    plain_key = next(r.key for r in records if not r.bbox)
    changed = {boxed_key: "", plain_key: "0.25,0.25,0.5,0.5"}
    reseal_index(dataset, "train", [r._replace(bbox=changed.get(r.key, r.bbox)) for r in records])
    result = run_script("validate_dataset.py", dataset, "--deep", "--workers", 1)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, result.stdout
    box = boxed_source[1][boxed_key]
    assert any(f"[{boxed_key}]: bbox None in the sample index, but the sample's json says {box}" in e for e in errors)
    assert any(f"[{plain_key}]: bbox [0.25, 0.25, 0.5, 0.5] in the sample index, but the sample's json says None"
               in e for e in errors)


def test_a_malformed_box_is_named_with_its_line(converted, tmp_path):
    dataset = copy_of(converted("img"), tmp_path)
    records = read_sample_index(dataset / "samples-train.index.tsv")
    reseal_index(dataset, "train", [records[0]._replace(bbox="0.1,0.2,nan")] + records[1:])
    result = run_script("validate_dataset.py", dataset, "--workers", 1)
    assert result.returncode == 1
    assert "samples-train.index.tsv: line 2 has" in result.stdout and "bbox that is not 4 numbers" in result.stdout


def test_the_column_round_trips_in_text_and_in_the_loaders_columns():
    record = SampleRecord("k0", "train-000000.tar", 0, 0, 1536, 1024, 10, 7, "cls:0;json:512;jpg:1024")
    records = [record._replace(key=f"k{n}", record_offset=1536 * n, bbox=box)
               for n, box in enumerate(["", "0.1,0.2,0.30000000000000004,1.0", "", "0.0,0.0,0.5,0.5"])]
    for boxes in (records, [r._replace(bbox=None) for r in records]):
        data = encode_sample_index(boxes)
        assert list(parse_sample_columns(data.splitlines()).iter_records()) == boxes
        columns = parse_sample_columns(data.splitlines())
        assert columns.has_boxes == (boxes[0].bbox is not None)
        assert check_columns_match(columns, boxes) is None
        assert check_columns_match(columns_from_records(boxes), boxes) is None
    columns = parse_sample_columns(encode_sample_index(records).splitlines())
    assert [columns.box(n) for n in range(4)] == [None, [0.1, 0.2, 0.30000000000000004, 1.0], None, [0, 0, 0.5, 0.5]]
    taken = columns.take([3, 1, 0])
    assert taken.has_boxes and [taken.box(n) for n in range(3)] == [[0, 0, 0.5, 0.5], [0.1, 0.2, 0.30000000000000004, 1.0], None]
    assert check_columns_match(columns, records[:1] + [records[1]._replace(bbox="0.1,0.2,0.3,1.0")] + records[2:])


def test_encoding_keeps_records_with_and_without_boxes_apart():
    record = SampleRecord("k", "train-000000.tar", 0, 0, 1536, 1024, 10, 7, "cls:0;jpg:512")
    with pytest.raises(ValueError, match="mix"):
        encode_sample_index([record._replace(bbox=""), record])
    assert bbox_text([0, 0.1, 1, 0.25]) == "0.0,0.1,1.0,0.25" and bbox_text(None) == ""
    with pytest.raises(ValueError):
        bbox_text([0.1, 0.2, 0.3])


# ------------------------------------------------------------------ the loader


@pytest.mark.parametrize("fmt", ["img", "tensor"])
def test_boxes_from_the_index_and_from_the_json_give_the_same_crops(boxed, tmp_path, fmt):
    """The same dataset with and without the bbox column: identical crops with use_bbox_info, and
    different from those without it (the boxes do steer them)."""
    indexed = boxed(fmt)
    old = without_bbox_column(copy_of(indexed, tmp_path, "old"))
    result = run_main(validate_main, old, "--deep", "--workers", 1)
    assert result.returncode == 0, result.stdout + result.stderr
    from_index, from_json = crops(indexed), crops(old)
    assert_same_crops(from_index, from_json)
    plain = crops(indexed, use_bbox_info=False)
    assert sum(not torch.equal(plain[k], from_index[k]) for k in plain) >= len(plain) // 3


def test_with_boxes_in_the_index_no_json_member_is_read(boxed, tmp_path, monkeypatch):
    """Counted in this process (workers=0): no json read with the column, one a sample without it.
    And across worker processes: json members blanked in a copy change nothing."""
    indexed = boxed("img")
    reads = []
    real = tar_format.read_member
    monkeypatch.setattr(tar_format, "read_member", lambda *args: reads.append(args[2]) or real(*args))
    expected = crops(indexed)
    assert reads == []
    old = without_bbox_column(copy_of(indexed, tmp_path, "old"))
    assert_same_crops(crops(old), expected)
    assert reads and set(reads) == {"json"} and len(reads) >= len(expected)
    monkeypatch.undo()

    blanked = copy_of(indexed, tmp_path, "blanked")
    for path, offset, size in json_members(blanked).values():
        with open(path, "r+b") as handle:
            handle.seek(offset)
            handle.write(b" " * size)
    assert_same_crops(crops(blanked, workers=2), crops(indexed, workers=2))  # each worker draws its own
    # the same blanking without the column: the json path finds no box, so the crops differ
    old_blanked = without_bbox_column(copy_of(blanked, tmp_path, "old-blanked"))
    differ = crops(old_blanked)
    assert sum(not torch.equal(differ[k], expected[k]) for k in expected) >= len(expected) // 3


@pytest.mark.parametrize("fmt", format_names())
def test_the_index_boxes_steer_the_crops_in_every_format(boxed, fmt):
    """Formats whose json the loader cannot read per sample (TF-slim records have none) get their boxes too."""
    dataset = boxed(fmt)
    steered, plain = crops(dataset), crops(dataset, use_bbox_info=False)
    assert plain.keys() == steered.keys() and len(plain) == 36
    assert sum(not torch.equal(plain[k], steered[k]) for k in plain) >= len(plain) // 3
