"""A user's torchvision v2 transforms in the loader: `get_data(transform=T, batch_transform=B)`.

Per sample, T:
  * A prefix the loader already does in the decoder runs there, fused: `v2.RandomResizedCrop(S)`
    [+ `v2.RandomHorizontalFlip`] (train), or `v2.Resize(R)` + `v2.CenterCrop(S)` (validation);
    bilinear, antialiased, square S. The box and the flip are drawn by T's own objects
    (`make_params`, `torch.rand`) from torch's generator, in torchvision's order, and the crop is
    resampled as torchvision does (crop, then resize), so with `UserTransform(T, use_draft=False)`
    (imagenet_shards/loader/options.py) the pixels equal T's on a PIL decode (tests/test_user_transforms.py).
    With DCT scaling (`use_draft=True`, the default) the box is the same and crops at least twice the output size are decoded at 1/2 to
    1/8 scale, as the loader's own recipe is (docs/crop-decode.md).
  * The rest of T runs on the uint8 CHW `tv_tensors.Image` the prefix wrote into the batch slot.
  * A T without such a prefix runs on the whole decoded image (uint8 CHW `tv_tensors.Image`).
  * T's output must be a uint8 (3, S, S) tensor (checked once in `get_data` on a blank image); the
    loader then normalises as asked: host -> float32/float16 batches, device -> uint8 batches for
    `NormalizeOnDevice`.

Per batch, B (`v2.MixUp`, `v2.CutMix`, `v2.RandomChoice([...])`, any callable (images, labels) ->
(images, labels)) runs in the worker on each batch, labels as int64 class indices in:
  * host normalisation: on the normalised float batch (MixUp and CutMix commute with the per-channel
    affine normalisation, so this equals mixing the pixels first);
  * device normalisation: on a float32 copy of the uint8 pixels, rounded back into the uint8 batch
    (off by at most 0.5/255 from the float mix), so batches stay uint8 for `NormalizeOnDevice`.
  The labels B returns are the batch's labels: MixUp/CutMix give float32 (N, num_classes) soft
  targets whose rows sum to 1 (torch's CrossEntropyLoss takes them as they are).
  Cost: the float copy and torchvision's full-batch copies, ~1.7 ms per 224 px image on the 2-core
  dev VM (host_benchmark --compare's -strong-mix rows); with device normalisation, MixUp/CutMix on
  the accelerator after NormalizeOnDevice cost the host nothing.

Randomness: T and B draw from torch's global generator, seeded per (seed, epoch, instance, worker)
at the start of each worker's epoch (`TorchRandom.begin`), so an epoch's augmentations repeat
exactly. In a DataLoader worker that generator is the worker's own; with workers=0 it is the
training process's, so its state is swapped in and out around each call, leaving the training
code's random stream as it was.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch.utils.data import get_worker_info

from imagenet_shards.loader.options import UserTransform
from imagenet_shards.loader.transform.pipeline import ImagePipeline, PipelineError, runtime_steps, tensor_array, write_pixels
from imagenet_shards.preprocess import RandomHorizontalFlip as FlipStep, RandomResizedCrop as CropStep
from imagenet_shards.errors import Error


def _v2():
    """torchvision.transforms.v2, imported when a user transform is first used (torchvision's import
    takes seconds; the loader's own recipe does not need it)."""
    from imagenet_shards.torchvision_cpu import transforms_v2

    return transforms_v2


class TransformError(Error, ValueError):
    """A user transform the loader cannot use (its output is not a uint8 (3, S, S) image, sizes disagree)."""


# -- randomness ---------------------------------------------------------------------------------

class TorchRandom:
    """Torch's global CPU generator as a stream of its own, seeded per worker and epoch.

    `with random:` around each use: in a DataLoader worker a no-op (the worker's generator is
    private, seeded once by `begin`); in the main process (workers=0) the stream's state is
    swapped in and back out, so the training code's torch random stream is not disturbed.
    """

    def __init__(self):
        self.state = None
        self.swap = True
        self._saved = None

    def begin(self, text: str) -> None:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        self.swap = get_worker_info() is None
        if self.swap:
            generator = torch.Generator()
            generator.manual_seed(seed)
            self.state = generator.get_state()
        else:  # the CPU generator alone, which the transforms draw from: torch.manual_seed also seeds every
            torch.default_generator.manual_seed(seed)  # accelerator's, ~1.2 ms a batch on the 2-core dev VM

    def __enter__(self):
        if self.swap:
            if self.state is None:
                self.begin("unseeded")
            self._saved = torch.get_rng_state()
            torch.set_rng_state(self.state)
        return self

    def __exit__(self, *exc):
        if self.swap:
            self.state = torch.get_rng_state()
            torch.set_rng_state(self._saved)
        return False


class TorchvisionDraws:
    """A fused prefix's random draws as the user's transform objects make them: the same torch calls
    in the same order from the same generator (tests compare the generator state after each sample
    with torchvision's own). `box` is `v2.RandomResizedCrop.make_params` without its input parsing
    and with reused one-element tensors: the same generator calls at half the cost (torch's per-call
    overhead was ~8% of a JPEG sample's time). For the exact classes only (`split_transform`)."""

    def __init__(self, crop, flip):
        self.crop, self.flip_transform = crop, flip
        self.scale = (crop.scale[0], crop.scale[1])
        # the float32 values it draws between: torchvision's `_log_ratio`, computed alike from the public `ratio`
        log_ratio = torch.log(torch.tensor(crop.ratio))
        self.log_ratio = (float(log_ratio[0]), float(log_ratio[1]))
        self.ratio = (min(crop.ratio), max(crop.ratio))
        # torch.rand(1) < p compares in float32: the same threshold, rounded to float32
        self.flip_p = float(np.float32(flip.p)) if flip is not None else None
        self._uniform = torch.empty(1)  # uniform_ and random_ draw as torch.empty(1)...
        self._integer = torch.empty(1, dtype=torch.int64)  # ...and torch.randint(a, b, (1,)) do

    def box(self, width: int, height: int) -> tuple:
        """(top, left, height, width) for an image of that size."""
        area = height * width
        uniform, integer = self._uniform, self._integer
        for _ in range(10):
            target_area = area * uniform.uniform_(*self.scale).item()
            aspect_ratio = uniform.uniform_(*self.log_ratio).exp_().item()  # in float32, torch's exp kernel
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                return integer.random_(0, height - h + 1).item(), integer.random_(0, width - w + 1).item(), h, w
        in_ratio = float(width) / float(height)  # torchvision's fallback: the central crop
        if in_ratio < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif in_ratio > self.ratio[1]:
            h, w = height, int(round(height * self.ratio[1]))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def flip(self) -> bool:
        # RandomHorizontalFlip.forward: `if torch.rand(1) >= self.p: return inputs`; rand(1) is uniform_() on [0, 1)
        return self.flip_p is not None and self._uniform.uniform_().item() < self.flip_p


# -- the fused prefix ---------------------------------------------------------------------------

@dataclass
class Fusion:
    """How T splits: the runtime steps run in the decoder, and the rest (None: nothing left)."""

    steps: list  # pipeline Steps ([] when nothing is fused: T runs on the whole image)
    size: Optional[int]  # output side fixed by the prefix, or None
    resize: Optional[int]
    scale: tuple
    ratio: tuple
    draws: Optional[TorchvisionDraws]
    rest: object


def _square(size) -> Optional[int]:
    """The side of a square size (int, [s] for Resize's short side, or [s, s]), else None."""
    if isinstance(size, int):
        return size
    size = list(size)
    return size[0] if len(size) == 2 and size[0] == size[1] or len(size) == 1 else None


def _bilinear(t) -> bool:
    return t.interpolation in (_v2().InterpolationMode.BILINEAR, "bilinear") and t.antialias is not False


def split_transform(transform) -> Fusion:
    """Split T into the prefix the decoder runs and the rest (see the module docstring)."""
    v2 = _v2()
    steps = list(transform.transforms) if type(transform) is v2.Compose else [transform]
    first = steps[0] if steps else None
    if type(first) is v2.RandomResizedCrop and _bilinear(first) and _square(first.size):
        size = _square(first.size)
        flip = steps[1] if len(steps) > 1 and type(steps[1]) is v2.RandomHorizontalFlip else None
        rest = steps[2:] if flip is not None else steps[1:]
        wanted = [CropStep(size)] + ([FlipStep()] if flip is not None else [])
        return Fusion(wanted, size, None, tuple(first.scale), tuple(first.ratio), TorchvisionDraws(first, flip),
                      _compose(rest))
    if (type(first) is v2.Resize and len(steps) > 1 and type(steps[1]) is v2.CenterCrop and _bilinear(first)
            and first.max_size is None and isinstance(_square(first.size), int) and len(list(first.size)) == 1
            and _square(steps[1].size)):
        resize, size = _square(first.size), _square(steps[1].size)
        return Fusion(runtime_steps(False, size, resize), size, resize, (0.08, 1.0), (3 / 4, 4 / 3), None,
                      _compose(steps[2:]))
    return Fusion([], None, None, (0.08, 1.0), (3 / 4, 4 / 3), None, transform)


def _compose(steps):
    if not steps:
        return None
    return steps[0] if len(steps) == 1 else _v2().Compose(steps)


def _chw(slot: np.ndarray) -> torch.Tensor:
    """A CHW tensor view of an HWC slot of the batch (writes go into the batch)."""
    return torch.from_numpy(slot).permute(2, 0, 1)


def _image_of(pixels: np.ndarray):
    """HWC uint8 pixels as a CHW `tv_tensors.Image` (a copy only when the array is read-only)."""
    if not pixels.flags.writeable:
        pixels = pixels.copy()
    return _tv_image(torch.from_numpy(pixels).permute(2, 0, 1))


def _tv_image(tensor: torch.Tensor):
    from imagenet_shards.torchvision_cpu import torchvision

    return torchvision.tv_tensors.Image(tensor)


class TransformedPipeline:
    """An `ImagePipeline` (the fused prefix) followed by the rest of a user transform.

    Has the methods the payload kinds call (`image_into`, `array_into`, `tensor_into`) and the
    attributes the loader reads (`size`, `steps`, `decode_path`), so the loader treats it as a pipeline.
    """

    def __init__(self, base: ImagePipeline, rest, fused: bool, random: TorchRandom):
        self.base, self.rest, self.fused, self.random = base, rest, fused, random

    size = property(lambda self: self.base.size)
    steps = property(lambda self: self.base.steps)
    decode_path = property(lambda self: self.base.decode_path)
    train = property(lambda self: self.base.train)
    pixel_limit = property(lambda self: self.base.pixel_limit)

    def image_into(self, payload, slot: np.ndarray, rng, bbox=None) -> None:
        with self.random:
            if self.fused:  # the prefix straight into the slot (resized there, flipped there), as the loader's own
                self.base.image_into(payload, slot, rng, bbox)
                self._rest_in(slot)
            else:
                self._finish(slot, *self.base.image_pixels(payload, rng, bbox))

    def array_into(self, pixels: np.ndarray, slot: np.ndarray, rng, bbox=None) -> None:
        with self.random:
            self._finish(slot, *self.base.array_pixels(pixels, rng, bbox))

    def tensor_into(self, payload, layout: str, slot: np.ndarray, rng, bbox=None) -> None:
        self.array_into(tensor_array(payload, layout), slot, rng, bbox)

    def _finish(self, slot, pixels, flip) -> None:
        if self.fused:
            write_pixels(slot, pixels, flip)  # the prefix's output, flipped by the strided write as today
            self._rest_in(slot)
        else:
            self._write(slot, self.rest(_image_of(pixels)))

    def _rest_in(self, slot) -> None:
        """The rest of T on the prefix's output in `slot`, written back into it."""
        if self.rest is not None:
            self._write(slot, self.rest(_tv_image(_chw(slot))))

    def _write(self, slot, out) -> None:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or tuple(out.shape) != (3, *slot.shape[:2]):
            raise PipelineError(f"the transform gave {_describe(out)}; the batch expects uint8 (3, {slot.shape[0]}, "
                                f"{slot.shape[1]})")
        _chw(slot).copy_(out)


def _describe(out) -> str:
    if isinstance(out, torch.Tensor):
        return f"{out.dtype} {tuple(out.shape)}"
    return type(out).__name__


def build_pipeline(transform, batch_transform, train: bool, stored, decode_path, output_sized: bool = False):
    """(pipeline, warnings, TorchRandom or None, BatchTransform or None) for get_data. `transform`: a
    TrainCrop or ValidationCrop (imagenet_shards/loader/options.py: the loader's own recipe) or a UserTransform
    (T split into its fused prefix and the rest, a `TransformedPipeline`). `output_sized`: the source's
    arrays are made at the output size (synthetic)."""
    user = isinstance(transform, UserTransform)
    random = TorchRandom() if user or batch_transform is not None else None
    batch = BatchTransform(batch_transform, random) if batch_transform is not None else None
    if not user:
        pipeline, notes = ImagePipeline.build(transform.train, transform.image_size, transform.resize(), stored,
                                              transform.scale, transform.ratio, transform.use_draft, decode_path,
                                              wanted=() if output_sized else None)
        return pipeline, notes, random, batch
    return (*build_user_pipeline(transform.transform, train, transform.image_size, transform.resize_size, stored,
                                 transform.use_draft, decode_path, random), random, batch)


def build_user_pipeline(transform, train, image_size, resize_size, stored, use_draft, decode_path, random):
    """(TransformedPipeline, warnings): T split into the prefix the decoder runs and the rest."""
    fusion = split_transform(transform)
    if fusion.size is not None and image_size is not None and image_size != fusion.size:
        raise TransformError(f"image_size={image_size} but the transform's {fusion.steps[-1 if fusion.resize else 0]} "
                             f"gives {fusion.size} px; leave image_size out or make them equal")
    size = fusion.size or image_size
    if size is None:  # a whole-image T fixes the output size itself: try it
        size = _dry_run(transform, (3, resize_size or 256, (resize_size or 256) * 4 // 3))[-1]
    resize = fusion.resize or resize_size or int(round(size * 256 / 224))
    base, notes = ImagePipeline.build(train, size, resize, stored, fusion.scale, fusion.ratio, use_draft,
                                      decode_path, wanted=fusion.steps)
    base = ImagePipeline(base.train, base.size, base.resize, base.scale, base.ratio, base.steps, base.use_draft,
                         base.decode_path, crop_edges=True, draws=fusion.draws)
    pipeline = TransformedPipeline(base, fusion.rest, bool(fusion.steps), random)
    check_output(pipeline, resize)
    return pipeline, notes


def check_output(pipeline: TransformedPipeline, resize: int) -> None:
    """Run the transform's rest once on a blank image (torch's random state left as it was): its
    output must be uint8 (3, S, S). The whole-image case is tried on a (3, R, 4R/3) image."""
    if pipeline.rest is None:
        return
    size = pipeline.size
    shape = (3, size, size) if pipeline.fused else (3, resize, resize * 4 // 3)
    out = _dry_run(pipeline.rest, shape)
    if out != (3, size, size):
        raise TransformError(
            f"the transform turns a uint8 {shape} image into uint8 {out}; the loader expects uint8 (3, {size}, "
            f"{size}): end it on image_size")


def _dry_run(transform, shape) -> tuple:
    """The shape of `transform`'s output for a blank uint8 image of `shape` (torch's random state kept);
    TransformError unless it is a uint8 (3, S, S) tensor."""
    with torch.random.fork_rng(devices=[]):
        try:
            out = transform(_tv_image(torch.zeros(shape, dtype=torch.uint8)))
        except Exception as error:
            raise TransformError(f"the transform fails on a uint8 {shape} image: {type(error).__name__}: {error}") \
                from None
    if not isinstance(out, torch.Tensor) or out.dtype != torch.uint8 or out.ndim != 3 or out.shape[0] != 3 \
            or out.shape[1] != out.shape[2]:
        raise TransformError(
            f"the transform turns a uint8 {shape} image into {_describe(out)}; the loader expects a uint8 (3, S, S) "
            f"image (normalization='host' or 'device' is the loader's)")
    return tuple(out.shape)


# -- per batch ----------------------------------------------------------------------------------

class BatchTransform:
    """B applied to each batch in the worker (see the module docstring for what goes in and out)."""

    def __init__(self, transform, random: TorchRandom):
        self.transform, self.random = transform, random

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Transform `images` (a batch view in its buffer) in place; return the new labels."""
        with self.random:
            if images.dtype == torch.uint8:
                out, labels = self.transform(images.to(torch.float32), labels)
                images.copy_(out.round_().clamp_(0, 255))
            else:
                out, labels = self.transform(images, labels)
                if out is not images:
                    images.copy_(out)
        return labels


# -- recipes ------------------------------------------------------------------------------------

def strong_augmentation(image_size: int = 224):
    """The usual "strong augmentation" per-sample recipe (torchvision's reference training recipes):
    RandomResizedCrop + flip (fused) + TrivialAugmentWide + RandomErasing(0.25), on uint8."""
    v2 = _v2()
    return v2.Compose([v2.RandomResizedCrop(image_size, antialias=True), v2.RandomHorizontalFlip(),
                       v2.TrivialAugmentWide(), v2.RandomErasing(p=0.25)])


def mixup_cutmix(num_classes: int, mixup_alpha: float = 0.2, cutmix_alpha: float = 1.0):
    """MixUp or CutMix, one of the two per batch (torchvision's reference recipe)."""
    v2 = _v2()
    return v2.RandomChoice([v2.MixUp(alpha=mixup_alpha, num_classes=num_classes),
                            v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes)])
