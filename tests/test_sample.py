"""The sample builder: determinism, both layouts with agreeing labels, image statistics, quirks, CLI.

Archives are read back with Python's tarfile (not the project's own parser), so a writer bug
and a reader bug cannot cancel out.
"""

import csv
import io
import json
import re
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

from imagenet_shards import sample
from imagenet_shards.sample import build_sample_dataset

from conftest import run_script

TINY = {"classes": 4, "train_per_class": 6, "val_per_class": 2}
WNID = re.compile(r"^n\d{8}$")
TRAIN_NAME = re.compile(r"^(n\d{8})_(\d+)\.JPEG$")
VAL_NAME = re.compile(r"^ILSVRC2012_val_(\d{8})\.JPEG$")

# libjpeg's base luminance quantization table (natural order), scaled by quality.
_BASE_LUMINANCE = [
    16, 11, 10, 16, 24, 40, 51, 61, 12, 12, 14, 19, 26, 58, 60, 55, 14, 13, 16, 24, 40, 57, 69, 56,
    14, 17, 22, 29, 51, 87, 80, 62, 18, 22, 37, 56, 68, 109, 103, 77, 24, 35, 55, 64, 81, 104, 113, 92,
    49, 64, 78, 87, 103, 121, 120, 101, 72, 92, 95, 98, 112, 100, 103, 99,
]


