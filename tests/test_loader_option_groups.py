"""get_data's option groups (imagenet_shards/loader/options.py, issue 34): the built-in recipes as TrainCrop /
ValidationCrop give the batches the earlier keywords gave for the same seed (so a resume state saved
before the change continues exactly), and each earlier keyword still works, with a DeprecationWarning
naming the new form, giving what its group gives.

Real stack: the sample source converted to img shards, the native crop decoder where it is built.
"""

from __future__ import annotations

import hashlib
import inspect
import warnings

import pytest
import torch

from imagenet_shards.launcher import Instance
from imagenet_shards.loader import Cache, DataSource, Normalization, Order, TrainCrop, UserTransform, ValidationCrop, get_data

SINGLE = Instance(0, 1, "explicit")
BATCHES = 3
# sha256 of the keys and labels of the first BATCHES batches of the sample source's img conversion, made with
# get_data's earlier keywords at e5079e8 (before the groups), as the tests below make them: the order is the
# same. The pixels are compared between the earlier keywords and the groups in the same run (their digest
# depends on the JPEG codec's build; at e5079e8 and after the groups they were equal, 2026-11-28).
KEYS_AT_E5079E8 = {"train": "ad833c9bbdc23c3ad18c30d4d0f8b1ed33685c8d3053f9c2d94d921df2ad961c",
                   "validation": "202c645bea33b554dbe5409e5526b9852d4311c1702d21b0bd1206a37dd8f8cb"}


def digests(loader) -> tuple:
    """(sha256 of the keys and labels, sha256 of the pixels) of the loader's first BATCHES batches."""
    keys, pixels = hashlib.sha256(), hashlib.sha256()
    for number, batch in enumerate(loader):
        if number == BATCHES:
            break
        keys.update(repr((list(batch.keys), batch.labels.tolist())).encode())
        pixels.update(batch.images.contiguous().numpy().tobytes())
    return keys.hexdigest(), pixels.hexdigest()


def earlier(*args, **kwargs):
    """get_data with the earlier keywords, their DeprecationWarnings expected."""
    with pytest.warns(DeprecationWarning, match="is deprecated and goes in the next release"):
        return get_data(*args, **kwargs)


@pytest.fixture(scope="module")
def img(converted):
    return converted("img")


TRAIN = {"seed": 7, "epoch": 2, "instance": SINGLE, "with_keys": True, "normalization": "device"}


def test_get_data_has_at_most_20_parameters():
    assert len(inspect.signature(get_data).parameters) <= 20


def test_train_crop_gives_the_batches_of_the_earlier_keywords(img):
    old = earlier(img, "train", 8, 0, image_size=96, scale=(0.25, 1.0), ratio=(0.8, 1.25), use_draft=True,
                  shuffle_buffer=16, **TRAIN)
    new = get_data(img, "train", 8, 0, transform=TrainCrop(image_size=96, scale=(0.25, 1.0), ratio=(0.8, 1.25)),
                   order=Order(shuffle_buffer=16), **TRAIN)
    assert new.dataset.pipeline == old.dataset.pipeline  # the same pipeline object: the same fused decode path
    assert new.dataset.pipeline.steps == ("RandomResizedCrop", "RandomHorizontalFlip")
    new_digests = digests(new)
    assert new_digests == digests(old)
    assert new_digests[0] == KEYS_AT_E5079E8["train"]


def test_validation_crop_gives_the_batches_of_the_earlier_keywords(img):
    options = {"instance": SINGLE, "with_keys": True, "normalization": "device"}
    old = earlier(img, "validation", 8, 0, image_size=96, resize_size=120, use_draft=False, **options)
    new = get_data(img, "validation", 8, 0, transform=ValidationCrop(image_size=96, resize_size=120, use_draft=False),
                   **options)
    assert new.dataset.pipeline == old.dataset.pipeline
    new_digests = digests(new)
    assert new_digests == digests(old)
    assert new_digests[0] == KEYS_AT_E5079E8["validation"]
    default = get_data(img, "validation", 8, 0, **options)  # None: ValidationCrop() (224, resize 256)
    assert (default.dataset.pipeline.size, default.dataset.pipeline.resize) == (224, 256)


def test_a_state_saved_with_the_earlier_keywords_resumes_with_the_groups(img):
    old = earlier(img, "train", 4, 0, image_size=64, shuffle_buffer=8, **TRAIN)
    whole = [(list(b.keys), b.images.clone()) for b in old]
    old = earlier(img, "train", 4, 0, image_size=64, shuffle_buffer=8, **TRAIN)
    iterator = iter(old)
    for _ in range(2):
        next(iterator)
    state = old.state_dict()
    del iterator
    new = get_data(img, "train", 4, 0, transform=TrainCrop(image_size=64), order=Order(shuffle_buffer=8), **TRAIN)
    new.load_state_dict(state)
    rest = [(list(b.keys), b.images) for b in new]
    assert [k for k, _ in rest] == [k for k, _ in whole[2:]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rest, whole[2:]))


