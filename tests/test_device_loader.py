"""get_data(jpeg_decode="device") against the host path, on a host without CUDA (the CPU stand-in decoder).

The same main-process path runs as on a GPU: workers pack JPEG bytes, boxes and flips; the decode
thread decodes (PIL here, nvJPEG there) and crops, resizes and flips the batch in two matrix
products. Order, keys, labels, resume, the ledger and instance shares must be the host path's;
pixels within 2 levels (mean per image) of the host path's full-scale decode (use_draft=False).
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from imagenet_shards.ledger import main as ledger_main
from imagenet_shards.loader import Normalization, Order, TrainCrop, UserTransform, ValidationCrop, get_data
from imagenet_shards.loader.image_loader import SampleError
from imagenet_shards.torchvision_cpu import transforms_v2 as v2

SIZE = 32  # small outputs: the CPU stand-in's matrix products stay cheap
BOUND = 2.0


def load(source, split, jpeg_decode=None, workers=0, batch=4, use_draft=True, shuffle=None, channels_last=False,
         transform=None, **options):
    """The loader at SIZE px (the split's recipe, or `transform` with its settings), device normalisation."""
    if transform is not None:
        transform = UserTransform(transform, image_size=SIZE, use_draft=use_draft)
    elif options.get("train", split == "train"):
        transform = TrainCrop(image_size=SIZE, use_draft=use_draft)
    else:
        transform = ValidationCrop(image_size=SIZE, use_draft=use_draft)
    return get_data(source, split, batch, workers, normalization=Normalization("device", channels_last=channels_last),
                    with_keys=True, seed=3, epoch=1, instance=options.pop("instance", (0, 1)), transform=transform,
                    jpeg_decode=jpeg_decode, order=Order(shuffle=shuffle, shuffle_buffer=5), **options)


def mean_differences(device_batch, host_batch) -> np.ndarray:
    a, b = device_batch.images.numpy().astype(np.int16), host_batch.images.numpy().astype(np.int16)
    return np.abs(a - b).mean(axis=(1, 2, 3))


@pytest.fixture(scope="module")
def img(converted):
    return converted("img")


@pytest.mark.parametrize("split,workers", [("train", 0), ("train", 2), ("validation", 2)])
def test_order_keys_labels_and_pixels_are_the_host_paths(img, split, workers):
    device = load(img, split, "device", workers)
    full = load(img, split, workers=workers, use_draft=False)
    scaled = load(img, split, workers=workers)
    count, against_scaled = 0, []
    for got, want, draft in zip(device, full, scaled, strict=True):
        assert got.keys == want.keys == draft.keys
        assert torch.equal(got.labels, want.labels)
        assert got.images.dtype == torch.uint8 and got.images.shape == want.images.shape
        assert mean_differences(got, want).max() <= BOUND
        against_scaled += list(mean_differences(got, draft))
        count += len(got.keys)
    assert count == device.samples_per_epoch
    assert np.isfinite(against_scaled).all()  # reported by benchmarks/device_decode_check.py, larger by design


def test_a_flip_or_box_drawn_differently_would_show(img):
    """The bound can fail: the device batch against the host batch of another seed."""
    device = next(iter(load(img, "train", "device")))
    other = get_data(img, "train", 4, 0, normalization="device", with_keys=True, seed=4, epoch=1, instance=(0, 1),
                     transform=TrainCrop(image_size=SIZE, use_draft=False), order=Order(shuffle_buffer=5))
    assert mean_differences(device, next(iter(other))).max() > BOUND


def test_same_count_resume_continues_exactly(img):
    whole = [(b.keys, b.images.clone()) for b in load(img, "train", "device", workers=2)]
    loader = load(img, "train", "device", workers=2)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    state = json.loads(json.dumps(loader.state_dict()))
    iterator.close()
    resumed = load(img, "train", "device", workers=2)
    resumed.load_state_dict(state)
    rest = [(b.keys, b.images) for b in resumed]
    assert [k for k, _ in rest] == [k for k, _ in whole[3:]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rest, whole[3:]))


def test_validation_shares_are_exactly_once_and_the_ledger_verifies(img, tmp_path):
    keys = []
    for index in range(2):
        loader = load(img, "validation", "device", workers=1, instance=(index, 2))
        keys += [key for batch in loader for key in batch.keys]
        loader.write_ledger(tmp_path / f"ledger-{index}.json")
    host = [key for index in range(2) for batch in load(img, "validation", instance=(index, 2)) for key in batch.keys]
    assert sorted(keys) == sorted(host) and len(set(keys)) == len(keys)
    assert ledger_main(["verify", *map(str, sorted(tmp_path.glob("ledger-*.json")))]) == 0


