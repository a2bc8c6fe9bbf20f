"""Build a small ImageNet-like dataset from real photos, in ImageNet's own on-disk layouts.

    python -m datasets.sample --out DIR [--classes 10 --train-per-class 100 --val-per-class 20]
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
sorted; archives are written with fixed mtime/uid/gid/owner/mode (datasets.formats.tar). The same
arguments give byte-identical files; another seed gives other crops, other sizes and other
photo-to-class assignments.
"""

import argparse
import csv
import io
import json
import math
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter, ImageOps

from datasets.fileio import atomic_write_bytes, atomic_write_json, sha256_bytes
from datasets.formats.tar import TarShardWriter

DEFAULT_PHOTOS = Path(__file__).resolve().parent / "photos"
PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png")

TRAIN_DIR = "train"
VAL_DIR = "validation"
TRAIN_TAR = "ILSVRC2012_img_train.tar"
VAL_TAR = "ILSVRC2012_img_val.tar"
GROUND_TRUTH = "ILSVRC2012_validation_ground_truth.txt"
SYNSETS = "synsets.txt"
IMAGES_CSV = "images.csv"
QUIRKS_JSON = "quirks.json"
INFO_JSON = "sample_info.json"
PHOTO_ATTRIBUTION = "PHOTO_ATTRIBUTION.md"
STAGING_DIR = ".staging"
OUTPUTS = (TRAIN_DIR, VAL_DIR, TRAIN_TAR, VAL_TAR, GROUND_TRUTH, SYNSETS, IMAGES_CSV, QUIRKS_JSON,
           PHOTO_ATTRIBUTION, STAGING_DIR, INFO_JSON)
LAYOUTS = ("folder", "archive")

IMAGENET_MEAN_BYTES = 110_000  # ILSVRC2012 train: ~140 GB / 1.28M images
VAL_VALUE_FORMAT = "ILSVRC2012_val_{:08d}"

# Image statistics (see the module docstring).
LONG_SIDE = (350, 500)  # usual longer side, inclusive
LARGE_LONG_SIDE = (501, 800)
LARGE_FRACTION = 0.03
ASPECTS = (4 / 3, 3 / 2, 1.0, 5 / 4, 16 / 9)  # longer / shorter
ASPECT_P = (0.55, 0.20, 0.08, 0.07, 0.10)
LANDSCAPE_FRACTION = 0.75
QUALITY = (85, 95)  # inclusive
FULL_CHROMA_FRACTION = 0.25
GRAIN_SIGMA = 4.0  # luminance grain, in 8-bit levels
GRAIN_FIELD = 1024  # one noise field per build; images take windows of it
# Mild sharpening, like a camera's: x + 0.5 * (4-neighbour Laplacian). A 3x3 kernel costs a
# tenth of UnsharpMask here for the same effect on file size.
SHARPEN = ImageFilter.Kernel((3, 3), [0, -1, 0, -1, 12, -1, 0, -1, 0], scale=8)
MAX_PHOTO_SIDE = 1600  # larger photos are shrunk on load: bounds memory and the crop scale
DUPLICATE_HASH_BITS = 20  # of 256: same original at two sizes differs by <= 6, distinct photos by >= 36

QUIRK_KINDS = ("png_as_jpeg", "cmyk", "grayscale", "exif_rotated")
QUIRK_DETAILS = {
    "png_as_jpeg": "PNG data under a .JPEG name (ImageNet train: n02105855_2933.JPEG)",
    "cmyk": "CMYK JPEG (ImageNet train holds 22)",
    "grayscale": "single-channel (mode L) JPEG",
    "exif_rotated": "pixels stored rotated 90 degrees, EXIF Orientation 6; exif_transpose gives the upright image",
}
VAL_QUIRKS = ("grayscale",)
EXIF_ORIENTATION_TAG = 0x0112

PARALLEL_FROM_IMAGES = 200

_SPLIT_CODES = {TRAIN_DIR: 1, VAL_DIR: 2}


class SampleDatasetError(Exception):
    """Bad arguments or inputs for the sample builder: the message names the file or value."""


