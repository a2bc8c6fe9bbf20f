"""get_data(transform=T, batch_transform=B): the fused prefix against torchvision, every format, MixUp/CutMix.

Real stack: shards from create_webdataset.py, torchvision's own transforms as the reference, real
DataLoader workers.
"""

import io
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from imagenet_shards.formats import FORMATS
from imagenet_shards.launcher import Instance
from imagenet_shards.loader import jpeg_crop
from imagenet_shards.loader import Order, UserTransform
from imagenet_shards.loader.image_loader import get_data
from imagenet_shards.loader.pipeline import FLIP, RANDOM_RESIZED_CROP, RESIZE
from imagenet_shards.loader.user_transforms import (TorchRandom, TransformError, build_user_pipeline, mixup_cutmix,
                                             split_transform, strong_augmentation)
from imagenet_shards.torchvision_cpu import transforms_v2 as v2

SINGLE = Instance(0, 1, "explicit")
PHOTOS = sorted((Path(__file__).resolve().parents[1] / "imagenet_shards" / "photos").rglob("*.jp*g"))  # bundled: 32
DECODE_PATHS = [jpeg_crop.PIL_FULL] + ([jpeg_crop.CROP] if jpeg_crop.available() else [])


def _photos(n):
    assert PHOTOS, "no photos to test on"
    return [open(path, "rb").read() for path in PHOTOS[:n]]


@pytest.mark.parametrize("decode_path", DECODE_PATHS)
@pytest.mark.parametrize("flip_p", [0.5, 0.3, None])
def test_fused_prefix_equals_torchvision_on_a_pil_decode(decode_path, flip_p):
    """Same generator state -> the same box, the same flip, the same pixels, and the same state after."""
    steps = [v2.RandomResizedCrop(96, scale=(0.05, 1.0))] + ([v2.RandomHorizontalFlip(flip_p)] if flip_p else [])
    transform = v2.Compose(steps)
    stream = TorchRandom()
    pipeline, _ = build_user_pipeline(transform, True, None, None, [], False, decode_path, stream)
    assert pipeline.fused and pipeline.rest is None and pipeline.size == 96
    for n, payload in enumerate(_photos(30)):
        stream.begin(f"photo {n}")
        start = stream.state.clone()
        slot = np.zeros((96, 96, 3), np.uint8)
        pipeline.image_into(payload, slot, random.Random(0))
        after = stream.state
        saved = torch.get_rng_state()
        torch.set_rng_state(start)
        expected = np.asarray(transform(Image.open(io.BytesIO(payload)).convert("RGB")))
        reference_after = torch.get_rng_state()
        torch.set_rng_state(saved)
        assert np.array_equal(slot, expected), PHOTOS[n]
        assert torch.equal(after, reference_after), "the fused prefix drew differently from torchvision"
    # DCT scaling (the default) keeps the box: same draws, same state after.
    scaled, _ = build_user_pipeline(transform, True, None, None, [], True, decode_path, stream)
    stream.begin("photo 0")
    start = stream.state.clone()
    scaled.image_into(_photos(1)[0], np.zeros((96, 96, 3), np.uint8), random.Random(0))
    saved = torch.get_rng_state()
    torch.set_rng_state(start)
    transform(Image.open(io.BytesIO(_photos(1)[0])).convert("RGB"))
    assert torch.equal(torch.get_rng_state(), stream.state)
    torch.set_rng_state(saved)


def test_which_prefixes_are_fused():
    fused = split_transform(v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), v2.RandAugment()]))
    assert [s.name for s in fused.steps] == [RANDOM_RESIZED_CROP, FLIP] and fused.size == 64
    assert isinstance(fused.rest, v2.RandAugment)
    alone = split_transform(v2.RandomResizedCrop(64, scale=(0.3, 1)))
    assert [s.name for s in alone.steps] == [RANDOM_RESIZED_CROP] and alone.rest is None and alone.scale == (0.3, 1)
    val = split_transform(v2.Compose([v2.Resize(72), v2.CenterCrop(64)]))
    assert [s.name for s in val.steps][0] == RESIZE and (val.resize, val.size) == (72, 64)
    for unfused in (v2.Compose([v2.RandomResizedCrop(64, interpolation=v2.InterpolationMode.BICUBIC)]),
                    v2.Compose([v2.RandomResizedCrop((64, 48))]),
                    v2.Compose([v2.RandAugment(), v2.RandomResizedCrop(64)]),
                    v2.Compose([v2.Resize((72, 80)), v2.CenterCrop(64)])):
        assert split_transform(unfused).steps == [], unfused