GROUPS = {  # group: (earlier keywords, the new form's arguments)
    "source": ({"verify": False, "use_bbox_info": True}, {"source": "DataSource"}),
    "transform": ({"image_size": 64, "use_draft": False}, {"transform": TrainCrop(image_size=64, use_draft=False)}),
    "normalization": ({"dtype": "float16", "channels_last": True, "mean": (0.5, 0.5, 0.5)},
                      {"normalization": Normalization("host", "float16", mean=(0.5, 0.5, 0.5), channels_last=True)}),
    "cache": ({"cache_dir": "CACHE", "cache_remote_paths": True, "cache_prefetch": 1}, {"cache": "Cache"}),
    "order": ({"policy": "pad", "shuffle_buffer": 5, "drop_last": False},
              {"order": Order(policy="pad", shuffle_buffer=5, drop_last=False)}),
}
NEW_FORM = {"source": r"use DataSource\(source, verify=False, use_bbox_info=True\) as the first argument",
            "transform": r"use transform=TrainCrop\(image_size=64, use_draft=False\)",
            "normalization": r"use normalization=Normalization\(dtype='float16', mean=\(0.5, 0.5, 0.5\), "
                             r"channels_last=True\)",
            "cache": r"use cache=Cache\(directory=.*, remote_paths=True, prefetch=1\)",
            "order": r"use order=Order\(policy='pad', drop_last=False, shuffle_buffer=5\)"}


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_each_earlier_keyword_warns_with_its_group_and_gives_its_batches(img, tmp_path, group):
    keywords, new_form = GROUPS[group]
    if group == "cache":
        keywords = {**keywords, "cache_dir": tmp_path / "old"}
        new_form = {"cache": Cache(tmp_path / "new", remote_paths=True, prefetch=1)}
    source = DataSource(img, verify=False, use_bbox_info=True) if group == "source" else img
    new_form = {k: v for k, v in new_form.items() if k != "source"}
    options = {"seed": 3, "instance": SINGLE, "with_keys": True}
    order = new_form.pop("order", Order(shuffle_buffer=4))
    with pytest.warns(DeprecationWarning, match=NEW_FORM[group]):
        old = get_data(img, "train", 4, 0, **options, **keywords, **({} if group == "order" else {"order": order}))
    new = get_data(source, "train", 4, 0, order=order, **options, **new_form)
    assert digests(new) == digests(old)
    if group == "cache":
        cached = [sorted(p.name for p in (tmp_path / side).rglob("*.tar")) for side in ("old", "new")]
        assert cached[0] and cached[0] == cached[1]


def test_the_new_form_warns_nothing_and_a_keyword_get_data_never_had_is_a_type_error(img):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        get_data(DataSource(img, verify=False), "validation", 4, 0, instance=SINGLE, order="shards",
                 normalization=Normalization("device"), transform=ValidationCrop(image_size=64), cache=None)
    with pytest.raises(TypeError, match="unexpected keyword argument 'image_sise'"):
        get_data(img, "validation", 4, 0, instance=SINGLE, image_sise=64)


def test_a_user_transform_takes_its_settings_in_user_transform(img):
    from imagenet_shards.torchvision_cpu import transforms_v2 as v2

    transform = v2.Compose([v2.RandomResizedCrop(64, antialias=True), v2.RandomHorizontalFlip()])
    old = earlier(img, "train", 4, 0, transform=transform, use_draft=False, **TRAIN)
    new = get_data(img, "train", 4, 0, transform=UserTransform(transform, use_draft=False), **TRAIN)
    assert new.dataset.pipeline.base == old.dataset.pipeline.base
    assert digests(new) == digests(old)


def test_a_ledger_names_the_location_a_data_source_holds(img, tmp_path):
    loader = get_data(DataSource(img, verify=False), "validation", 4, 0, instance=SINGLE,
                      transform=ValidationCrop(image_size=32))
    list(loader)
    assert loader.write_ledger(tmp_path / "ledger.json")["source"] == str(img)


@pytest.mark.parametrize("arguments, refusal", [
    ({"on_error": "ignore"}, "on_error must be one of"),
    ({"order": Order(policy="even")}, "unknown policy 'even'"),
    ({"batch_size": 0}, "batch_size must be at least 1"),
    ({"jpeg_decode": "device"}, "jpeg_decode='device' hands out uint8 batches"),
])
def test_a_refusal_the_arguments_alone_decide_comes_before_the_source_is_read(tmp_path, arguments, refusal):
    """Issue 46: get_data's settings are checked before any I/O: a source that does not exist is not reached."""
    arguments = {"batch_size": 4, **arguments}
    with pytest.raises(ValueError, match=refusal):
        get_data(str(tmp_path / "nowhere"), "train", instance=Instance(0, 1, "explicit"), **arguments)