def jpeg_quality(image) -> int:
    """The libjpeg quality whose luminance table this JPEG uses (0 if none matches)."""
    table = list(image.quantization[0])
    for quality in range(1, 101):
        scale = 5000 // quality if quality < 50 else 200 - 2 * quality
        if [min(255, max(1, (b * scale + 50) // 100)) for b in _BASE_LUMINANCE] == table:
            return quality
    return 0


def all_files(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def read_train_archive(path: Path) -> dict:
    """{wnid: {file name: bytes}} from ILSVRC2012_img_train.tar (a tar of per-class tars)."""
    classes = {}
    with tarfile.open(path) as outer:
        for member in outer.getmembers():
            assert member.isfile() and member.name.endswith(".tar"), member.name
            wnid = member.name[: -len(".tar")]
            with tarfile.open(fileobj=io.BytesIO(outer.extractfile(member).read())) as inner:
                classes[wnid] = {m.name: inner.extractfile(m).read() for m in inner.getmembers()}
    return classes


def read_flat_archive(path: Path) -> dict:
    with tarfile.open(path) as archive:
        return {m.name: archive.extractfile(m).read() for m in archive.getmembers()}


def devkit_labels(root: Path) -> list:
    """wnid of every validation image, in number order, via the ground truth and synsets.txt."""
    synsets = [line.split(" ", 1)[0] for line in (root / sample.SYNSETS).read_text().splitlines()]
    numbers = [int(line) for line in (root / sample.GROUND_TRUTH).read_text().splitlines()]
    return [synsets[n - 1] for n in numbers]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Two builds with seed 0 (1 and 2 worker processes), one with seed 1; all with quirks."""
    made = {}
    for name, seed, workers in (("a", 0, 1), ("b", 0, 2), ("other_seed", 1, 1)):
        out = tmp_path_factory.mktemp(f"sample-{name}")
        summary = build_sample_dataset(out, seed=seed, quirks=True, workers=workers, **TINY)
        made[name] = (out, summary)
    return made


def test_same_seed_gives_byte_identical_files_and_archives(builds):
    files_a, files_b = all_files(builds["a"][0]), all_files(builds["b"][0])
    assert sample.TRAIN_TAR in files_a and sample.VAL_TAR in files_a
    assert sorted(files_a) == sorted(files_b)
    different = [name for name in files_a if files_a[name] != files_b[name]]
    assert different == []


def test_another_seed_gives_other_images(builds):
    files_a, files_c = all_files(builds["a"][0]), all_files(builds["other_seed"][0])
    assert files_a[sample.TRAIN_TAR] != files_c[sample.TRAIN_TAR]
    assert files_a[sample.VAL_TAR] != files_c[sample.VAL_TAR]
    images_a = {data for name, data in files_a.items() if name.endswith(".JPEG")}
    images_c = {data for name, data in files_c.items() if name.endswith(".JPEG")}
    assert len(images_a) == len(images_c) == 4 * 8
    assert not images_a & images_c


def test_folder_layout(builds):
    root = builds["a"][0]
    wnids = sorted(p.name for p in (root / "train").iterdir())
    assert len(wnids) == 4 and all(WNID.match(w) for w in wnids)
    assert sorted(p.name for p in (root / "validation").iterdir()) == wnids
    for wnid in wnids:
        names = [p.name for p in (root / "train" / wnid).iterdir()]
        assert len(names) == 6
        assert all(TRAIN_NAME.match(n) and TRAIN_NAME.match(n).group(1) == wnid for n in names)
    val_names = sorted(p.name for p in (root / "validation").glob("*/*"))
    assert val_names == [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 9)]


def test_archive_layout_matches_folder_layout(builds):
    root = builds["a"][0]
    train = read_train_archive(root / sample.TRAIN_TAR)
    assert list(train) == sorted(train)  # class tars in wnid order, as in the download
    for wnid, members in train.items():
        assert list(members) == sorted(members)
        folder = {p.name: p.read_bytes() for p in (root / "train" / wnid).iterdir()}
        assert members == folder  # same names, same bytes, per class
    val = read_flat_archive(root / sample.VAL_TAR)
    assert list(val) == [f"ILSVRC2012_val_{i:08d}.JPEG" for i in range(1, 9)]
    folder_val = {p.name: (p.parent.name, p.read_bytes()) for p in (root / "validation").glob("*/*")}
    for name, data in val.items():
        assert folder_val[name][1] == data


def test_ground_truth_labels_agree_with_folder_layout(builds):
    root = builds["a"][0]
    lines = (root / sample.GROUND_TRUTH).read_text().splitlines()
    assert len(lines) == 8 and all(1 <= int(line) <= 4 for line in lines)
    folder_wnid = {p.name: p.parent.name for p in (root / "validation").glob("*/*")}
    labels = devkit_labels(root)
    assert labels == [folder_wnid[f"ILSVRC2012_val_{i:08d}.JPEG"] for i in range(1, 9)]
    # Like the real devkit, the numbers are not the sorted-wnid order: a converter must read synsets.txt.
    synsets = [line.split(" ", 1)[0] for line in (root / sample.SYNSETS).read_text().splitlines()]
    assert sorted(synsets) == sorted(p.name for p in (root / "train").iterdir())
    assert synsets != sorted(synsets)
    # Validation classes are interleaved, 2 images per class.
    assert sorted(labels.count(w) for w in set(labels)) == [2, 2, 2, 2]


def test_classes_use_distinct_source_photos(builds):
    root, summary = builds["a"]
    rows = list(csv.DictReader((root / sample.IMAGES_CSV).open()))
    assert len(rows) == 32
    photos_of = {}
    for row in rows:
        photos_of.setdefault(row["wnid"], set()).add(row["source_photo"])
        folder = root / row["split"] / row["wnid"] / row["name"]
        assert len(folder.read_bytes()) == int(row["bytes"])
    wnids = sorted(photos_of)
    for i, a in enumerate(wnids):
        for b in wnids[i + 1 :]:
            assert not photos_of[a] & photos_of[b], (a, b)
    assert summary["shared_photos"] is False


def test_image_size_distribution_is_imagenet_like():
    rng = np.random.default_rng(123)
    sizes = np.array([sample.sample_image_size(rng) for _ in range(4000)])
    widths, heights = sizes[:, 0], sizes[:, 1]
    assert 380 <= widths.mean() <= 430 and 325 <= heights.mean() <= 375
    sides = sizes.ravel()
    assert ((sides >= 300) & (sides <= 500)).mean() >= 0.7
    assert sides.max() <= 800 and (sides > 500).mean() < 0.05 and sides.min() >= 180


def test_built_images_statistics(tmp_path):
    summary = build_sample_dataset(tmp_path, classes=6, train_per_class=16, val_per_class=4, seed=3,
                                   layouts=("folder",))
    images = sorted(tmp_path.glob("*/*/*.JPEG"))
    assert len(images) == 120 == summary["all"]["images"]
    widths, heights, sizes, qualities = [], [], [], []
    for path in images:
        with Image.open(path) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            widths.append(image.width)
            heights.append(image.height)
            qualities.append(jpeg_quality(image))
        sizes.append(path.stat().st_size)
    assert all(85 <= q <= 95 for q in qualities), sorted(set(qualities))
    assert len(set(qualities)) >= 5
    assert 150 <= min(widths + heights) and max(widths + heights) <= 800
    assert 340 <= np.mean(widths) <= 470 and 290 <= np.mean(heights) <= 410
    assert 30_000 <= np.mean(sizes) <= 150_000
    assert summary["all"]["mean_bytes"] == pytest.approx(np.mean(sizes), abs=0.1)
    assert summary["all"]["mean_width"] == pytest.approx(np.mean(widths), abs=0.1)
    assert summary["upscaled"] == 0  # the bundled photos are large enough for 6 classes


def test_quirks_present_and_recognisable_in_both_layouts(builds):
    root = builds["a"][0]
    quirks = json.loads((root / sample.QUIRKS_JSON).read_text())
    kinds = {(q["kind"], q["split"]) for q in quirks}
    assert kinds == {("png_as_jpeg", "train"), ("cmyk", "train"), ("grayscale", "train"),
                     ("exif_rotated", "train"), ("grayscale", "validation")}
    train_archive = read_train_archive(root / sample.TRAIN_TAR)
    val_archive = read_flat_archive(root / sample.VAL_TAR)
    for quirk in quirks:
        assert quirk["name"].endswith(".JPEG")
        data = (root / quirk["folder_path"]).read_bytes()
        archived = (train_archive[quirk["wnid"]] if quirk["split"] == "train" else val_archive)[quirk["name"]]
        assert archived == data
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            if quirk["kind"] == "png_as_jpeg":
                assert image.format == "PNG"
            elif quirk["kind"] == "cmyk":
                assert (image.format, image.mode) == ("JPEG", "CMYK")
            elif quirk["kind"] == "grayscale":
                assert (image.format, image.mode) == ("JPEG", "L")
            else:
                assert image.format == "JPEG" and image.getexif().get(0x0112) == 6
                assert ImageOps.exif_transpose(image).size == (image.height, image.width)
    # Everything else is a plain RGB JPEG without a rotation.
    quirky = {q["folder_path"] for q in quirks}
    for path in sorted(root.glob("*/*/*.JPEG")):
        if path.relative_to(root).as_posix() in quirky:
            continue
        with Image.open(path) as image:
            assert (image.format, image.mode) == ("JPEG", "RGB"), path
            assert image.getexif().get(0x0112, 1) == 1, path


def test_without_quirks_every_image_is_an_rgb_jpeg(tmp_path):
    build_sample_dataset(tmp_path, seed=0, **TINY)
    assert not (tmp_path / sample.QUIRKS_JSON).exists()
    for path in sorted(tmp_path.glob("*/*/*.JPEG")):
        with Image.open(path) as image:
            assert (image.format, image.mode) == ("JPEG", "RGB"), path


def test_archive_only_layout_is_identical_to_the_archives_of_both(builds, tmp_path):
    build_sample_dataset(tmp_path, seed=0, quirks=True, workers=1, layouts=("archive",), **TINY)
    assert not (tmp_path / "train").exists() and not (tmp_path / "validation").exists()
    assert not (tmp_path / sample.STAGING_DIR).exists()
    reference = builds["a"][0]
    for name in (sample.TRAIN_TAR, sample.VAL_TAR, sample.GROUND_TRUTH, sample.SYNSETS, sample.IMAGES_CSV):
        assert (tmp_path / name).read_bytes() == (reference / name).read_bytes(), name


def test_rebuild_in_place_and_refuse_foreign_folder(builds, tmp_path):
    out = tmp_path / "out"
    build_sample_dataset(out, seed=0, quirks=True, workers=1, **TINY)
    (out / "train" / "stale.JPEG").write_bytes(b"old")
    build_sample_dataset(out, seed=0, quirks=True, workers=1, **TINY)  # our folder: rebuilt
    assert all_files(out) == all_files(builds["a"][0])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("user data")
    with pytest.raises(sample.SampleDatasetError, match="foreign.*not empty"):
        build_sample_dataset(foreign, **TINY)
    assert (foreign / "keep.txt").read_text() == "user data"


def _photo_folder(tmp_path, sources):
    folder = tmp_path / "photos"
    for rel in sources:
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sample.DEFAULT_PHOTOS / rel, target)
    return folder


def test_near_duplicate_photos_stay_in_one_class(tmp_path):
    originals = ["large/explore_farm_animals/cat.jpg", "large/explore_farm_animals/owl.jpg",
                 "large/explore_world_animals/panda.jpg", "large/explore_world_animals/moose.jpg"]
    folder = _photo_folder(tmp_path, originals)
    with Image.open(folder / originals[0]) as image:  # the cat again, at 320 px, re-encoded
        image.resize((320, 240), Image.LANCZOS).save(folder / "cat_small.png")
    photos, skipped = sample.find_photos(folder)
    assert len(photos) == 5 and skipped == []
    groups = sample.group_near_duplicates(photos)
    assert sorted(sorted(p.rel for p in g) for g in groups if len(g) > 1) == [
        ["cat_small.png", "large/explore_farm_animals/cat.jpg"]]
    assert len(groups) == 4


def test_small_unreadable_and_too_few_photos_are_reported(tmp_path):
    folder = _photo_folder(tmp_path, ["labelled/tools/hammer3.jpg", "labelled/fishes/fish9.jpg"])
    (folder / "broken.jpg").write_bytes((sample.DEFAULT_PHOTOS / "labelled/tools/hammer3.jpg").read_bytes()[:500])
    summary = build_sample_dataset(tmp_path / "out", classes=3, train_per_class=2, val_per_class=1, photos=folder)
    assert [s["path"] for s in summary["photos_skipped"]] == ["broken.jpg"]
    assert summary["upscaled"] > 0  # 320 px photos: crops of ~400 px must be upscaled
    assert summary["shared_photos"] is True  # 2 photos for 3 classes
    text = sample.format_summary(summary)
    assert "upscaled" in text and "unreadable photos skipped" in text and "share photos" in text


def test_errors_name_the_problem(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(sample.SampleDatasetError, match="no usable photos.*empty"):
        build_sample_dataset(tmp_path / "out", photos=empty, **TINY)
    with pytest.raises(sample.SampleDatasetError, match="does not exist"):
        build_sample_dataset(tmp_path / "out", photos=tmp_path / "missing", **TINY)
    with pytest.raises(sample.SampleDatasetError, match="classes must be an integer >= 1"):
        build_sample_dataset(tmp_path / "out", classes=0)
    with pytest.raises(sample.SampleDatasetError, match="layouts"):
        build_sample_dataset(tmp_path / "out", layouts=("zip",), **TINY)
    with pytest.raises(sample.SampleDatasetError, match="--quirks needs 2 train images per class"):
        build_sample_dataset(tmp_path / "out", classes=2, train_per_class=1, val_per_class=0, quirks=True)


def test_cli_builds_and_prints_summary(tmp_path):
    out = tmp_path / "cli"
    result = run_script("-m", "imagenet_shards.sample", "--out", out, "--classes", 2, "--train-per-class", 3,
                        "--val-per-class", 1, "--seed", 5, "--layout", "folder", "--quirks")
    assert result.returncode == 0, result.stderr
    assert re.search(r"train\s+6 images\s+mean\s+[\d.]+ KB\s+mean \d+x\d+ px", result.stdout), result.stdout
    assert re.search(r"validation\s+2 images", result.stdout)
    assert "ImageNet ~110 KB" in result.stdout and "built in" in result.stdout
    assert len(list(out.glob("train/*/*.JPEG"))) == 6 and not (out / sample.TRAIN_TAR).exists()

    bad = run_script("-m", "imagenet_shards.sample", "--out", out, "--classes", "0")
    assert bad.returncode != 0 and "--classes must be >= 1" in bad.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "x").write_text("x")
    refused = run_script("-m", "imagenet_shards.sample", "--out", foreign, "--classes", 2)
    assert refused.returncode == 1 and str(foreign) in refused.stderr and "not empty" in refused.stderr


def test_the_demo_runs_its_commands_from_the_checkout():
    # `make demo` ran every step from imagenet_shards/ once the demo moved to imagenet_shards/tools/ (REPO one level
    # short): `python -m imagenet_shards.sample` was not found and the README's first command failed
    from imagenet_shards.tools import demo

    assert (demo.REPO / "validate_dataset.py").is_file() and (demo.REPO / "imagenet_shards").is_dir()
    steps = list(demo.demo_steps(demo.REPO / "demo-output", 2, 2, 1))
    scripts = [part for _, command in steps for part in command if str(part).endswith(".py")]
    assert scripts and all((demo.REPO / part).is_file() for part in scripts), scripts