@dataclass(frozen=True)
class Photo:
    path: str  # absolute
    rel: str  # relative to the photo folder, with "/"
    width: int  # upright (after the EXIF orientation)
    height: int
    fingerprint: bytes  # difference hash, one byte per bit

    @property
    def area(self) -> int:
        return self.width * self.height


@dataclass(frozen=True)
class ImageSpec:
    split: str
    name: str  # file name, e.g. n0XXXXXXX_123.JPEG or ILSVRC2012_val_00000001.JPEG
    class_index: int
    index_in_class: int  # k-th image of this class in this split: seeds its generator
    quirk: str = ""


@dataclass
class RenderedImage:
    spec: ImageSpec
    data: bytes
    width: int  # as stored (an exif_rotated image is stored transposed)
    height: int
    source: str
    box: tuple
    flip: bool
    quality: int
    subsampling: str
    upscaled: bool


# ---------------------------------------------------------------- photos and classes


def find_photos(folder, exclude=None):
    """All photos under `folder` (recursive, sorted by relative path) and the unreadable ones.

    Returns (photos, skipped) where skipped is a list of {"path", "reason"}. Files under
    `exclude` (the output folder, should it lie inside the photo folder) are ignored.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise SampleDatasetError(f"photo folder {folder} does not exist or is not a folder")
    exclude = Path(exclude).resolve() if exclude is not None else None
    candidates = sorted(
        (p for p in folder.rglob("*") if p.suffix.lower() in PHOTO_SUFFIXES and p.is_file()
         and not (exclude and p.resolve().is_relative_to(exclude))),
        key=lambda p: p.relative_to(folder).as_posix(),
    )
    photos, skipped = [], []
    for path in candidates:
        rel = path.relative_to(folder).as_posix()
        try:
            with Image.open(path) as image:
                width, height = image.size
                if image.getexif().get(EXIF_ORIENTATION_TAG, 1) in (5, 6, 7, 8):
                    width, height = height, width
            fingerprint = difference_hash(path)  # decodes (at a reduced scale): finds broken files
        except Exception as error:  # PIL raises many types for bad files
            skipped.append({"path": rel, "reason": f"{type(error).__name__}: {error}"})
            continue
        photos.append(Photo(str(path.resolve()), rel, width, height, fingerprint.tobytes()))
    if not photos:
        raise SampleDatasetError(f"no usable photos ({', '.join('*' + s for s in PHOTO_SUFFIXES)}) under {folder}")
    return photos, skipped


def load_photo(path) -> Image.Image:
    """Decode a photo upright, as RGB, its longer side at most MAX_PHOTO_SIDE."""
    with Image.open(path) as image:
        image.draft("RGB", (MAX_PHOTO_SIDE, MAX_PHOTO_SIDE))  # JPEG: decode at a reduced scale when huge
        image = ImageOps.exif_transpose(image)
        image = image.convert("RGB")
    scale = MAX_PHOTO_SIDE / max(image.size)
    if scale < 1:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.LANCZOS)
    return image


def difference_hash(path) -> np.ndarray:
    """256-bit difference hash: tells one original saved at two sizes from distinct photos."""
    with Image.open(path) as image:
        image.draft("L", (64, 64))
        gray = ImageOps.exif_transpose(image).convert("L").resize((17, 16), Image.BILINEAR)
    pixels = np.asarray(gray, dtype=np.int16)
    return (pixels[:, 1:] > pixels[:, :-1]).ravel()


def group_near_duplicates(photos):
    """Lists of photos that are one original (difference hashes within DUPLICATE_HASH_BITS)."""
    hashes = np.array([np.frombuffer(p.fingerprint, dtype=np.bool_) for p in photos])
    parent = list(range(len(photos)))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(photos) - 1):
        distances = (hashes[i + 1 :] != hashes[i]).sum(axis=1)
        for j in np.nonzero(distances <= DUPLICATE_HASH_BITS)[0]:
            a, b = root(i), root(i + 1 + int(j))
            parent[max(a, b)] = min(a, b)
    groups = {}
    for i, photo in enumerate(photos):
        groups.setdefault(root(i), []).append(photo)
    return [groups[k] for k in sorted(groups)]


def assign_photos_to_classes(groups, classes: int, rng):
    """Deal photo groups to classes: largest group first, to the class with the least photo area.

    Ties between classes are broken by a seeded random priority. Returns (per-class photo
    lists, shared) where shared tells that there were fewer groups than classes and some
    classes reuse another class's photos.
    """
    priority = rng.permutation(classes)
    order = sorted(range(len(groups)), key=lambda g: (-sum(p.area for p in groups[g]), groups[g][0].rel))
    assigned = [[] for _ in range(classes)]
    area = [0] * classes
    for g in order:
        target = min(range(classes), key=lambda c: (area[c], len(assigned[c]), priority[c]))
        assigned[target].extend(groups[g])
        area[target] += sum(p.area for p in groups[g])
    shared = len(groups) < classes
    if shared:
        filled = [c for c in range(classes) if assigned[c]]
        for n, c in enumerate(c for c in range(classes) if not assigned[c]):
            assigned[c] = list(assigned[filled[n % len(filled)]])
    return [sorted(photos, key=lambda p: p.rel) for photos in assigned], shared


def make_wnids(classes: int):
    """Deterministic, sorted, WordNet-looking ids ("n" + 8 digits), the same for every seed."""
    rng = np.random.default_rng(20120101)
    ids = set()
    while len(ids) < classes:
        ids.update(int(x) for x in rng.integers(1_000_000, 10_000_000, size=classes - len(ids)))
    return [f"n0{number:07d}" for number in sorted(ids)]


def devkit_order(classes: int):
    """devkit number (1-based, position in the list) -> class index; never the sorted order."""
    order = [int(c) for c in np.random.default_rng(1000).permutation(classes)]
    if classes > 1 and order == sorted(order):
        order.reverse()
    return order


def train_file_numbers(count: int, rng):
    """Unique, increasing, non-contiguous numbers like ImageNet's n01440764_10026."""
    return sorted(int(n) for n in rng.choice(np.arange(1, 10 * count + 100), size=count, replace=False))