def _all(loader):
    images, labels, keys = [], [], []
    for batch in loader:
        images.append(batch.images.clone())
        labels.append(batch.labels)
        keys.extend(batch.keys)
    return torch.cat(images), torch.cat(labels), keys


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_randaugment_runs_on_every_format(converted, fmt):
    """Fused (train), fused Resize + CenterCrop (validation) and unfused transforms, every registered format."""
    dataset = converted(fmt)
    train_t = v2.Compose([v2.RandomResizedCrop(48), v2.RandomHorizontalFlip(), v2.RandAugment()])
    val_t = v2.Compose([v2.Resize(56), v2.CenterCrop(48), v2.RandAugment()])
    whole_t = v2.Compose([v2.RandAugment(), v2.Resize(56), v2.CenterCrop(48)])
    for split, transform, workers in (("train", train_t, 1), ("validation", val_t, 0), ("train", whole_t, 0)):
        loader = get_data(dataset, split, 5, workers, normalization="device", instance=SINGLE, with_keys=True,
                          transform=transform)
        images, labels, keys = _all(loader)
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 48, 48), (fmt, split)
        assert len(keys) == (35 if split == "train" else 12) and not loader.report.skipped, (fmt, split)
        assert images.float().std() > 10, "blank images"
    host = get_data(dataset, "train", 5, 0, normalization="host", instance=SINGLE, transform=train_t)
    images, _ = next(iter(host))
    assert images.dtype == torch.float32 and images.shape == (5, 3, 48, 48)


def test_user_transforms_repeat_per_epoch_and_leave_the_callers_random_stream(converted):
    dataset = converted("img")
    transform = strong_augmentation(40)

    def epoch(seed, number):
        loader = get_data(dataset, "train", 4, 0, normalization="device", instance=SINGLE, with_keys=True,
                          seed=seed, epoch=number, transform=transform)
        return _all(loader)

    # The caller's torch stream moves as much as with the built-in recipe (DataLoader draws its base seed).
    torch.manual_seed(123)
    _all(get_data(dataset, "train", 4, 0, normalization="device", instance=SINGLE, with_keys=True))
    built_in = torch.get_rng_state()
    torch.manual_seed(123)
    first = epoch(0, 0)
    assert torch.equal(torch.get_rng_state(), built_in), "workers=0 consumed the training code's torch random stream"
    again = epoch(0, 0)
    assert torch.equal(first[0], again[0]) and first[2] == again[2]
    assert not torch.equal(first[0], epoch(0, 1)[0])
    # Workers draw the same as the main process: the stream is seeded per (seed, epoch, instance, worker 0).
    with_worker = _all(get_data(dataset, "train", 4, 1, normalization="device", instance=SINGLE, with_keys=True,
                                transform=transform))
    assert torch.equal(first[0], with_worker[0])


def test_fused_rrc_and_flip_equal_torchvision_through_the_loader(converted, sample_source):
    """Through get_data (workers, batches): each sample equals torchvision's RRC + flip on its PIL decode,
    with the generator state the loader's stream had for it (seeded per batch, so that a resumed
    worker draws what the uninterrupted one did)."""
    dataset = converted("img")
    transform = v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip()])
    loader = get_data(dataset, "train", 4, 0, normalization="device", instance=SINGLE, with_keys=True,
                      transform=UserTransform(transform, use_draft=False), order=Order(shuffle_buffer=1))
    images, _, keys = _all(loader)
    from imagenet_shards.formats.tar import iter_tar_samples
    from pathlib import Path
    payloads = {}
    for shard in sorted(Path(dataset).glob("train-*.tar")):
        for sample in iter_tar_samples(shard):
            payloads[sample["__key__"]] = bytes(sample["jpg"])
    stream = TorchRandom()
    saved = torch.get_rng_state()
    try:
        for n, (image, key) in enumerate(zip(images, keys)):
            if n % 4 == 0:  # the loader's seed text: seed 0, epoch 0, segment 0, instance 0, worker 0, batch
                stream.begin(f"0/0/0/0/0/{n // 4}")
                torch.set_rng_state(stream.state)
            expected = transform(Image.open(io.BytesIO(payloads[key.rsplit("/", 1)[-1]])).convert("RGB"))
            assert np.array_equal(image.permute(1, 2, 0).numpy(), np.asarray(expected)), key
    finally:
        torch.set_rng_state(saved)


