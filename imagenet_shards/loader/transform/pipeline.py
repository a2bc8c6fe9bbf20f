"""Decode and augment one sample straight into its slot of a uint8 batch: the functional core.

Pipelines (torchvision semantics, sizes configurable):
    train:      RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip
    validation: Resize(resize) + CenterCrop(size)

Steps that the converter already applied (metadata.json's `<split>_transform_pipeline`) are
skipped when they are exactly the first runtime steps: a validation split stored as
Resize(256) + CenterCrop(224) is copied into the batch as it is. A stored step that the runtime
steps would upsample or undo is reported by `plan_steps` (the loader warns).

Where the time goes, and why it is done this way:
  * JPEG decode dominates (~1 ms for an ImageNet-sized image). `Image.draft` makes libjpeg
    decode at 1/2, 1/4 or 1/8 scale when the crop is at least twice the output size, which is
    several times cheaper. Draft's DCT scaling gives slightly different pixels than decoding at
    full size and resizing: same geometry, different filter.
  * Crop + resize is one PIL call (`resize(..., box=...)`), with PIL's antialiased bilinear
    filter, as torchvision does on PIL images.
  * Train JPEGs are decoded only where the crop needs pixels (`decode_path == "crop"`, the
    default where native/jpeg_crop is built; see imagenet_shards.loader.transform.jpeg_crop): the same box, the
    same DCT scale as draft, the same resize on an image of the same geometry, so the output is
    the whole-image path's, pixel for pixel. CMYK/YCCK, non-JPEG data and data libjpeg rejects
    take the whole-image PIL path.
  * Validation's Resize + CenterCrop of a JPEG is one fused step in `image_into`
    (`_center_crop_decoded`): only the MCU rows and columns under the crop (widened by the
    filter's support) are decoded, at draft's DCT scale, and of the whole image's resize only
    the crop's window is computed (native, PIL's arithmetic), straight into the slot: the
    whole-image path's pixels, without the ~43% of a 4:3 image it threw away.
  * The result is written once into the batch: the HWC -> CHW transpose and the horizontal flip
    are done by that one strided copy. `tensor` payloads are read as zero-copy views
    (`decode_npy`), so a stored-at-size validation sample is copied exactly once.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np
from PIL import Image

from imagenet_shards.formats.npy import decode_npy
from imagenet_shards.loader.transform import jpeg_crop
from imagenet_shards.pixel_limit import VARIABLE, ImageTooLargeError, check_pixels, max_pixels
from imagenet_shards.preprocess import CenterCrop, RandomHorizontalFlip, RandomResizedCrop, Resize, Step
from imagenet_shards.errors import Error

RESIZE, CENTER_CROP, RANDOM_RESIZED_CROP, FLIP = (
    Resize.name, CenterCrop.name, RandomResizedCrop.name, RandomHorizontalFlip.name)


class PipelineError(Error, ValueError):
    """A stored or requested step the pipeline cannot handle."""


def runtime_steps(train: bool, size: int, resize: int) -> list:
    if train:
        return [RandomResizedCrop(size), RandomHorizontalFlip()]
    return [Resize(resize), CenterCrop(size)]


def plan_steps(train: bool, size: int, resize: int, stored: Sequence[Step], wanted=None):
    """(steps still to run, warnings) given the steps the converter already applied; `wanted`:
    the runtime steps, default `runtime_steps(train, size, resize)`."""
    wanted = runtime_steps(train, size, resize) if wanted is None else list(wanted)
    stored = list(stored)
    warnings = []
    if stored and stored == wanted[: len(stored)]:
        return wanted[len(stored):], warnings
    if not wanted:
        return wanted, warnings
    # What the stored images look like: the short side after a Resize, both sides after a CenterCrop.
    short_side, square = None, False
    for step in stored:
        if step.name == RESIZE and isinstance(step.size, int):
            short_side, square = step.size, False
        elif step.name == CENTER_CROP and isinstance(step.size, int):
            short_side = step.size if short_side is None else min(short_side, step.size)
            square = True
        else:
            warnings.append(f"stored step {step} is not understood; the runtime pipeline runs in full")
    remaining = wanted
    first = remaining[0]
    where = f"stored images ({' + '.join(map(str, stored))})"
    if short_side is not None:
        if first.name == RESIZE and short_side < first.size:
            warnings.append(f"{where} have a short side of {short_side} px: the runtime {first} upsamples them")
        elif first.name == RESIZE and short_side > first.size:
            warnings.append(f"the runtime {first} undoes the stored {stored[-1]} (resamples the images again)")
        if first.name == RANDOM_RESIZED_CROP and short_side < first.size:
            warnings.append(
                f"{where} have a short side of {short_side} px: the runtime {first} upsamples even its "
                f"largest crops to {first.size} px"
            )
    return remaining, warnings


def random_resized_crop_box(width: int, height: int, scale, ratio, rng):
    """torchvision's RandomResizedCrop.get_params, drawing from `rng` (a random.Random).

    Returns (top, left, height, width) in the image's pixel coordinates.
    """
    area = width * height
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_low, log_high))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


BBOX_MIN_OVERLAP = 0.1  # of the crop's area (the reference harness's intent)
BBOX_DRAWS = 10


def bbox_crop_box(width: int, height: int, scale, ratio, rng, bbox, min_overlap=BBOX_MIN_OVERLAP, draws=BBOX_DRAWS,
                  draw=None):
    """`random_resized_crop_box`, drawn again (up to `draws` times) until the crop's overlap with
    `bbox` (normalised [x1, y1, x2, y2]) is at least `min_overlap` of the crop's area; the last
    draw if none is. The overlap is the x extent of the intersection times its y extent (the
    reference harness multiplies an x extent by another x extent). `draw(width, height)`, if
    given, draws the boxes instead (a user's torchvision RandomResizedCrop)."""
    x1, y1, x2, y2 = bbox[0] * width, bbox[1] * height, bbox[2] * width, bbox[3] * height
    for _ in range(draws):
        box = top, left, h, w = (draw(width, height) if draw is not None
                                 else random_resized_crop_box(width, height, scale, ratio, rng))
        overlap_w = min(left + w, x2) - max(left, x1)
        overlap_h = min(top + h, y2) - max(top, y1)
        if overlap_w > 0 and overlap_h > 0 and overlap_w * overlap_h >= min_overlap * w * h:
            return box
    return box


def resized_size(width: int, height: int, short: int):
    """torchvision Resize(int): the short side becomes `short`, the long side keeps the aspect."""
    if width <= height:
        return short, int(short * height / width)
    return int(short * width / height), short


def center_crop_offsets(width: int, height: int, size: int):
    return int(round((height - size) / 2.0)), int(round((width - size) / 2.0))


@dataclass(frozen=True)
class ImagePipeline:
    """The steps still to run for one split, applied to one sample at a time."""

    train: bool
    size: int = 224
    resize: int = 256
    scale: tuple = (0.08, 1.0)
    ratio: tuple = (3 / 4, 4 / 3)
    steps: tuple = ()  # names of the runtime steps still to run (after skipping stored ones)
    use_draft: bool = True
    # "crop": decode only the JPEG region a train crop or validation center crop needs; "pil": whole images.
    decode_path: str = field(default_factory=jpeg_crop.decode_path)
    # the most pixels an image may claim (imagenet_shards.pixel_limit), read once where the pipeline is made
    pixel_limit: int = field(default_factory=max_pixels, compare=False)
    # A user's torchvision transform begins with these steps (imagenet_shards/loader/transform/user_transforms.py):
    # False resamples as today (the filter may read pixels just outside the crop box); True as
    # torchvision does (crop, then resize: only pixels inside the box), for the same pixels as it.
    crop_edges: bool = False
    # None: boxes and flips drawn from the `rng` argument (random.Random); else an object whose
    # box(width, height) and flip() draw them as the user's transform would (torch's generator).
    draws: Optional[object] = field(default=None, compare=False)

    @classmethod
    def build(cls, train, size=224, resize=256, stored=(), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
              use_draft=True, decode_path=None, wanted=None):
        """`decode_path` None: "crop" where native/jpeg_crop is built (unless DATASETS_JPEG_DECODE=pil).
        `wanted`: the runtime steps (default `runtime_steps(train, size, resize)`); () decodes whole images."""
        if decode_path not in (None, jpeg_crop.CROP, jpeg_crop.PIL_FULL):
            raise PipelineError(f"decode path {decode_path!r}: expected {jpeg_crop.CROP!r} or {jpeg_crop.PIL_FULL!r}")
        if decode_path == jpeg_crop.CROP and not jpeg_crop.available():
            raise PipelineError(f"the crop decode path is not available: {jpeg_crop.UNAVAILABLE_REASON}")
        remaining, warnings = plan_steps(train, size, resize, stored, wanted)
        return cls(train, size, resize, tuple(scale), tuple(ratio), tuple(s.name for s in remaining),
                   use_draft, decode_path or jpeg_crop.decode_path()), warnings

    # -- encoded images (JPEG, PNG...) -------------------------------------------------------------

    def crop_box(self, width, height, rng, bbox=None):
        """RandomResizedCrop's box; with a bounding box, one that overlaps it (`bbox_crop_box`)."""
        draw = self.draws.box if self.draws is not None else None
        if bbox is None:
            return draw(width, height) if draw else random_resized_crop_box(width, height, self.scale, self.ratio, rng)
        return bbox_crop_box(width, height, self.scale, self.ratio, rng, bbox, draw=draw)

    def flip_draw(self, rng) -> bool:
        """Whether this sample is flipped (a draw only when the steps hold the flip)."""
        if FLIP not in self.steps:
            return False
        return self.draws.flip() if self.draws is not None else rng.random() < 0.5

    def image_into(self, payload, slot: np.ndarray, rng, bbox=None) -> None:
        """Decode `payload` and write the processed image into `slot` (an HWC-shaped uint8 view).
        `bbox` (normalised [x1, y1, x2, y2]): RandomResizedCrop prefers crops overlapping it."""
        if RANDOM_RESIZED_CROP in self.steps:
            self._random_crop_into(payload, slot, rng, bbox)
            return
        if self._center_crop_decoded(payload, slot):
            return  # validation's fused path (no draws): decoded and resized straight into the slot
        write_pixels(slot, *self.image_pixels(payload, rng, bbox))

    def image_pixels(self, payload, rng, bbox=None):
        """(HWC uint8 pixels, flip): `image_into`'s result before the flip and the write; with no
        steps, the whole decoded RGB image."""
        if RANDOM_RESIZED_CROP in self.steps:
            pixels = np.empty((self.size, self.size, 3), np.uint8)
            return pixels, self._random_crop_into(payload, pixels, rng, bbox, mirror=False)
        image = open_image(payload, self.pixel_limit)
        if RESIZE in self.steps:
            width, height = resized_size(*image.size, self.resize)
            image = _rgb(self._draft(image, width, height))
            if image.size != (width, height):
                image = image.resize((width, height), Image.BILINEAR)
        else:
            image = _rgb(image)
        pixels = np.asarray(image)
        if CENTER_CROP in self.steps:
            pixels = _center_crop(pixels, self.size)
        return pixels, False

    def _random_crop_into(self, payload, slot: np.ndarray, rng, bbox=None, mirror: bool = True) -> bool:
        """RandomResizedCrop of an encoded image into `slot`, mirrored if the flip is drawn (and
        `mirror`); returns the flip draw. A JPEG decoded natively is resized straight into the slot
        (`_crop_region`, native resize: no intermediate image); others take `_decoded_then_cropped`.
        The draws (box, then flip after the decode) are the same on both paths."""
        size = jpeg_crop.jpeg_size(payload, self.pixel_limit) if self.decode_path == jpeg_crop.CROP else None
        image = None if size is not None else open_image(payload, self.pixel_limit)
        width, height = size or image.size
        box = self.crop_box(width, height, rng, bbox)
        region = None
        if size is not None:
            try:
                region = self._crop_region(payload, width, height, box)
            except jpeg_crop.JpegError:
                pass  # PIL decodes it below, or reports it in its own words, as on the whole-image path
        if region is None:
            pixels = self._decoded_then_cropped(image or open_image(payload, self.pixel_limit), width, height, box)
            flip = self.flip_draw(rng)
            write_pixels(slot, pixels, flip and mirror)
            return flip
        flip = self.flip_draw(rng)
        check_slot(slot, (self.size, self.size, 3))
        canvas, resize_box, cut = region
        canvas.resize_into(slot, (self.size, self.size), resize_box, flip=flip and mirror, cut=cut)
        return flip

    def _decoded_then_cropped(self, image, width, height, box) -> np.ndarray:
        """The whole-image path: (draft-scaled) full decode, then crop + resize in one PIL call."""
        top, left, h, w = box
        image = self._draft(image, width * self.size / w, height * self.size / h)
        fx, fy = image.size[0] / width, image.size[1] / height
        box = (left * fx, top * fy, (left + w) * fx, (top + h) * fy)
        if self.crop_edges:
            image, box = _cropped_to(image, box)
        return np.asarray(_rgb(image).resize((self.size, self.size), Image.BILINEAR, box=box))

    def _crop_region(self, payload, width, height, box):
        """The region path's decode: (Canvas, resize box, cut or None) such that
        `canvas.resize_into(out, (size, size), resize_box, cut=cut)` gives what `_decoded_then_cropped`
        returns, decoding only the pixels the resize reads.

        Same DCT scale as `_draft` picks, same scaled image size, same box: the resize runs on an
        image of the same geometry (see imagenet_shards.loader.transform.jpeg_crop); with `crop_edges`, on the same
        cut as `_cropped_to`. None if the colour space is not decoded natively.
        """
        top, left, h, w = box
        want_width, want_height = width * self.size / w, height * self.size / h
        scale = 1
        if self.use_draft and width >= 2 * want_width and height >= 2 * want_height:
            scale = jpeg_crop.dct_scale(width, height, want_width, want_height)
        scaled_width, scaled_height = -(-width // scale), -(-height // scale)
        fx, fy = scaled_width / width, scaled_height / height
        resize_box = (left * fx, top * fy, (left + w) * fx, (top + h) * fy)
        cut = None
        if self.crop_edges:  # only the box's pixels, and a margin for the cut's outermost ones
            cut = x0, y0, x1, y1 = _enclosing(resize_box)
            resize_box = (resize_box[0] - x0, resize_box[1] - y0, resize_box[2] - x0, resize_box[3] - y0)
            x0, y0 = max(0, x0 - jpeg_crop.EDGE_MARGIN), max(0, y0 - jpeg_crop.EDGE_MARGIN)
            x1, y1 = min(scaled_width, x1 + jpeg_crop.EDGE_MARGIN), min(scaled_height, y1 + jpeg_crop.EDGE_MARGIN)
        else:
            x0, x1 = jpeg_crop.resample_span(resize_box[0], resize_box[2], self.size, scaled_width)
            y0, y1 = jpeg_crop.resample_span(resize_box[1], resize_box[3], self.size, scaled_height)
        decoded = jpeg_crop.decode_canvas(payload, scale, x0, y0, x1, y1, size=(width, height))
        return None if decoded is None else (decoded, resize_box, cut)

    def _crop_decoded(self, payload, width, height, box, out=None, flip=False) -> Optional[np.ndarray]:
        """The region path's output for `box` (into `out`, else a new array; mirrored if `flip`):
        `_decoded_then_cropped`'s pixels. None if the colour space is not decoded natively."""
        region = self._crop_region(payload, width, height, box)
        if region is None:
            return None
        out = np.empty((self.size, self.size, 3), np.uint8) if out is None else out
        canvas, resize_box, cut = region
        canvas.resize_into(out, (self.size, self.size), resize_box, flip=flip, cut=cut)
        return out

    def _center_crop_decoded(self, payload, slot: np.ndarray) -> bool:
        """Validation's fused path: Resize + CenterCrop (or CenterCrop alone) of a JPEG into `slot`,
        decoding only the MCU rows and columns under the crop (widened by the filter's support) at
        the DCT scale `_draft` picks, and resizing only the crop: of the whole scaled image's
        resize to the Resize size, the center window is computed, so the pixels are the
        whole-image path's. False (nothing written) where that path must run instead: PIL
        decode, not a natively decoded JPEG, data libjpeg rejects, an image smaller than the crop
        or a slot of another size (that path reports those).
        """
        if self.decode_path != jpeg_crop.CROP or CENTER_CROP not in self.steps or \
                slot.shape != (self.size, self.size, 3):
            return False
        size = jpeg_crop.jpeg_size(payload, self.pixel_limit)
        if size is None:
            return False
        width, height = size
        resize = RESIZE in self.steps
        out_width, out_height = resized_size(width, height, self.resize) if resize else size
        if out_width < self.size or out_height < self.size:
            return False
        scale = 1
        if resize and self.use_draft and width >= 2 * out_width and height >= 2 * out_height:
            scale = jpeg_crop.dct_scale(width, height, out_width, out_height)
        scaled_width, scaled_height = -(-width // scale), -(-height // scale)
        top, left = center_crop_offsets(out_width, out_height, self.size)
        fx, fy = scaled_width / out_width, scaled_height / out_height
        x0, x1 = jpeg_crop.resample_span(left * fx, (left + self.size) * fx, self.size, scaled_width)
        y0, y1 = jpeg_crop.resample_span(top * fy, (top + self.size) * fy, self.size, scaled_height)
        try:
            decoded = jpeg_crop.decode_canvas(payload, scale, x0, y0, x1, y1, size=size)
        except jpeg_crop.JpegError:
            return False
        if decoded is None:
            return False
        decoded.resize_into(slot, (out_width, out_height), offset=(left, top))
        return True

    def _draft(self, image, want_width, want_height):
        """Let libjpeg decode at 1/2, 1/4 or 1/8 scale when that still leaves enough pixels."""
        if self.use_draft and image.format == "JPEG":
            width, height = image.size
            if width >= 2 * want_width and height >= 2 * want_height:
                image.draft("RGB", (max(1, math.ceil(want_width)), max(1, math.ceil(want_height))))
        return image

    # -- decoded arrays (`tensor` format, synthetic data) -----------------------------------------

    def array_into(self, pixels: np.ndarray, slot: np.ndarray, rng, bbox=None) -> None:
        """Process an HWC uint8 array (a read-only view is fine) into `slot`."""
        write_pixels(slot, *self.array_pixels(pixels, rng, bbox))

    def array_pixels(self, pixels: np.ndarray, rng, bbox=None):
        """(HWC uint8 pixels, flip): `array_into`'s result before the flip and the write."""
        if pixels.ndim != 3 or pixels.shape[2] != 3:
            raise PipelineError(f"expected an HWC array with 3 channels, got shape {pixels.shape}")
        flip = False
        if RANDOM_RESIZED_CROP in self.steps:
            height, width = pixels.shape[:2]
            top, left, h, w = self.crop_box(width, height, rng, bbox)
            flip = self.flip_draw(rng)
            if (h, w) == (self.size, self.size):
                pixels = pixels[top:top + h, left:left + w]  # a crop at output size needs no resampling
            else:  # with crop_edges, torchvision's crop, then resize
                pixels = array_resized(pixels, (self.size, self.size), (left, top, left + w, top + h),
                                       cut=self.crop_edges)
        else:
            cropped = False
            if RESIZE in self.steps:
                height, width = pixels.shape[:2]
                target = resized_size(width, height, self.resize)
                if target != (width, height):
                    window = None
                    if CENTER_CROP in self.steps and min(target) >= self.size:  # only the crop's window is resized
                        top, left = center_crop_offsets(*target, self.size)
                        window, cropped = (left, top, self.size, self.size), True
                    pixels = array_resized(pixels, target, window=window)
            if CENTER_CROP in self.steps and not cropped:
                pixels = _center_crop(pixels, self.size)
        return pixels, flip

    def tensor_into(self, payload, layout: str, slot: np.ndarray, rng, bbox=None) -> None:
        self.array_into(tensor_array(payload, layout), slot, rng, bbox)


def tensor_array(payload, layout: str) -> np.ndarray:
    """A `.npy` payload as an HWC uint8 view (`layout` "CHW" is transposed, not copied)."""
    array = decode_npy(payload)
    return array.transpose(1, 2, 0) if layout == "CHW" else array


def array_resized(pixels: np.ndarray, size: tuple, box: Optional[tuple] = None, cut: bool = False,
                  window: Optional[tuple] = None) -> np.ndarray:
    """PIL's `Image.fromarray(pixels).resize(size, Image.BILINEAR, box=box)` of an HWC uint8 array (any
    strides), or with `cut`, of the array cut to the (integer) box (torchvision's crop, then resize);
    only `window` = (left, top, width, height) of it. Native where `_jpeg_crop` is built (the same
    pixels: only the pixels the resize reads are copied into an RGBX canvas), else PIL."""
    left, top, out_width, out_height = window or (0, 0, *size)
    if not jpeg_crop.available():
        image = Image.fromarray(np.ascontiguousarray(pixels))
        if cut:
            image, box = image.crop(box), None
        resized = np.asarray(image.resize(size, Image.BILINEAR, box=box))
        return resized[top:top + out_height, left:left + out_width]
    height, width = pixels.shape[:2]
    if cut:
        region, box = box, None
    else:
        bx0, by0, bx1, by1 = box or (0, 0, width, height)
        x0, x1 = jpeg_crop.resample_span(bx0, bx1, size[0], width)
        y0, y1 = jpeg_crop.resample_span(by0, by1, size[1], height)
        region = (x0, y0, x1, y1)
    canvas = jpeg_crop.array_canvas(pixels, region)
    out = np.empty((out_height, out_width, 3), np.uint8)
    canvas.resize_into(out, size, box, offset=(left, top), cut=region if cut else None)
    return out


def _enclosing(box) -> tuple:
    """The integer pixel rectangle (x0, y0, x1, y1) that contains a fractional box."""
    return math.floor(box[0]), math.floor(box[1]), math.ceil(box[2]), math.ceil(box[3])


def _cropped_to(image, box):
    """(image cut to the pixels enclosing `box`, `box` in the cut's coordinates): a resize of the
    result reads no pixel outside the box, as torchvision's crop-then-resize (exact for integer boxes)."""
    x0, y0, x1, y1 = _enclosing(box)
    return image.crop((x0, y0, x1, y1)), (box[0] - x0, box[1] - y0, box[2] - x0, box[3] - y0)


def _rgb(image):
    return image if image.mode == "RGB" else image.convert("RGB")


def _center_crop(pixels: np.ndarray, size: int) -> np.ndarray:
    height, width = pixels.shape[:2]
    if height < size or width < size:
        raise PipelineError(f"image of {width}x{height} px is smaller than the {size}x{size} center crop")
    top, left = center_crop_offsets(width, height, size)
    return pixels[top:top + size, left:left + size]


def check_slot(slot: np.ndarray, shape: tuple) -> None:
    """PipelineError unless processed pixels of `shape` fit the batch slot."""
    if tuple(shape) != slot.shape:
        raise PipelineError(
            f"processed image is {shape[1]}x{shape[0]} px, the batch expects "
            f"{slot.shape[1]}x{slot.shape[0]} (stored images of another size than the metadata says?)"
        )


def write_pixels(slot: np.ndarray, pixels: np.ndarray, flip: bool) -> None:
    """Write processed HWC pixels into a batch slot, flipped horizontally by the strided copy."""
    check_slot(slot, pixels.shape)
    slot[...] = pixels[:, ::-1] if flip else pixels


def open_image(payload, limit: Optional[int] = None) -> Image.Image:
    """PIL's image of `payload`, its header read, nothing decoded; ImageTooLargeError over the pixel limit
    (imagenet_shards.pixel_limit: the same limit as the native decoder's, not PIL's warning band)."""
    limit = max_pixels() if limit is None else limit
    if Image.MAX_IMAGE_PIXELS is not None and Image.MAX_IMAGE_PIXELS < limit:
        Image.MAX_IMAGE_PIXELS = limit  # the one setting governs PIL's own guard too (it refuses at twice its own)
    try:
        image = Image.open(io.BytesIO(payload))
    except Image.DecompressionBombError as error:
        raise ImageTooLargeError(f"{error} ({VARIABLE}: {limit:,})") from None
    check_pixels(*image.size, limit)
    return image