# ---------------------------------------------------------------- images


def sample_image_size(rng):
    """(width, height) drawn like ImageNet's: mostly 300-500 a side, mean near 400x350."""
    if rng.random() < LARGE_FRACTION:
        longer = int(rng.integers(LARGE_LONG_SIDE[0], LARGE_LONG_SIDE[1] + 1))
    else:
        longer = int(rng.integers(LONG_SIDE[0], LONG_SIDE[1] + 1))
    aspect = ASPECTS[int(rng.choice(len(ASPECTS), p=ASPECT_P))]
    shorter = int(round(longer / aspect))
    return (longer, shorter) if rng.random() < LANDSCAPE_FRACTION else (shorter, longer)


def grain_field(seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, 0x6A41])
    return np.round(rng.normal(0.0, GRAIN_SIGMA, (GRAIN_FIELD, GRAIN_FIELD))).astype(np.int16)


def image_generator(seed: int, spec: ImageSpec):
    return np.random.default_rng([seed, _SPLIT_CODES[spec.split], spec.class_index, spec.index_in_class])


def render_image(seed: int, spec: ImageSpec, photos, images, grain) -> RenderedImage:
    """One image: a random crop of one of the class's photos, encoded (and made quirky if asked)."""
    rng = image_generator(seed, spec)
    width, height = sample_image_size(rng)
    fits = [i for i, image in enumerate(images) if image.width >= width and image.height >= height]
    if fits:
        weights = np.array([images[i].width * images[i].height for i in fits], dtype=float)
        choice = fits[int(rng.choice(len(fits), p=weights / weights.sum()))]
    else:  # no photo is large enough: take the one that needs the least upscaling
        choice = max(range(len(images)), key=lambda i: (min(images[i].width / width, images[i].height / height), -i))
    source = images[choice]
    max_scale = min(source.width / width, source.height / height)
    scale = math.exp(rng.uniform(0.0, math.log(max_scale))) if max_scale > 1 else max_scale
    crop_w, crop_h = width * scale, height * scale
    left = rng.uniform(0.0, source.width - crop_w) if source.width > crop_w else 0.0
    top = rng.uniform(0.0, source.height - crop_h) if source.height > crop_h else 0.0
    box = (left, top, min(source.width, left + crop_w), min(source.height, top + crop_h))
    flip = bool(rng.random() < 0.5)
    quality = int(rng.integers(QUALITY[0], QUALITY[1] + 1))
    subsampling = 0 if rng.random() < FULL_CHROMA_FRACTION else 2
    grain_x = int(rng.integers(0, GRAIN_FIELD - width + 1))
    grain_y = int(rng.integers(0, GRAIN_FIELD - height + 1))

    image = source.resize((width, height), Image.LANCZOS, box=box)
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    image = image.filter(SHARPEN)
    pixels = np.asarray(image, dtype=np.int16) + grain[grain_y : grain_y + height, grain_x : grain_x + width, None]
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")

    buffer = io.BytesIO()
    jpeg = dict(format="JPEG", quality=quality, subsampling=subsampling)
    if spec.quirk == "png_as_jpeg":
        image.save(buffer, format="PNG")
    elif spec.quirk == "cmyk":
        image.convert("CMYK").save(buffer, **jpeg)
    elif spec.quirk == "grayscale":
        image.convert("L").save(buffer, **jpeg)
    elif spec.quirk == "exif_rotated":
        # Orientation 6 means "rotate 90 degrees clockwise to display": store it turned the other way.
        image = image.transpose(Image.Transpose.ROTATE_90)
        exif = Image.Exif()
        exif[EXIF_ORIENTATION_TAG] = 6
        image.save(buffer, exif=exif.tobytes(), **jpeg)
    elif spec.quirk:
        raise ValueError(f"unknown quirk {spec.quirk!r}")
    else:
        image.save(buffer, **jpeg)
    return RenderedImage(
        spec, buffer.getvalue(), image.width, image.height, photos[choice],
        tuple(round(v, 1) for v in box), flip, quality, "4:4:4" if subsampling == 0 else "4:2:0",
        max_scale < 1,
    )