@pytest.mark.parametrize("normalization", ["device", "host"])
def test_mixup_cutmix_labels_sum_to_one(converted, normalization):
    dataset = converted("img")
    loader = get_data(dataset, "train", 6, 1, normalization=normalization, instance=SINGLE,
                      transform=strong_augmentation(32), batch_transform=mixup_cutmix(4))
    plain = get_data(dataset, "train", 6, 1, normalization=normalization, instance=SINGLE,
                     transform=strong_augmentation(32))
    batches = 0
    for (images, labels), (plain_images, plain_labels) in zip(loader, plain):
        assert labels.dtype == torch.float32 and labels.shape == (6, 4)
        assert torch.allclose(labels.sum(1), torch.ones(6), atol=1e-6)
        assert (labels >= 0).all()
        # mixed: some row puts weight on two classes (the rolled batch's partner differs in label)
        assert images.dtype == (torch.uint8 if normalization == "device" else torch.float32)
        assert images.shape == plain_images.shape
        assert plain_labels.dtype == torch.int64
        batches += 1
    assert batches == len(loader) == 6
    mixed = get_data(dataset, "train", 6, 0, normalization="device", instance=SINGLE,
                     transform=strong_augmentation(32), batch_transform=v2.MixUp(alpha=1.0, num_classes=4))
    images, labels = next(iter(mixed))
    assert (labels.max(1).values < 1).any(), "MixUp left every label one-hot"


def test_mixup_on_uint8_is_the_float_mix_rounded(converted):
    """Device normalisation: the uint8 batch holds the float mix, rounded (off by at most 0.5)."""
    from imagenet_shards.loader.user_transforms import BatchTransform

    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    labels = torch.tensor([0, 1, 2, 3])
    mixup = v2.MixUp(alpha=1.0, num_classes=4)
    stream = TorchRandom()
    stream.begin("x")
    start = stream.state.clone()
    mixed = images.clone()
    soft = BatchTransform(mixup, stream)(mixed, labels)
    saved = torch.get_rng_state()
    torch.set_rng_state(start)
    expected, expected_labels = mixup(images.float(), labels)
    torch.set_rng_state(saved)
    assert torch.equal(soft, expected_labels)
    assert (mixed.float() - expected).abs().max() <= 0.5


def test_a_transform_that_does_not_end_on_uint8_at_size_is_refused(converted):
    dataset = converted("img")
    with pytest.raises(TransformError, match="float32"):
        get_data(dataset, "train", 4, 0, instance=SINGLE, transform=v2.Compose(
            [v2.RandomResizedCrop(32), v2.ToDtype(torch.float32, scale=True)]))
    with pytest.raises(TransformError, match="image_size=64"):
        get_data(dataset, "train", 4, 0, instance=SINGLE,
                 transform=UserTransform(v2.RandomResizedCrop(32), image_size=64))
    with pytest.raises(TransformError, match=r"uint8 \(3, S, S\)"):
        get_data(dataset, "train", 4, 0, instance=SINGLE, transform=v2.RandAugment())
    with pytest.raises(TransformError, match=r"expects uint8 \(3, 64, 64\)"):
        get_data(dataset, "train", 4, 0, instance=SINGLE,
                 transform=UserTransform(v2.Compose([v2.RandAugment(), v2.Resize(40), v2.CenterCrop(40)]),
                                         image_size=64))
