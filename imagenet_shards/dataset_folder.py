"""The folder contract every tool shares: what a dataset folder's files and sub-folders are called.

A converted dataset (see imagenet_shards.index for the records and imagenet_shards.formats for shard names):

    metadata.json                         METADATA_FILE, written last
    samples-<split>.index.tsv             the sample index (imagenet_shards.index.sample_index_name)
    distributed/<N>-instances/            DISTRIBUTED_DIR: a repartition for N instances
        manifest.json                     REPARTITION_MANIFEST, written last
    .convert-state/                       CONVERT_STATE_DIR: create_webdataset.py's resume records, only
                                          while a conversion runs (removed once metadata.json is written)

An extracted ImageNet folder: `train/<class>/*`, and `validation/<class>/*` or `val/<class>/*`
(SPLIT_FOLDER_NAMES). IMAGE_EXTENSIONS is what counts as an image there, as in torchvision's
ImageFolder. ImageNet as downloaded: IMAGENET_TRAIN_TAR, IMAGENET_VALIDATION_TAR and the validation
ground truth, IMAGENET_GROUND_TRUTH (what create_webdataset.py reads and the sample dataset writes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

METADATA_FILE = "metadata.json"
SPLITS = ("train", "validation")
DISTRIBUTED_DIR = "distributed"
# create_webdataset.py's crash/resume records while a conversion runs; removed once metadata.json is written.
CONVERT_STATE_DIR = ".convert-state"
REPARTITION_MANIFEST = "manifest.json"
SPLIT_FOLDER_NAMES = {"train": ("train",), "validation": ("validation", "val")}
# torchvision's IMG_EXTENSIONS: what ImageFolder counts as an image.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
IMAGENET_TRAIN_TAR = "ILSVRC2012_img_train.tar"
IMAGENET_VALIDATION_TAR = "ILSVRC2012_img_val.tar"
IMAGENET_GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"


def repartition_dir(root, num_instances: int) -> Path:
    return Path(root) / DISTRIBUTED_DIR / f"{num_instances}-instances"


def split_folder_names(split: str) -> tuple:
    """The folder names a split may have in an extracted layout (validation: validation/ or val/)."""
    return SPLIT_FOLDER_NAMES.get(split, (split,))


def split_of_folder(name: str) -> Optional[str]:
    """The split a top-level folder name holds (val -> validation), or None."""
    for split, names in SPLIT_FOLDER_NAMES.items():
        if name in names:
            return split
    return None


def find_split_folder(root, split: str) -> Optional[Path]:
    """The folder holding `split` under `root`, or None."""
    for name in split_folder_names(split):
        folder = Path(root) / name
        if folder.is_dir():
            return folder
    return None


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def image_folder_samples(folder) -> tuple:
    """(classes, [(path, class index)]) of `folder`/<class>/**/<image>: torchvision's ImageFolder listing
    (datasets.folder.find_classes and make_dataset with its IMG_EXTENSIONS: the same order, the same
    FileNotFoundError for no class folder or a class without an image), without importing torchvision
    (and torch with it: ~6 CPU-s for a command that only lists files)."""
    classes = sorted(entry.name for entry in os.scandir(folder) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {folder}.")
    samples, found = [], set()
    for index, name in enumerate(classes):
        for root, _, names in sorted(os.walk(os.path.join(folder, name), followlinks=True)):
            for file_name in sorted(names):
                if is_image_name(file_name):
                    samples.append((os.path.join(root, file_name), index))
                    found.add(name)
    empty = set(classes) - found
    if empty:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty))}. "
                                f"Supported extensions are: {', '.join(IMAGE_EXTENSIONS)}")
    return classes, samples
