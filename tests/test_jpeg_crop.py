"""The region JPEG decode (native/jpeg_crop, imagenet_shards.loader.jpeg_crop) against PIL's whole-image decode.

Without DCT scaling the train output must equal the whole-image path's pixel for pixel; with it
(draft, crop >= 2x the output on both axes) it must equal the draft path's, and stay within the
bound docs/crop-decode.md states of a full-size decode. The canvas the region is decoded into is filled
with a pattern first, so a pixel read outside the decoded region would show.
"""

import io
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from imagenet_shards.loader import jpeg_crop
from imagenet_shards.loader.pipeline import ImagePipeline, random_resized_crop_box, resized_size

REPO = Path(__file__).resolve().parents[1]
# The bound of DCT-scaled (1/2, 1/4) output vs a full-size decode, measured on imagenet_shards/photos and
# the CI host's larger photos at 128, 160 and 224 px: mean of the per-image mean abs difference 1.2,
# per-image mean <= 7.6, max <= 108 (docs/crop-decode.md).
DCT_MEAN_BOUND, DCT_IMAGE_MEAN_BOUND, DCT_MAX_BOUND = 1.5, 8.0, 120

# The bundled photos only (imagenet_shards/photos): every test sees the same inputs in any clone.
PHOTOS = sorted((REPO / "imagenet_shards" / "photos").rglob("*.jp*g"))
# Photos larger than any bundled one, made from bundled ones, so that a box can be 8x the output on both
# axes at each output size (DCT scale 8): (bundled photo, short side, chroma subsampling).
LARGE_SHORT_SIDE = 1536
LARGE_FROM = (("large/erase/kingfisher.jpg", 2), ("large/explore_world_animals/panda.jpg", 2),
              ("large/explore_monuments/usa_statueofLiberty.jpg", 0), ("large/erase/pika.jpg", 1))


@pytest.fixture(scope="module")
def payloads():
    return [path.read_bytes() for path in PHOTOS]


@pytest.fixture(scope="module")
def large_payloads():
    """Bundled photos upscaled (bicubic) to a short side of LARGE_SHORT_SIDE px and encoded again: the same
    bytes on every run of one Pillow build (4:2:0, 4:4:4 and 4:2:2 among them)."""
    out = []
    for rel, subsampling in LARGE_FROM:
        with Image.open(REPO / "imagenet_shards" / "photos" / rel) as image:
            factor = LARGE_SHORT_SIDE / min(image.size)
            size = (round(image.width * factor), round(image.height * factor))
            out.append(_encoded(image.convert("RGB").resize(size, Image.BICUBIC), quality=90,
                                subsampling=subsampling))
    assert all(min(jpeg_crop.jpeg_size(payload)) == LARGE_SHORT_SIDE for payload in out)
    return out


def _pipelines(size, use_draft, crop_edges=False):
    """(region path, whole-image path): the second decodes and resizes with PIL (pillow-simd in .venv), today's
    pinned pixels; `crop_edges` as a user's torchvision transform (crop, then resize)."""
    crop = ImagePipeline(True, size, steps=("RandomResizedCrop", "RandomHorizontalFlip"), use_draft=use_draft,
                         decode_path=jpeg_crop.CROP, crop_edges=crop_edges)
    whole = ImagePipeline(True, size, steps=crop.steps, use_draft=use_draft, decode_path=jpeg_crop.PIL_FULL,
                          crop_edges=crop_edges)
    return crop, whole


def _simd_levels():
    """The resampler's kernel sets this CPU has (0 scalar, 1 SSE2, 2 AVX2)."""
    from imagenet_shards import _jpeg_crop

    best = _jpeg_crop.simd()
    return list(range(best + 1))


def _each_simd_level():
    """Use each kernel set in turn (the best again afterwards), yielding its level."""
    from imagenet_shards import _jpeg_crop

    try:
        for level in _simd_levels():
            assert _jpeg_crop.simd(level) == level
            yield level
    finally:
        _jpeg_crop.simd()


def _poison_canvas(width, height):
    """Black/white stripes in the per-thread canvas, where a region decode puts its pixels."""
    jpeg_crop._canvas(width * height * 4 + 2).view(np.uint16).fill(0xFF00)


def _both(crop, whole, payload, box):
    """(region path, whole-image path) outputs for one box; the region path must not fall back."""
    width, height = jpeg_crop.jpeg_size(payload)
    _poison_canvas(width, height)
    region = crop._crop_decoded(payload, width, height, box)
    assert region is not None, "the region path fell back"
    return region, whole._decoded_then_cropped(Image.open(io.BytesIO(payload)), width, height, box)


