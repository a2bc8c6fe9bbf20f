"""jpeg_decode="device", its parts: the header rule, the batched crop-resize, the packer, the assembler.

Real JPEGs only: the shared photos and the package's photos, re-encoded by libjpeg (through PIL)
where a test needs a kind (progressive, CMYK, grayscale, 4:4:4). The loader-level tests (order,
boxes, pixels against the host path, resume, reports) are in tests/test_device_loader.py.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imagenet_shards.loader.output.batch_ring import BatchRing
from imagenet_shards.loader.device.device_batches import JpegPacker, device_eligible
from imagenet_shards.loader.device.device_decode import DeviceBatches, JpegDecoder
from imagenet_shards.loader.device.device_resample import BatchResampler, center_crop_box, crop_box, mean_absolute_difference
from imagenet_shards.loader.device.jpeg_header import device_refusal, read_header
from imagenet_shards.loader.transform.pipeline import ImagePipeline, center_crop_offsets, random_resized_crop_box, resized_size

PHOTOS = sorted((Path(__file__).resolve().parents[1] / "imagenet_shards" / "photos").rglob("*.jpg"))


def encoded(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def photo():
    assert PHOTOS, "imagenet_shards/photos has no JPEG"
    with Image.open(PHOTOS[0]) as image:
        return image.convert("RGB")


@pytest.fixture(scope="module")
def photos():
    images = []
    for path in PHOTOS[:12]:
        with Image.open(path) as image:
            images.append(image.convert("RGB"))
    return images


# -- the header rule -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, options, refused", [
    ("4:2:0", {"subsampling": 2}, None),
    ("4:2:2", {"subsampling": 1}, None),
    ("4:4:4", {"subsampling": 0}, None),
    ("progressive", {"progressive": True}, "progressive"),
])
def test_the_header_rule_takes_baseline_subsamplings_and_refuses_progressive(photo, kind, options, refused):
    data = encoded(photo, **options)
    header = read_header(data)
    assert (header.width, header.height) == photo.size
    reason = device_refusal(header)
    assert (reason is None) if refused is None else (refused in reason), (kind, reason)


def test_the_header_rule_takes_grayscale_and_refuses_cmyk_and_non_jpegs(photo):
    assert device_refusal(read_header(encoded(photo.convert("L")))) is None
    assert "CMYK" in device_refusal(read_header(encoded(photo.convert("CMYK"))))
    png = io.BytesIO()
    photo.save(png, "PNG")
    assert read_header(png.getvalue()) is None and device_refusal(None) is not None


def test_a_truncated_jpeg_goes_to_the_host_which_reports_it(photo):
    data = encoded(photo)
    assert device_eligible(data) is None
    assert "End Of Image" in device_eligible(data[: len(data) // 2])


# -- the batched crop-resize against PIL's (the host path's arithmetic) ----------------------------

def _reference(image, box, flip, clip):
    if clip:
        x0, y0, x1, y1 = (int(v) for v in box)
        out = np.asarray(image.crop((x0, y0, x1, y1)).resize((64, 64), Image.BILINEAR))
    else:
        out = np.asarray(image.resize((64, 64), Image.BILINEAR, box=box))
    return out[:, ::-1] if flip else out


@pytest.mark.parametrize("clip", [False, True])
def test_the_batched_resize_is_pils_bilinear_resize_of_the_box_within_a_level(photos, clip):
    rng = random.Random(3)
    boxes, flips = [], []
    for image in photos:
        top, left, h, w = random_resized_crop_box(*image.size, (0.08, 1.0), (3 / 4, 4 / 3), rng)
        boxes.append(crop_box(top, left, h, w))
        flips.append(rng.random() < 0.5)
    tensors = [torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1) for image in photos]
    out = BatchResampler(64, "cpu")(tensors, np.array(boxes), np.array(flips), clip=clip)
    for i, image in enumerate(photos):
        got = out[i].permute(1, 2, 0).numpy()
        want = _reference(image, boxes[i], flips[i], clip)
        assert np.abs(got.astype(int) - want).max() <= 1, i
        assert mean_absolute_difference(got, want) < 0.5


def test_the_center_crop_box_is_resize_then_center_crop(photos):
    image = photos[0]
    width, height = image.size
    out_width, out_height = resized_size(width, height, 73)
    top, left = center_crop_offsets(out_width, out_height, 64)
    want = np.asarray(image.resize((out_width, out_height), Image.BILINEAR))[top:top + 64, left:left + 64]
    tensor = torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)
    got = BatchResampler(64, "cpu")([tensor], np.array([center_crop_box(width, height, 73, 64)]), np.zeros(1, bool))
    assert np.abs(got[0].permute(1, 2, 0).numpy().astype(int) - want).max() <= 1


def test_the_staging_buffer_grows_to_the_largest_batch_and_is_then_reused(photos):
    resampler = BatchResampler(32, "cpu")
    tensors = [torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1) for image in photos[:4]]
    boxes = np.array([(0.0, 0.0, float(t.shape[2]), float(t.shape[1])) for t in tensors])
    resampler(tensors, boxes, np.zeros(4, bool))
    pointer = resampler._staging.data_ptr()
    for _ in range(3):
        resampler(tensors[:2], boxes[:2], np.zeros(2, bool))
    assert resampler._staging.data_ptr() == pointer


# -- the packer and the assembler ------------------------------------------------------------------

def test_packed_bytes_boxes_and_draws_are_the_host_paths(photos):
    pipeline, _ = ImagePipeline.build(True, 64)
    ring = BatchRing(1, 3)
    packer = JpegPacker(pipeline, ring, 0, shared=False, capacity=16)
    payloads = [encoded(image) for image in photos[:5]]
    host_rng, device_rng = random.Random(9), random.Random(9)
    for row, payload in enumerate(payloads):
        assert packer.pack(payload, row, "shard-0", device_rng, None) is None
        width, height = Image.open(io.BytesIO(payload)).size
        box = pipeline.crop_box(width, height, host_rng)
        flip = pipeline.flip_draw(host_rng)
        assert tuple(packer.boxes[row]) == crop_box(*box) and packer.flips[row] == flip
    assert device_rng.random() == host_rng.random()  # the same number of draws
    jpegs = packer.take()
    assert list(jpegs.rows) == list(range(5)) and jpegs.buffer is not None  # grown past its 16-byte start
    for row, payload in enumerate(payloads):
        assert bytes(jpegs.buffer[jpegs.offsets[row]:jpegs.offsets[row + 1]].numpy()) == payload


def test_a_refused_jpeg_draws_nothing_and_is_counted(photo):
    pipeline, _ = ImagePipeline.build(True, 64)
    packer = JpegPacker(pipeline, BatchRing(1, 3), 0, shared=False)
    rng = random.Random(1)
    state = rng.getstate()
    assert "progressive" in packer.pack(encoded(photo, progressive=True), 0, "s", rng, None)
    assert rng.getstate() == state
    assert packer.take().host_decoded == 1


def test_the_assembler_fills_device_rows_keeps_host_rows_and_drops_an_undecodable_one(photos):
    pipeline, _ = ImagePipeline.build(True, 48)
    packer = JpegPacker(pipeline, BatchRing(1, 3), 0, shared=False)
    rng = random.Random(5)
    payloads = [encoded(image) for image in photos[:4]]
    payloads[2] = payloads[2][:600] + bytes(400) + payloads[2][1000:]  # damaged scan data, markers intact
    host = torch.zeros((5, 3, 48, 48), dtype=torch.uint8)
    host[4] = 77  # as if the worker had decoded row 4 on the host
    for row, payload in enumerate(payloads):
        assert packer.pack(payload, row, "shard-0", rng, None) is None
    jpegs = packer.take()
    keys = [f"k{i}" for i in range(5)]
    labels = torch.arange(5)
    batches = DeviceBatches(48, torch.device("cpu"))
    try:
        result = batches.submit(host, labels, keys, jpegs, jpegs.buffer).result()
    finally:
        batches.close()
    decoder = JpegDecoder(torch.device("cpu"))
    damaged = decoder.decode_each([torch.frombuffer(bytearray(payloads[2]), dtype=torch.uint8)])[0]
    if isinstance(damaged, Exception):  # PIL refused the damaged JPEG: its row is left out, named
        assert result.keys == ["k0", "k1", "k3", "k4"] and [f[0] for f in result.failed] == ["k2"]
        assert result.labels.tolist() == [0, 1, 3, 4]
    else:  # libjpeg decoded it with a warning (gray blocks): nothing to leave out
        assert result.keys == keys and not result.failed
    assert bool((result.images[-1] == 77).all())
    first = BatchResampler(48, "cpu")(
        [torch.from_numpy(np.asarray(Image.open(io.BytesIO(payloads[0])).convert("RGB")).copy()).permute(2, 0, 1)],
        jpegs.boxes[:1], jpegs.flips[:1])
    assert torch.equal(result.images[0], first[0])
