"""Validation's fused path (Resize + CenterCrop decoded and resized only where the crop is) against
the whole-image PIL path: equal pixel for pixel, on the photos, the quirk inputs, the edge sizes,
and through the loader on every format that stores JPEGs.

The per-thread canvas is filled with a pattern first, so a pixel read outside the decoded region
would show; slots are CHW-backed views as in the loader's batches, and plain HWC arrays.
"""

import io
import random
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from test_jpeg_crop import PHOTOS, _encoded, quirk_payload
from imagenet_shards.loader import ValidationCrop, jpeg_crop
from imagenet_shards.loader.pipeline import ImagePipeline, PipelineError
from imagenet_shards.launcher import Instance

SINGLE = Instance(0, 1, "explicit")
STEPS = ("Resize", "CenterCrop")


def _pipelines(size, resize, steps=STEPS, use_draft=True):
    return tuple(ImagePipeline(False, size, resize, steps=steps, use_draft=use_draft, decode_path=path)
                 for path in (jpeg_crop.CROP, jpeg_crop.PIL_FULL))


def _slot(size, layout):
    if layout == "chw":  # the HWC view of a CHW batch slot, as _BatchBuilder hands out
        return np.full((3, size, size), 7, np.uint8).transpose(1, 2, 0)
    return np.full((size, size, 3), 7, np.uint8)


def _outputs(fused, whole, payload, layout="chw"):
    """(fused, whole-image) outputs; asserts the fused path ran."""
    _poison()
    slots = [_slot(fused.size, layout), _slot(fused.size, layout)]
    assert fused._center_crop_decoded(payload, slots[0]), "the fused path fell back"
    whole.image_into(payload, slots[1], None)
    return slots


def _poison():
    jpeg_crop._canvas(4 << 20).view(np.uint16).fill(0xFF00)


@pytest.fixture(scope="module")
def payloads():
    return [path.read_bytes() for path in PHOTOS]


@pytest.mark.parametrize("size, resize", [(224, 256), (128, 146), (97, 111)])
@pytest.mark.parametrize("use_draft", [True, False])
def test_equal_to_the_whole_image_path_on_photos(payloads, size, resize, use_draft):
    fused, whole = _pipelines(size, resize, use_draft=use_draft)
    scales = set()
    for index, payload in enumerate(payloads):
        width, height = jpeg_crop.jpeg_size(payload)
        if min(width, height) < size:
            continue
        out = fused.resize if width <= height else int(resize * width / height)
        scales.add(jpeg_crop.dct_scale(width, height, out, resize) if use_draft and min(width, height) >= 2 * resize
                   else 1)
        region, reference = _outputs(fused, whole, payload, "chw" if index % 2 else "hwc")
        assert np.array_equal(region, reference), f"a {width}x{height} image"
    assert 1 in scales and (not use_draft or size == 224 or {2, 4} & scales), scales


def test_center_crop_alone_equals_the_whole_image_path(payloads):
    """A split stored at Resize(256): only CenterCrop(224) is left to run."""
    fused, whole = _pipelines(224, 256, steps=("CenterCrop",))
    large = [payload for payload in payloads if min(jpeg_crop.jpeg_size(payload)) >= 224]
    assert large
    for payload in large[:10]:
        region, reference = _outputs(fused, whole, payload)
        assert np.array_equal(region, reference)


@pytest.mark.parametrize("kind, native", [
    ("grayscale", True), ("progressive", True), ("444", True), ("422", True), ("restart markers", True),
    ("cmyk", False), ("png named jpeg", False),
])
def test_quirk_inputs_equal_the_whole_image_path(kind, native):
    photo = Image.open(PHOTOS[0]).convert("RGB").crop((3, 5, 3 + 333, 5 + 251))  # sizes off the MCU grid
    payload = quirk_payload(photo, kind)
    for size, resize in ((224, 256), (64, 73)):
        fused, whole = _pipelines(size, resize)
        slots = [_slot(size, "chw"), _slot(size, "chw")]
        assert fused._center_crop_decoded(payload, slots[0]) == native
        fused.image_into(payload, slots[0], None)
        whole.image_into(payload, slots[1], None)
        assert np.array_equal(*slots), kind


@pytest.mark.parametrize("width, height", [
    (224, 224), (224, 500), (500, 224), (256, 256), (256, 341), (341, 256), (225, 229), (512, 1024),
    (1030, 517), (2049, 1537), (100, 90), (17, 300),
])
def test_edge_sizes_equal_the_whole_image_path(width, height):
    """Crop-sized, Resize-sized, upsampled, odd, draft-scaled (1/2, 1/4) images, and ones smaller than the crop."""
    photo = Image.open(PHOTOS[-1]).convert("RGB").resize((width, height), Image.BILINEAR)
    payload = _encoded(photo, quality=92)
    fused, whole = _pipelines(224, 256)
    slots = [_slot(224, "chw"), _slot(224, "chw")]
    errors = []
    for pipeline, slot in zip((fused, whole), slots):
        try:
            pipeline.image_into(payload, slot, None)
        except PipelineError as error:
            errors.append(str(error))
    if errors:  # an image the Resize leaves smaller than the crop: the same error, from the same path
        assert len(errors) == 2 and errors[0] == errors[1] and "smaller than" in errors[0]
        return
    assert np.array_equal(*slots), (width, height)


