"""What every step of the sample builder shares: the on-disk names, the error type, one image's spec.

The names are ILSVRC2012's own (see the package docstring); nothing here does any work.
"""

from dataclasses import dataclass

from imagenet_shards.dataset_folder import IMAGENET_GROUND_TRUTH, IMAGENET_TRAIN_TAR, IMAGENET_VALIDATION_TAR
from imagenet_shards.errors import Error

TRAIN_DIR = "train"
VAL_DIR = "validation"
TRAIN_TAR, VAL_TAR, GROUND_TRUTH = IMAGENET_TRAIN_TAR, IMAGENET_VALIDATION_TAR, IMAGENET_GROUND_TRUTH
SYNSETS = "synsets.txt"
IMAGES_CSV = "images.csv"
QUIRKS_JSON = "quirks.json"
INFO_JSON = "sample_info.json"
PHOTO_ATTRIBUTION = "PHOTO_ATTRIBUTION.md"
STAGING_DIR = ".staging"
OUTPUTS = (TRAIN_DIR, VAL_DIR, TRAIN_TAR, VAL_TAR, GROUND_TRUTH, SYNSETS, IMAGES_CSV, QUIRKS_JSON,
           PHOTO_ATTRIBUTION, STAGING_DIR, INFO_JSON)
LAYOUTS = ("folder", "archive")

VAL_VALUE_FORMAT = "ILSVRC2012_val_{:08d}"
EXIF_ORIENTATION_TAG = 0x0112


class SampleDatasetError(Error):
    """Bad arguments or inputs for the sample builder: the message names the file or value."""


@dataclass(frozen=True)
class ImageSpec:
    split: str
    name: str  # file name, e.g. n0XXXXXXX_123.JPEG or ILSVRC2012_val_00000001.JPEG
    class_index: int
    index_in_class: int  # k-th image of this class in this split: seeds its generator
    quirk: str = ""