def test_jpegs_the_device_does_not_take_are_decoded_on_the_host_and_counted(sample_source, tmp_path):
    """Real files of each kind, encoded by libjpeg: progressive and CMYK (host), grayscale and 4:4:4 (device),
    beside the sample source's own quirks."""
    root = tmp_path / "folder"
    shutil.copytree(sample_source / "train", root / "train")
    first = sorted((root / "train").rglob("*.JPEG"))[0]
    with Image.open(first) as image:
        rgb = image.convert("RGB")
    for name, image, options in (("progressive", rgb, {"progressive": True}), ("cmyk", rgb.convert("CMYK"), {}),
                                 ("grayscale", rgb.convert("L"), {}), ("444", rgb, {"subsampling": 0})):
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=90, **options)
        (first.parent / f"{name}_0.JPEG").write_bytes(buffer.getvalue())
    device = load(root, "train", "device", train=False, shuffle=False)
    full = load(root, "train", train=False, shuffle=False, use_draft=False)
    for got, want in zip(device, full, strict=True):
        assert got.keys == want.keys
        assert mean_differences(got, want).max() <= BOUND
    refused = device.report.device_host_decoded
    host_kinds = [path.stem for path in (root / "train").rglob("*.JPEG") if _not_device_jpeg(path.read_bytes())]
    assert {"progressive_0", "cmyk_0"} <= set(host_kinds) and "grayscale_0" not in host_kinds
    assert refused == len(host_kinds)


def _not_device_jpeg(data: bytes) -> bool:
    from imagenet_shards.loader.device.device_batches import device_eligible

    return device_eligible(data) is not None


def _scan_component_corrupted(data: bytes) -> bytes:
    """The JPEG with its first scan naming a component the frame does not have (one byte changed)."""
    sos = data.index(b"\xff\xda")
    return data[:sos + 5] + b"\x09" + data[sos + 6:]


@pytest.mark.parametrize("on_error", ["skip", "fail"])
def test_a_jpeg_only_the_decoder_finds_bad_is_skipped_or_fails_naming_its_key(sample_source, tmp_path, on_error):
    root = tmp_path / "folder"
    shutil.copytree(sample_source / "validation", root / "validation")
    victim = sorted(p for p in (root / "validation").rglob("*.JPEG") if not _not_device_jpeg(p.read_bytes()))[0]
    victim.write_bytes(_scan_component_corrupted(victim.read_bytes()))
    loader = load(root, "validation", "device", on_error=on_error)
    if on_error == "fail":
        with pytest.raises(SampleError, match=victim.stem):
            list(loader)
        return
    with pytest.warns(UserWarning, match="1 samples skipped"):
        keys = [key for batch in loader for key in batch.keys]
    assert len(keys) == 11 and not any(victim.stem in key for key in keys)
    assert [victim.stem in s.key for s in loader.report.skipped] == [True]
    assert "device decode" in loader.report.skipped[0].reason


def test_a_batch_transform_runs_on_the_device_batch_with_its_workers_draws(img):
    mix = v2.MixUp(alpha=0.4, num_classes=4)
    device = load(img, "train", "device", workers=2, batch_transform=mix)
    host = load(img, "train", workers=2, use_draft=False, batch_transform=mix)
    for got, want in zip(device, host, strict=True):
        assert got.keys == want.keys
        assert torch.equal(got.labels, want.labels)  # the same lambda: the same generator state
        assert mean_differences(got, want).max() <= BOUND


def test_what_the_device_path_cannot_run_is_refused_at_get_data_time(img):
    with pytest.raises(ValueError, match="normalization='device'"):
        get_data(img, "train", 4, 0, normalization="host", jpeg_decode="device", instance=(0, 1))
    with pytest.raises(ValueError, match="jpeg_decode='device'"):
        get_data(img, "train", 4, 0, normalization="device", jpeg_decode="device", instance=(0, 1),
                 transform=v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip(), v2.ColorJitter(0.4)]))


def test_a_user_random_resized_crop_runs_on_the_device_with_torchvisions_draws(img):
    transform = v2.Compose([v2.RandomResizedCrop(SIZE), v2.RandomHorizontalFlip()])
    device = load(img, "train", "device", workers=2, transform=transform)
    host = load(img, "train", workers=2, use_draft=False, transform=transform)
    for got, want in zip(device, host, strict=True):
        assert got.keys == want.keys
        assert mean_differences(got, want).max() <= BOUND


def test_channels_last_batches(img):
    batch = next(iter(load(img, "train", "device", channels_last=True)))
    assert batch.images.is_contiguous(memory_format=torch.channels_last)
    host = next(iter(load(img, "train", use_draft=False, channels_last=True)))
    assert mean_differences(batch, host).max() <= BOUND