def test_a_wrong_slot_size_and_a_truncated_jpeg_are_reported_as_before(payloads):
    fused, whole = _pipelines(224, 256)
    for pipeline in (fused, whole):
        with pytest.raises(PipelineError, match="the batch expects 200x200"):
            pipeline.image_into(payloads[0], np.empty((200, 200, 3), np.uint8), None)
        with pytest.raises(OSError, match="truncated"):
            pipeline.image_into(payloads[0][: len(payloads[0]) * 2 // 3], np.empty((224, 224, 3), np.uint8), None)


@pytest.fixture(params=[0, 1, 2], ids=["scalar", "sse2", "avx2"])
def simd_level(request):
    """Each of the resampler's kernel sets in turn (skipped where the CPU lacks it); the best after."""
    from imagenet_shards import _jpeg_crop

    if _jpeg_crop.simd(request.param) != request.param:
        _jpeg_crop.simd()
        pytest.skip(f"this CPU has no kernel level {request.param}")
    yield request.param
    _jpeg_crop.simd()


def _narrow_images():
    """Images 1-9 px wide or high: every tap group meets a row's end (the AVX2 kernel reads 4 pixels at once)."""
    rng = np.random.default_rng(9)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for w, h in ((1, 7), (3, 40), (5, 9), (9, 3), (2, 2), (7, 64), (64, 5))]


def test_resize_into_equals_pil_resize_windows(payloads, simd_level):
    """The native resampler alone, with each kernel set: random boxes, output sizes (down and up),
    windows, flips, on the photos and on images a few pixels wide."""
    rng = random.Random(5)
    images = [Image.open(io.BytesIO(payload)).convert("RGB") for payload in payloads[::4]] + _narrow_images()
    for image in images:
        width, height = image.size
        canvas = jpeg_crop.Canvas(np.ascontiguousarray(np.asarray(image.convert("RGBX"))).reshape(-1), width, height,
                                  (0, 0, width, height))
        for trial in range(4):
            size = (rng.randint(1, max(1, int(width * 1.3))), rng.randint(1, max(1, int(height * 1.3))))
            x0, y0 = rng.uniform(0, (width - 1) / 2), rng.uniform(0, (height - 1) / 2)
            box = (x0, y0, rng.uniform(x0 + 1, width), rng.uniform(y0 + 1, height)) if trial % 2 else None
            window = (rng.randint(1, size[0]), rng.randint(1, size[1]))
            offset = (rng.randint(0, size[0] - window[0]), rng.randint(0, size[1] - window[1]))
            out = np.zeros((3, window[1], window[0]), np.uint8).transpose(1, 2, 0)
            canvas.resize_into(out, size, box, offset, flip=trial >= 2)
            reference = np.asarray(image.resize(size, Image.BILINEAR, box=box))
            reference = reference[offset[1]:offset[1] + window[1], offset[0]:offset[0] + window[0]]
            assert np.array_equal(out, reference[:, ::-1] if trial >= 2 else reference), (size, box, offset)
    with pytest.raises(ValueError, match="does not fit"):
        canvas.resize_into(np.empty((10, 10, 3), np.uint8), (8, 8))


def _validation_images(source, decode, **options):
    from imagenet_shards.loader import get_data

    loader = get_data(str(source), "validation", 5, 0, normalization="device", instance=SINGLE, with_keys=True,
                      jpeg_decode=decode, **options)
    images, keys = [], []
    for batch in loader:
        images.append(batch.images)
        keys.extend(batch.keys)
    return torch.cat(images), keys


@pytest.mark.parametrize("fmt", ["img", "tfrecord", "lmdb", "folder", "reference"])
def test_the_loader_takes_the_fused_path_with_the_same_pixels(converted, sample_source, tmp_path, monkeypatch, fmt):
    if fmt == "folder":
        source = sample_source
    elif fmt == "reference":
        from reference_layout import write_reference_dataset

        source = tmp_path / "reference"
        source.mkdir()
        write_reference_dataset(sample_source, source, "img", 8)
    else:
        source = converted(fmt)
    fused_calls = []
    original = ImagePipeline._center_crop_decoded

    def counted(self, payload, slot):
        fused_calls.append(original(self, payload, slot))
        return fused_calls[-1]

    monkeypatch.setattr(ImagePipeline, "_center_crop_decoded", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the reference dataset's "made by the reference harness" note
        for options in ({}, {"transform": ValidationCrop(image_size=64)}):
            fused_calls.clear()
            region, keys = _validation_images(source, jpeg_crop.CROP, **options)
            assert fused_calls and all(fused_calls), f"{fmt}: the fused path did not run for every sample"
            reference, reference_keys = _validation_images(source, jpeg_crop.PIL_FULL, **options)
            assert keys == reference_keys and len(keys) == 12
            assert torch.equal(region, reference), fmt