def _edge_boxes(width, height):
    """(top, left, h, w) boxes at the edges: whole image, touching right/bottom, 1-2 px, thin strips."""
    return [
        (0, 0, height, width), (height - 1, width - 1, 1, 1), (0, 0, 1, 1), (height - 2, 0, 2, 2),
        (0, width - 2, 2, 2), (height // 2, width - 37, height - height // 2, 37), (height - 19, 5, 19, width - 5),
        (0, width // 3, height, 1), (height // 3, 0, 1, width), (7, 9, height - 7, width - 9),
        (height - 300, width - 300, 300, 300) if min(width, height) > 300 else (1, 1, height - 1, width - 1),
    ]


def test_module_is_built():
    assert jpeg_crop.available(), jpeg_crop.UNAVAILABLE_REASON
    assert jpeg_crop.decode_path() in (jpeg_crop.CROP, jpeg_crop.PIL_FULL)


@pytest.mark.parametrize("size", [224, 128, 97])
def test_equal_to_whole_decode_without_dct_scaling(payloads, size):
    crop, whole = _pipelines(size, use_draft=False)
    rng = random.Random(size)
    for payload in payloads:
        width, height = jpeg_crop.jpeg_size(payload)
        boxes = [random_resized_crop_box(width, height, crop.scale, crop.ratio, rng) for _ in range(4)]
        for box in boxes + _edge_boxes(width, height):
            region, reference = _both(crop, whole, payload, box)
            assert np.array_equal(region, reference), f"box {box} of a {width}x{height} image"


@pytest.mark.parametrize("size", [224, 128])
def test_dct_scaled_equal_to_draft_path_and_within_bound(payloads, size):
    crop, draft = _pipelines(size, use_draft=True)
    _, full = _pipelines(size, use_draft=False)
    rng = random.Random(1000 + size)
    means, scales = [], set()
    for payload in payloads:
        width, height = jpeg_crop.jpeg_size(payload)
        for _ in range(8):
            box = random_resized_crop_box(width, height, crop.scale, crop.ratio, rng)
            top, left, h, w = box
            if not (h >= 2 * size and w >= 2 * size):
                continue
            scales.add(jpeg_crop.dct_scale(width, height, width * size / w, height * size / h))
            region, reference = _both(crop, draft, payload, box)
            assert np.array_equal(region, reference), f"box {box} of a {width}x{height} image"
            difference = np.abs(region.astype(int) - full._decoded_then_cropped(
                Image.open(io.BytesIO(payload)), width, height, box))
            assert difference.mean() <= DCT_IMAGE_MEAN_BOUND and difference.max() <= DCT_MAX_BOUND, box
            means.append(difference.mean())
    assert 2 in scales and len(means) >= 20
    assert 0 < np.mean(means) <= DCT_MEAN_BOUND


def _chw_slot(size):
    """An HWC view of a CHW slot, as the loader's batches have them (the native write's strided case)."""
    return np.zeros((3, size, size), np.uint8).transpose(1, 2, 0)


@pytest.mark.parametrize("crop_edges", [False, True], ids=["box", "crop-edges"])
def test_train_resize_equals_pil_at_each_simd_level(payloads, large_payloads, crop_edges):
    """The train path's native resize (region decode, then the box resized straight into a CHW slot
    view, mirrored for the flip) against today's pinned path: PIL's decode and resize (pillow-simd),
    flipped by the copy. Random and edge boxes, odd and even sizes, each DCT scale, each kernel set;
    every other bundled photo, then the large ones made from them."""
    rng = random.Random(31 + crop_edges)
    scales, compared = set(), 0
    for index, payload in enumerate(payloads[::2] + large_payloads):
        width, height = jpeg_crop.jpeg_size(payload)
        size = (224, 97, 160)[index % 3]
        for use_draft in (False, True):
            crop, whole = _pipelines(size, use_draft, crop_edges)
            boxes = [random_resized_crop_box(width, height, crop.scale, crop.ratio, rng) for _ in range(3)]
            for n, box in enumerate(boxes + rng.sample(_edge_boxes(width, height), 3)):
                flip = n % 2 == 1
                top, left, h, w = box
                if use_draft and w >= 2 * size and h >= 2 * size:
                    scales.add(jpeg_crop.dct_scale(width, height, width * size / w, height * size / h))
                reference = whole._decoded_then_cropped(Image.open(io.BytesIO(payload)), width, height, box)
                reference = reference[:, ::-1] if flip else reference
                for level in _each_simd_level():
                    _poison_canvas(width, height)
                    slot = _chw_slot(size)
                    assert crop._crop_decoded(payload, width, height, box, out=slot, flip=flip) is slot
                    assert np.array_equal(slot, reference), f"box {box} of a {width}x{height} image, flip {flip}, " \
                                                            f"kernels {level}"
                    compared += 1
    assert {2, 4, 8} <= scales and compared >= 200 * len(_simd_levels())


def _narrow_images():
    rng = np.random.default_rng(4)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            for w, h in ((1, 9), (3, 40), (5, 9), (9, 3), (2, 2), (7, 64), (64, 5), (301, 177))]


def test_resize_of_a_cut_equals_pil_crop_then_resize():
    """`Canvas.resize_into(cut=...)` (the user-transform path's crop, then resize) against PIL's
    `crop(cut).resize(size, box=...)`, each kernel set; the pixels outside the cut are poisoned."""
    rng = random.Random(7)
    for image in _narrow_images() + [Image.open(PHOTOS[0]).convert("RGB")]:
        width, height = image.size
        rgbx = np.ascontiguousarray(np.asarray(image.convert("RGBX")))
        for trial in range(6):
            x0, y0 = rng.randrange(width), rng.randrange(height)
            cut = (x0, y0, rng.randint(x0 + 1, width), rng.randint(y0 + 1, height))
            cut_w, cut_h = cut[2] - cut[0], cut[3] - cut[1]
            poisoned = np.full_like(rgbx, 255)
            poisoned[cut[1]:cut[3], cut[0]:cut[2]] = rgbx[cut[1]:cut[3], cut[0]:cut[2]]
            canvas = jpeg_crop.Canvas(poisoned.reshape(-1), width, height, (0, 0, width, height))
            bx, by = rng.uniform(0, cut_w - 0.5), rng.uniform(0, cut_h - 0.5)
            box = (bx, by, rng.uniform(bx + 0.25, cut_w), rng.uniform(by + 0.25, cut_h)) if trial % 2 else None
            size = (rng.randint(1, 2 * cut_w + 3), rng.randint(1, 2 * cut_h + 3))
            flip = trial >= 3
            reference = np.asarray(image.crop(cut).resize(size, Image.BILINEAR, box=box))
            reference = reference[:, ::-1] if flip else reference
            for level in _each_simd_level():
                out = np.zeros((3, size[1], size[0]), np.uint8).transpose(1, 2, 0)
                canvas.resize_into(out, size, box, flip=flip, cut=cut)
                assert np.array_equal(out, reference), (image.size, cut, box, size, flip, level)
    with pytest.raises(ValueError, match="not inside"):
        canvas.resize_into(np.empty((4, 4, 3), np.uint8), (4, 4), cut=(width, 0, width + 1, 4))


def test_payloads_as_buffers_take_the_crop_path(payloads):
    """The shard readers hand out memoryviews: they must be decoded natively too, not sent to PIL."""
    for payload in payloads[:3]:
        assert jpeg_crop.jpeg_size(memoryview(payload)) == jpeg_crop.jpeg_size(bytearray(payload)) \
            == Image.open(io.BytesIO(payload)).size
        crop, whole = _pipelines(128, use_draft=True)
        width, height = jpeg_crop.jpeg_size(payload)
        box = (1, 2, height - 1, width - 2)
        assert np.array_equal(crop._crop_decoded(memoryview(payload), width, height, box),
                              whole._decoded_then_cropped(Image.open(io.BytesIO(payload)), width, height, box))


@pytest.mark.parametrize("crop_edges", [False, True], ids=["box", "crop-edges"])
def test_image_into_uses_the_same_draws(payloads, crop_edges):
    """Through image_into: same box and flip draws, same output, and the same RNG state afterwards
    (HWC and CHW slots)."""
    for use_draft in (False, True):
        crop, whole = _pipelines(160, use_draft, crop_edges)
        for index, payload in enumerate(payloads[:12]):
            outputs = []
            for pipeline in (crop, whole):
                rng = random.Random(index)
                slot = np.empty((160, 160, 3), np.uint8) if index % 2 else _chw_slot(160)
                pipeline.image_into(payload, slot, rng)
                outputs.append((slot, rng.random()))
            assert np.array_equal(outputs[0][0], outputs[1][0]) and outputs[0][1] == outputs[1][1]


def _encoded(image, format="JPEG", **options):
    out = io.BytesIO()
    image.save(out, format, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def photo():
    return Image.open(PHOTOS[0]).convert("RGB").crop((3, 5, 3 + 333, 5 + 251))  # sizes off the MCU grid


def quirk_payload(photo, kind: str) -> bytes:
    """`photo` encoded as one of the inputs the crop decoder must handle or hand to PIL."""
    return {
        "grayscale": lambda: _encoded(photo.convert("L"), quality=90),
        "progressive": lambda: _encoded(photo, quality=90, progressive=True),
        "444": lambda: _encoded(photo, quality=90, subsampling=0),
        "422": lambda: _encoded(photo, quality=90, subsampling=1),
        "restart markers": lambda: _encoded(photo, quality=90, restart_marker_blocks=3),
        "cmyk": lambda: _encoded(photo.convert("CMYK"), quality=90),
        "png named jpeg": lambda: _encoded(photo, "PNG"),
    }[kind]()


@pytest.mark.parametrize("crop_edges", [False, True], ids=["box", "crop-edges"])
@pytest.mark.parametrize("kind, native", [
    ("grayscale", True), ("progressive", True), ("444", True), ("422", True), ("restart markers", True),
    ("cmyk", False), ("png named jpeg", False),
])
def test_quirk_inputs_equal_the_whole_image_path(photo, kind, native, crop_edges):
    payload = quirk_payload(photo, kind)
    assert (jpeg_crop.jpeg_size(payload) is not None) == native
    for use_draft in (False, True):
        crop, whole = _pipelines(64, use_draft, crop_edges)
        if native:
            width, height = photo.size
            for box in _edge_boxes(width, height) + [random_resized_crop_box(width, height, crop.scale, crop.ratio,
                                                                             random.Random(n)) for n in range(8)]:
                region, reference = _both(crop, whole, payload, box)
                assert np.array_equal(region, reference), f"{kind}: box {box}"
        for seed in range(4):
            slots = [np.empty((64, 64, 3), np.uint8) if seed % 2 else _chw_slot(64) for _ in range(2)]
            crop.image_into(payload, slots[0], random.Random(seed))
            whole.image_into(payload, slots[1], random.Random(seed))
            assert np.array_equal(*slots), kind


def test_corrupt_jpeg_raises_a_named_error(payloads):
    payload = payloads[0]
    width, height = jpeg_crop.jpeg_size(payload)
    with pytest.raises(jpeg_crop.JpegError, match="Premature end of JPEG file"):
        jpeg_crop.decode_region(payload[: len(payload) // 2], 1, 0, 0, width, height)
    with pytest.raises(jpeg_crop.JpegError, match="Not a JPEG file"):
        jpeg_crop.decode_region(b"GIF89a" + payload[6:], 1, 0, 0, width, height)
    broken_header = payload[:2] + b"\xff\xc0\x00\x03" + payload[2:]  # a start-of-frame marker with no frame
    with pytest.raises(jpeg_crop.JpegError):
        jpeg_crop.decode_region(broken_header, 1, 0, 0, width, height)
    with pytest.raises(ValueError, match="scale_denom"):
        jpeg_crop.decode_region(payload, 3, 0, 0, width, height)
    with pytest.raises(ValueError, match="smaller than"):
        jpeg_crop.decode_region(payload, 1, 0, 0, width, height, canvas=np.empty(100, np.uint8))


def test_truncated_jpeg_fails_as_on_the_whole_image_path(payloads):
    """A truncated file is left to PIL (no End Of Image marker), which reports it whatever the crop."""
    truncated = payloads[0][: len(payloads[0]) * 2 // 3]
    assert jpeg_crop.jpeg_size(truncated) is None
    crop, whole = _pipelines(224, use_draft=False)
    for pipeline in (crop, whole):
        with pytest.raises(OSError, match="truncated"):
            pipeline.image_into(truncated, np.empty((224, 224, 3), np.uint8), random.Random(0))


def test_validation_uses_dct_scaling_within_bound():
    """Resize(256) + CenterCrop(224) on photos with a short side >= 512: draft-scaled, within the bound."""
    large = [p for p in PHOTOS if min(Image.open(p).size) >= 512][:12]
    assert large, "no photo with a short side >= 512 px"
    scaled = ImagePipeline(False, 224, steps=("Resize", "CenterCrop"), use_draft=True)
    full = ImagePipeline(False, 224, steps=("Resize", "CenterCrop"), use_draft=False)
    means = []
    for path in large:
        payload = path.read_bytes()
        slots = [np.empty((224, 224, 3), np.uint8) for _ in range(2)]
        scaled.image_into(payload, slots[0], None)
        full.image_into(payload, slots[1], None)
        difference = np.abs(slots[0].astype(int) - slots[1])
        assert difference.mean() <= DCT_IMAGE_MEAN_BOUND and difference.max() <= DCT_MAX_BOUND, path.name
        means.append(difference.mean())
    assert 0 < np.mean(means) <= DCT_MEAN_BOUND


def _pil_resized(pixels, size, box=None, cut=False):
    """Today's decoded-array resize: PIL (pillow-simd) on the array, cut first for crop_edges."""
    image = Image.fromarray(np.ascontiguousarray(pixels))
    if cut:
        image, box = image.crop(box), None
    return np.asarray(image.resize(size, Image.BILINEAR, box=box))


def test_decoded_arrays_resize_natively_with_pil_pixels(payloads):
    """`tensor` payloads (HWC arrays, CHW views): RandomResizedCrop (box and crop_edges) and Resize +
    CenterCrop / Resize alone through `array_pixels`, against PIL's resize of the array, each kernel set."""
    rng = random.Random(11)
    arrays = [np.asarray(Image.open(io.BytesIO(payload)).convert("RGB")) for payload in payloads[::5]]
    arrays += [np.ascontiguousarray(a.transpose(2, 0, 1)).transpose(1, 2, 0) for a in arrays[:3]]  # CHW layout
    arrays += [np.asarray(image) for image in _narrow_images()]
    for index, pixels in enumerate(arrays):
        height, width = pixels.shape[:2]
        size = (64, 97, 32)[index % 3]
        for crop_edges in (False, True):
            train = ImagePipeline(True, size, steps=("RandomResizedCrop", "RandomHorizontalFlip"),
                                  crop_edges=crop_edges)
            for n in range(3):
                box = random_resized_crop_box(width, height, train.scale, train.ratio, random.Random(n))
                top, left, h, w = box
                reference = (pixels[top:top + h, left:left + w] if (h, w) == (size, size) else
                             _pil_resized(pixels, (size, size), (left, top, left + w, top + h), crop_edges))
                for level in _each_simd_level():
                    out, _ = train.array_pixels(pixels, random.Random(n))
                    assert np.array_equal(out, reference), (pixels.shape, box, crop_edges, level)
        resize = rng.randint(size, size + 80)
        target = resized_size(width, height, resize)
        resized = _pil_resized(pixels, target) if target != (width, height) else pixels
        steps = (("Resize", "CenterCrop"), ("Resize",))
        for step in steps:
            pipeline = ImagePipeline(False, size, resize, steps=step)
            if "CenterCrop" in step and min(target) < size:
                continue
            top, left = int(round((target[1] - size) / 2.0)), int(round((target[0] - size) / 2.0))
            reference = resized[top:top + size, left:left + size] if "CenterCrop" in step else resized
            for level in _each_simd_level():
                out, _ = pipeline.array_pixels(pixels, None)
                assert np.array_equal(out, reference), (pixels.shape, step, target, level)


def test_crop_edges_box_rounding_past_the_scaled_edge_equals_pil(photo):
    """A box touching the right/bottom edge of a 343x243 image (widths where right * scaled / width lands
    just past the scaled size at 1/2 and 1/4): PIL's crop pads a black column/row that the filter reads;
    the native cut must read the same."""
    image = Image.open(PHOTOS[0]).convert("RGB").resize((343, 243))
    payload = _encoded(image, quality=90)
    width, height = 343, 243
    crop, whole = _pipelines(48, use_draft=True, crop_edges=True)
    scales = set()
    for top, left in ((0, 0), (40, 30), (10, 140), (51, 17), (0, 151)):
        box = (top, left, height - top, width - left)
        scale = jpeg_crop.dct_scale(width, height, width * 48 / box[3], height * 48 / box[2])
        scaled = -(-width // scale)
        if (left + box[3]) * (scaled / width) > scaled:
            scales.add(scale)
        for flip in (False, True):
            for level in _each_simd_level():
                _poison_canvas(width, height)
                region = crop._crop_decoded(payload, width, height, box, flip=flip)
                reference = whole._decoded_then_cropped(Image.open(io.BytesIO(payload)), width, height, box)
                assert np.array_equal(region, reference[:, ::-1] if flip else reference), (box, flip, level)
    assert scales == {2, 4}, scales
