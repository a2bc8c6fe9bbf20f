"""Build a small ImageNet-like dataset from real photos, in ImageNet's own on-disk layouts.

    python -m imagenet_shards.sample --out DIR [--classes 10 --train-per-class 100 --val-per-class 20]
                              [--seed 0] [--photos FOLDER] [--quirks] [--layout folder|archive|both]

What DIR holds (names as in ILSVRC2012):

    train/<wnid>/<wnid>_<n>.JPEG                  the extracted layout (torchvision ImageFolder reads it;
    validation/<wnid>/ILSVRC2012_val_%08d.JPEG    class index = position of the wnid in sorted order)

    ILSVRC2012_img_train.tar                      the downloaded layout: a tar of one `<wnid>.tar` per
                                                  class (sorted by wnid), each holding `<wnid>_<n>.JPEG`
                                                  (sorted by name)
    ILSVRC2012_img_val.tar                        flat: ILSVRC2012_val_00000001.JPEG, ... in number order
    ILSVRC2012_validation_ground_truth.txt        line i = the class of validation image i, as a 1-based
                                                  ILSVRC2012_ID ("devkit order", see below)
    synsets.txt                                   line i = "<wnid> <words>": the wnid of ILSVRC2012_ID i

    images.csv        one row per image: split, file name, wnid, class index, devkit id, source photo,
                      crop box, flip, quality, chroma subsampling, quirk, size, bytes, sha256
    quirks.json       the injected quirks (with --quirks): kind, split, wnid, file name, path per layout
    sample_info.json  parameters, classes and their source photos, summary; rewritten last with
                      "complete": true. A folder holding it may be rebuilt in place; any other
                      non-empty folder is refused.
    PHOTO_ATTRIBUTION.md  the photo folder's ATTRIBUTION.md, when it has one

Devkit order: as in the real devkit (its meta.mat numbers the classes 1..1000 in WordNet order,
not in sorted-wnid order), the ground-truth numbers here follow a fixed permutation of the classes
that is NOT the sorted order. A converter must map number -> wnid through synsets.txt, then
wnid -> class index by sorted order; one that assumes "number - 1 == sorted index" gets wrong
labels, exactly as it would on the real ImageNet. Both layouts hold the same bytes under the
same file names, so labels can be checked between them.

Train file numbers <n> are unique, increasing and not contiguous (like n01440764_10026.JPEG):
code must not assume 1..N. Validation images are numbered 1..N with the classes shuffled.

Images: random crops of the photos, rescaled (Lanczos) to ImageNet-like sizes (mostly 300-500 px
a side, mean near 400x350, 3% with the longer side 501-800 px), mildly sharpened, with a little
luminance grain, randomly mirrored, saved as baseline JPEG with quality 85-95 and 4:2:0 chroma
(one image in four 4:4:4). Crops come from photos at least as large as the crop, downscaled by
a random factor from 1x to as much as the photo allows; only when a class has no photo large
enough is a photo upscaled (counted and printed as "upscaled").
File size: the mean is printed next to ImageNet's ~110 KB. The bundled photos were WebP before
they were JPEG and are smoother than camera photos, so crops of them compress better than
ImageNet's: ~37 KB plain; the grain and sharpening bring the mean to ~52 KB with the bundled
photos, ~60 KB with ../shared/photos (more grain adds little: sigma 6 gives ~+6 KB and looks noisy).

Classes and photos: near-duplicate photos (one original at two sizes, found with a difference
hash) form one group; groups are dealt to the classes so that every class has its own photos
and a similar total photo area (largest first). Only when there are fewer groups than classes do
classes share photos (reported). Train and validation images of a class are crops of the same
photos: fine for throughput and label-correctness checks, not for measuring accuracy.

Quirks (--quirks), each replacing one planned image, at fixed places recorded in quirks.json:
    train, class 0 (sorted), lowest <n>:  PNG data under a .JPEG name (ImageNet: n02105855_2933.JPEG)
    train, class 1, lowest <n>:           CMYK JPEG (ImageNet has 22 in train)
    train, class 2, lowest <n>:           grayscale (mode L) JPEG
    train, class 3, lowest <n>:           JPEG stored rotated, with EXIF Orientation 6 (rotate 90 CW
                                          to display); exif_transpose restores the planned size
    validation, ILSVRC2012_val_00000001:  grayscale JPEG (ImageNet's validation set has them too)
(class k modulo the number of classes; with fewer than 4 classes a class gets several quirks,
on its next-lowest numbers.) Quirk images count in every statistic; images.csv gives their size
as stored (the EXIF-rotated one's width and height are swapped).

Determinism: every image is drawn from its own generator seeded with (seed, split, class, index),
so the bytes do not depend on the number of worker processes or on scheduling; listings are
sorted; archives are written with fixed mtime/uid/gid/owner/mode (imagenet_shards.formats.tar). The same
arguments give byte-identical files; another seed gives other crops, other sizes and other
photo-to-class assignments.

Modules, one job each: names (file names, the error type, ImageSpec), photos (find, fingerprint,
decode, deal to classes), plan (ids, devkit order, every image's spec, quirk places), render
(image synthesis and the quirks' encodings), layouts (the folder and archive layouts), records
(ground truth, synsets, images.csv, quirks.json, the summary), build (build_sample_dataset: the
steps in order), cli (options, report, exit codes; `__main__` runs it). The names below are
re-exported so that `imagenet_shards.sample.X` keeps meaning what it did when this was one module.
"""