def render_class(task):
    """Worker: all images of one class (the photos are decoded once per class)."""
    seed, photo_paths, photo_rels, specs = task
    images = []
    for path in photo_paths:
        try:
            images.append(load_photo(path))
        except Exception as error:
            raise SampleDatasetError(f"cannot decode photo {path}: {type(error).__name__}: {error}") from error
    grain = grain_field(seed)
    return [render_image(seed, spec, photo_rels, images, grain) for spec in specs]


# ---------------------------------------------------------------- plan


@dataclass
class Plan:
    wnids: list
    devkit: list  # devkit number - 1 -> class index
    class_photos: list  # class index -> [Photo]
    shared_photos: bool
    specs: list  # class index -> [ImageSpec] (train first, then validation)
    val_labels: list  # validation number - 1 -> class index
    quirks: list = field(default_factory=list)  # ImageSpecs with a quirk
    devkit_id: dict = field(default_factory=dict)  # class index -> devkit number (1-based)

    def __post_init__(self):
        self.devkit_id = {c: n + 1 for n, c in enumerate(self.devkit)}


def make_plan(photos, classes, train_per_class, val_per_class, seed, quirks) -> Plan:
    groups = group_near_duplicates(photos)
    class_photos, shared = assign_photos_to_classes(groups, classes, np.random.default_rng([seed, 1]))
    wnids = make_wnids(classes)
    rng = np.random.default_rng([seed, 2])
    # Validation: numbered 1..N, classes interleaved at random as in ILSVRC2012.
    val_labels = [int(c) for c in rng.permutation(np.repeat(np.arange(classes), val_per_class))]
    train_quirks, val_quirks = {}, {}
    if quirks:
        for k, kind in enumerate(QUIRK_KINDS):
            class_index = k % classes
            slot = k // classes
            if slot >= train_per_class:
                raise SampleDatasetError(
                    f"--quirks needs {math.ceil(len(QUIRK_KINDS) / classes)} train images per class "
                    f"with {classes} classes; got --train-per-class {train_per_class}")
            train_quirks[(class_index, slot)] = kind
        for number, kind in enumerate(VAL_QUIRKS[: len(val_labels)]):
            val_quirks[number] = kind
    specs = [[] for _ in range(classes)]
    for c, wnid in enumerate(wnids):
        for k, number in enumerate(train_file_numbers(train_per_class, rng)):
            specs[c].append(ImageSpec(TRAIN_DIR, f"{wnid}_{number}.JPEG", c, k, train_quirks.get((c, k), "")))
    seen = [0] * classes
    for number, c in enumerate(val_labels):
        name = VAL_VALUE_FORMAT.format(number + 1) + ".JPEG"
        specs[c].append(ImageSpec(VAL_DIR, name, c, seen[c], val_quirks.get(number, "")))
        seen[c] += 1
    plan = Plan(wnids, devkit_order(classes), class_photos, shared, specs, val_labels)
    plan.quirks = [s for class_specs in specs for s in class_specs if s.quirk]
    return plan


