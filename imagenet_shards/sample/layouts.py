"""The two on-disk layouts: the extracted folders and the downloaded archives (ILSVRC2012's names).

prepare_output guards the output folder; write_class writes one class's rendered images as they
arrive (folder files, and for the archives a staged per-class train tar and the validation
images); write_archives then joins the staged parts into the two outer tars. Tars are written by
imagenet_shards.formats.tar with fixed metadata, members sorted by name, so the bytes follow the plan.
"""

import shutil
from pathlib import Path

from imagenet_shards.formats.tar import TarShardWriter
from imagenet_shards.sample.names import (INFO_JSON, OUTPUTS, STAGING_DIR, TRAIN_DIR, TRAIN_TAR, VAL_DIR, VAL_TAR,
                                   ImageSpec, SampleDatasetError)


def prepare_output(out: Path):
    """Refuse a non-empty folder that this builder did not make; clear one that it did."""
    if out.exists() and not out.is_dir():
        raise SampleDatasetError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / INFO_JSON).is_file():
            raise SampleDatasetError(
                f"--out {out} is not empty and holds no {INFO_JSON}: refusing to write into a folder "
                "this builder did not make; choose a new or empty folder")
        for name in OUTPUTS:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)


def make_staging(out: Path) -> Path:
    """The staging folder: per-class train tars; validation images when there is no folder layout."""
    staging = out / STAGING_DIR
    (staging / "train").mkdir(parents=True)
    (staging / "validation").mkdir()
    return staging


def folder_path(spec: ImageSpec, wnid: str) -> str:
    return f"{spec.split}/{wnid}/{spec.name}"


def archive_path(spec: ImageSpec, wnid: str) -> str:
    if spec.split == TRAIN_DIR:
        return f"{TRAIN_TAR}/{wnid}.tar/{spec.name}"
    return f"{VAL_TAR}/{spec.name}"


def _stem(name: str) -> str:
    return name.rsplit(".", 1)[0]


def write_class(out: Path, staging: Path, wnid: str, rendered, layouts) -> dict:
    """Write one class's RenderedImages in `layouts`; return {validation file name: file holding its bytes}.

    The folder layout gets its files now; the archive layout gets the class's train tar in
    `staging`, and its validation images there too unless the folder layout already holds them.
    """
    val_files = {}
    for r in rendered:
        if "folder" in layouts:
            path = out / folder_path(r.spec, wnid)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(r.data)
        if r.spec.split == VAL_DIR:
            if "folder" not in layouts:
                path = staging / "validation" / r.spec.name
                path.write_bytes(r.data)
            val_files[r.spec.name] = path
    if "archive" in layouts:
        with TarShardWriter(staging / "train" / f"{wnid}.tar") as writer:
            for r in sorted((r for r in rendered if r.spec.split == TRAIN_DIR), key=lambda r: r.spec.name):
                writer.add_members(_stem(r.spec.name), [("JPEG", r.data)])
    return val_files


def write_archives(out: Path, staging: Path, wnids, val_files: dict):
    """The downloaded layout's two tars: one `<wnid>.tar` per class (in `wnids` order), and the
    validation images in name order (`val_files` as gathered from write_class)."""
    with TarShardWriter(out / TRAIN_TAR) as writer:
        for wnid in wnids:
            inner = staging / "train" / f"{wnid}.tar"
            writer.add_members(wnid, [("tar", inner.read_bytes())])
    with TarShardWriter(out / VAL_TAR) as writer:
        for name in sorted(val_files):
            writer.add_members(_stem(name), [("JPEG", val_files[name].read_bytes())])