from imagenet_shards.sample.build import PARALLEL_FROM_IMAGES, build_sample_dataset
from imagenet_shards.sample.cli import format_summary, main, parse_args
from imagenet_shards.sample.layouts import archive_path, folder_path, prepare_output
from imagenet_shards.sample.names import (GROUND_TRUTH, IMAGES_CSV, INFO_JSON, LAYOUTS, OUTPUTS, PHOTO_ATTRIBUTION,
                                   QUIRKS_JSON, STAGING_DIR, SYNSETS, TRAIN_DIR, TRAIN_TAR, VAL_DIR, VAL_TAR,
                                   VAL_VALUE_FORMAT, ImageSpec, SampleDatasetError)
from imagenet_shards.sample.photos import (DEFAULT_PHOTOS, PHOTO_SUFFIXES, Photo, assign_photos_to_classes, class_words,
                                    difference_hash, find_photos, group_near_duplicates, load_photo)
from imagenet_shards.sample.plan import Plan, devkit_order, make_plan, make_wnids, train_file_numbers
from imagenet_shards.sample.listings import CSV_FIELDS, IMAGENET_MEAN_BYTES
from imagenet_shards.sample.render import (QUALITY, QUIRK_DETAILS, QUIRK_KINDS, VAL_QUIRKS, RenderedImage, grain_field,
                                    image_generator, render_class, render_image, sample_image_size)

__all__ = [
    "build_sample_dataset", "main", "parse_args", "format_summary", "SampleDatasetError", "ImageSpec", "Photo",
    "Plan", "RenderedImage", "find_photos", "load_photo", "difference_hash", "group_near_duplicates",
    "assign_photos_to_classes", "class_words", "make_plan", "make_wnids", "devkit_order", "train_file_numbers",
    "sample_image_size", "grain_field", "image_generator", "render_image", "render_class", "prepare_output",
    "folder_path", "archive_path", "DEFAULT_PHOTOS", "PHOTO_SUFFIXES", "TRAIN_DIR", "VAL_DIR", "TRAIN_TAR",
    "VAL_TAR", "GROUND_TRUTH", "SYNSETS", "IMAGES_CSV", "QUIRKS_JSON", "INFO_JSON", "PHOTO_ATTRIBUTION",
    "STAGING_DIR", "OUTPUTS", "LAYOUTS", "VAL_VALUE_FORMAT", "IMAGENET_MEAN_BYTES", "QUALITY", "QUIRK_KINDS",
    "QUIRK_DETAILS", "VAL_QUIRKS", "CSV_FIELDS", "PARALLEL_FROM_IMAGES",
]