# ---------------------------------------------------------------- output


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


def folder_path(spec: ImageSpec, wnid: str) -> str:
    return f"{spec.split}/{wnid}/{spec.name}"


def archive_path(spec: ImageSpec, wnid: str) -> str:
    if spec.split == TRAIN_DIR:
        return f"{TRAIN_TAR}/{wnid}.tar/{spec.name}"
    return f"{VAL_TAR}/{spec.name}"


def _stem(name: str) -> str:
    return name.rsplit(".", 1)[0]


def _split_stats(items):
    """Count, mean bytes and mean size of (bytes, width, height, ...) tuples."""
    if not items:
        return {"images": 0, "mean_bytes": 0.0, "mean_width": 0.0, "mean_height": 0.0}
    return {
        "images": len(items),
        "mean_bytes": round(sum(item[0] for item in items) / len(items), 1),
        "mean_width": round(sum(item[1] for item in items) / len(items), 1),
        "mean_height": round(sum(item[2] for item in items) / len(items), 1),
    }


def build_sample_dataset(out, classes=10, train_per_class=100, val_per_class=20, seed=0, photos=None,
                         quirks=False, layouts=LAYOUTS, workers=None) -> dict:
    """Build the sample dataset in `out` (see the module docstring); return its summary.

    `photos`: a folder searched recursively for *.jpg/*.jpeg/*.png (default: the bundled
    datasets/photos). `layouts`: any of "folder", "archive". `workers`: processes that render
    images (default: one per core, at most one per class, or 1 below PARALLEL_FROM_IMAGES images);
    the bytes do not depend on it.
    """
    started = time.perf_counter()
    out = Path(out)
    layouts = tuple(dict.fromkeys(layouts))
    for name, value, low in (("classes", classes, 1), ("train_per_class", train_per_class, 1),
                             ("val_per_class", val_per_class, 0), ("seed", seed, 0)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
            raise SampleDatasetError(f"{name} must be an integer >= {low}, got {value!r}")
    if not layouts or any(layout not in LAYOUTS for layout in layouts):
        raise SampleDatasetError(f"layouts must be a non-empty subset of {LAYOUTS}, got {layouts!r}")
    photo_folder = Path(photos) if photos is not None else DEFAULT_PHOTOS
    photo_list, skipped_photos = find_photos(photo_folder, exclude=out)
    for item in skipped_photos:
        print(f"warning: skipping unreadable photo {photo_folder / item['path']}: {item['reason']}", file=sys.stderr)
    plan = make_plan(photo_list, classes, train_per_class, val_per_class, seed, quirks)

    prepare_output(out)
    photos_label = "datasets/photos (bundled)" if photos is None else str(photos)
    params = {"classes": classes, "train_per_class": train_per_class, "val_per_class": val_per_class,
              "seed": seed, "photos": photos_label, "quirks": bool(quirks), "layouts": list(layouts)}
    atomic_write_json(out / INFO_JSON, {"builder": "datasets.sample", "complete": False, "parameters": params})
    staging = out / STAGING_DIR  # per-class train tars; validation images when there is no folder layout
    (staging / "train").mkdir(parents=True)
    (staging / "validation").mkdir()

    tasks = [(seed, [p.path for p in plan.class_photos[c]], [p.rel for p in plan.class_photos[c]], plan.specs[c])
             for c in range(classes)]
    if workers is None:  # a process pool only pays off beyond a few hundred images
        total = classes * (train_per_class + val_per_class)
        workers = min(os.cpu_count() or 1, classes) if total >= PARALLEL_FROM_IMAGES else 1
    rows, val_files = [], {}
    stats = {TRAIN_DIR: [], VAL_DIR: []}  # (bytes, width, height, source photo, upscaled); not the data
    executor = ProcessPoolExecutor(max_workers=workers) if workers > 1 else None
    try:
        # One class at a time, in class order, so memory holds one class's images at most.
        results = executor.map(render_class, tasks) if executor else map(render_class, tasks)
        for c, rendered in enumerate(results):
            wnid = plan.wnids[c]
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
                stats[r.spec.split].append((len(r.data), r.width, r.height, r.source, r.upscaled))
                rows.append(_csv_row(r, wnid, plan))
            if "archive" in layouts:
                with TarShardWriter(staging / "train" / f"{wnid}.tar") as writer:
                    for r in sorted((r for r in rendered if r.spec.split == TRAIN_DIR), key=lambda r: r.spec.name):
                        writer.add_members(_stem(r.spec.name), [("JPEG", r.data)])
    finally:
        if executor:
            executor.shutdown(cancel_futures=True)

    if "archive" in layouts:
        with TarShardWriter(out / TRAIN_TAR) as writer:
            for wnid in plan.wnids:
                inner = staging / "train" / f"{wnid}.tar"
                writer.add_members(wnid, [("tar", inner.read_bytes())])
        with TarShardWriter(out / VAL_TAR) as writer:
            for name in sorted(val_files):
                writer.add_members(_stem(name), [("JPEG", val_files[name].read_bytes())])
    shutil.rmtree(staging)

    devkit_number = plan.devkit_id
    atomic_write_bytes(out / GROUND_TRUTH, "".join(f"{devkit_number[c]}\n" for c in plan.val_labels).encode())
    atomic_write_bytes(out / SYNSETS, "".join(
        f"{plan.wnids[c]} {class_words(plan.class_photos[c])}\n" for c in plan.devkit).encode())
    rows.sort(key=lambda row: (row["split"] != TRAIN_DIR, row["name"]))
    atomic_write_bytes(out / IMAGES_CSV, _csv_bytes(rows))
    quirk_records = [_quirk_record(s, plan.wnids[s.class_index], layouts) for s in plan.quirks]
    if quirks:
        atomic_write_json(out / QUIRKS_JSON, quirk_records)
    attribution = photo_folder / "ATTRIBUTION.md"
    if attribution.is_file():
        shutil.copyfile(attribution, out / PHOTO_ATTRIBUTION)

    everything = stats[TRAIN_DIR] + stats[VAL_DIR]
    sides = [side for _, width, height, _, _ in everything for side in (width, height)]
    summary = {
        "parameters": params,
        "splits": {split: _split_stats(items) for split, items in stats.items()},
        "all": _split_stats(everything),
        "imagenet_mean_bytes": IMAGENET_MEAN_BYTES,
        "min_side": min(sides),
        "max_side": max(sides),
        "sides_300_500": round(sum(300 <= s <= 500 for s in sides) / len(sides), 3),
        "upscaled": sum(upscaled for *_, upscaled in everything),
        "photos_found": len(photo_list),
        "photos_used": len({source for _, _, _, source, _ in everything}),
        "photos_skipped": skipped_photos,
        "shared_photos": plan.shared_photos,
        "classes": [{"index": c, "wnid": wnid, "devkit_id": devkit_number[c],
                     "photos": [p.rel for p in plan.class_photos[c]]} for c, wnid in enumerate(plan.wnids)],
        "quirks": quirk_records,
    }
    atomic_write_json(out / INFO_JSON, {"builder": "datasets.sample", "complete": True, **summary})
    summary["out"] = str(out)
    summary["elapsed_s"] = round(time.perf_counter() - started, 2)
    return summary


def class_words(photos) -> str:
    """A human-readable class description: its source photos' names."""
    names = sorted({Path(p.rel).stem for p in photos})
    return ", ".join(names[:5]) + (f", ... ({len(names)} photos)" if len(names) > 5 else "")


CSV_FIELDS = ("split", "name", "wnid", "class_index", "devkit_id", "source_photo", "crop_box", "flip",
              "quality", "subsampling", "quirk", "width", "height", "upscaled", "bytes", "sha256")


def _csv_row(r: RenderedImage, wnid: str, plan: Plan) -> dict:
    return {"split": r.spec.split, "name": r.spec.name, "wnid": wnid, "class_index": r.spec.class_index,
            "devkit_id": plan.devkit_id[r.spec.class_index], "source_photo": r.source,
            "crop_box": " ".join(f"{v:.1f}" for v in r.box), "flip": int(r.flip), "quality": r.quality,
            "subsampling": r.subsampling, "quirk": r.spec.quirk, "width": r.width, "height": r.height,
            "upscaled": int(r.upscaled), "bytes": len(r.data), "sha256": sha256_bytes(r.data)}


def _csv_bytes(rows) -> bytes:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode()


def _quirk_record(spec: ImageSpec, wnid: str, layouts) -> dict:
    record = {"kind": spec.quirk, "split": spec.split, "wnid": wnid, "class_index": spec.class_index,
              "name": spec.name, "detail": QUIRK_DETAILS[spec.quirk]}
    if "folder" in layouts:
        record["folder_path"] = folder_path(spec, wnid)
    if "archive" in layouts:
        record["archive_path"] = archive_path(spec, wnid)
    return record


# ---------------------------------------------------------------- report and CLI


def format_summary(summary: dict) -> str:
    splits = summary["splits"]
    overall = summary["all"]
    params = summary["parameters"]
    lines = [
        f"sample dataset in {summary['out']}: {params['classes']} classes, layouts {'+'.join(params['layouts'])}, "
        f"seed {params['seed']}, photos {params['photos']}",
    ]
    for split in (TRAIN_DIR, VAL_DIR):
        s = splits[split]
        lines.append(f"  {split:<10} {s['images']:>7} images  mean {s['mean_bytes'] / 1000:6.1f} KB  "
                     f"mean {s['mean_width']:.0f}x{s['mean_height']:.0f} px")
    lines.append(
        f"  all        {overall['images']:>7} images  mean {overall['mean_bytes'] / 1000:6.1f} KB "
        f"(ImageNet ~{IMAGENET_MEAN_BYTES // 1000} KB: {overall['mean_bytes'] / IMAGENET_MEAN_BYTES:.0%})  "
        f"mean {overall['mean_width']:.0f}x{overall['mean_height']:.0f} px, sides {summary['min_side']}-"
        f"{summary['max_side']} px ({summary['sides_300_500']:.0%} in 300-500), JPEG quality {QUALITY[0]}-{QUALITY[1]}")
    photo_note = (f"  photos: {summary['photos_used']} used of {summary['photos_found']} found"
                  f", {summary['upscaled']} images upscaled from small photos")
    if summary["photos_skipped"]:
        photo_note += f", {len(summary['photos_skipped'])} unreadable photos skipped"
    if summary["shared_photos"]:
        photo_note += "; fewer distinct photos than classes: some classes share photos"
    lines.append(photo_note)
    if summary["quirks"]:
        lines.append("  quirks:   " + "; ".join(
            f"{q['kind']} {q['split']}/{q['name']}" for q in summary["quirks"]) + f"  (see {QUIRKS_JSON})")
    lines.append(f"  built in {summary['elapsed_s']:.1f} s")
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m datasets.sample",
        description="Build a small ImageNet-like dataset (extracted folders and/or the downloaded tar "
                    "archives with a ground-truth file) from real photos.")
    parser.add_argument("--out", required=True, help="output folder (new or empty, or one this builder made)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--photos", default=None,
                        help="folder of photos, searched recursively for *.jpg/*.jpeg/*.png "
                             "(default: the bundled datasets/photos; ../shared/photos has more)")
    parser.add_argument("--quirks", action="store_true",
                        help="inject ImageNet's quirks: PNG named .JPEG, CMYK, grayscale, EXIF-rotated")
    parser.add_argument("--layout", choices=("folder", "archive", "both"), default="both")
    parser.add_argument("--workers", type=int, default=None, help="rendering processes (default: one per core)")
    args = parser.parse_args(argv)
    for name in ("classes", "train_per_class"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.val_per_class < 0:
        parser.error(f"--val-per-class must be >= 0, got {args.val_per_class}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    layouts = LAYOUTS if args.layout == "both" else (args.layout,)
    try:
        summary = build_sample_dataset(args.out, args.classes, args.train_per_class, args.val_per_class, args.seed,
                                       args.photos, args.quirks, layouts, args.workers)
    except (SampleDatasetError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
