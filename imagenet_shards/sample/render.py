"""Image synthesis: one ImageNet-like JPEG from a crop of a class's photo, and the quirks.

render_class is the worker (one class per call, its photos decoded once); render_image draws
everything about one image from its own generator, seeded with (seed, split, class, index), so
the bytes depend on neither the number of workers nor the order they run in. The statistics
below are ImageNet's (see the package docstring); a quirk changes only how the image is encoded.
"""

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from imagenet_shards.sample.names import EXIF_ORIENTATION_TAG, TRAIN_DIR, VAL_DIR, ImageSpec, SampleDatasetError
from imagenet_shards.sample.photos import load_photo

# Image statistics (see the package docstring).
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

QUIRK_KINDS = ("png_as_jpeg", "cmyk", "grayscale", "exif_rotated")
QUIRK_DETAILS = {
    "png_as_jpeg": "PNG data under a .JPEG name (ImageNet train: n02105855_2933.JPEG)",
    "cmyk": "CMYK JPEG (ImageNet train holds 22)",
    "grayscale": "single-channel (mode L) JPEG",
    "exif_rotated": "pixels stored rotated 90 degrees, EXIF Orientation 6; exif_transpose gives the upright image",
}
VAL_QUIRKS = ("grayscale",)

_SPLIT_CODES = {TRAIN_DIR: 1, VAL_DIR: 2}


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
