"""The loader's source-kind and payload-kind registries are open: a kind registered from outside the
loader (here, in the test) is what get_data reads and decodes through, with no loader change."""

import re
import numpy as np
import pytest

from imagenet_shards.launcher import Instance
from imagenet_shards.loader import ValidationCrop
from imagenet_shards.loader.image_loader import get_data
from imagenet_shards.loader.payloads import PAYLOADS, PayloadKind, get_payload
from imagenet_shards.loader.source_kinds import SOURCE_KINDS, SourceKind, UnknownSourceKindError
from imagenet_shards.loader.sources import FolderItem, Source, resolve_source

SINGLE = Instance(0, 1, "explicit")
SIZE = 8


def _gray_into(pipeline, payload, slot, rng, bbox, source):
    """The toy payload: one byte, the grey level of a SIZE x SIZE image."""
    pipeline.array_into(np.full((SIZE, SIZE, 3), payload[0], dtype=np.uint8), slot, rng)


def _toy_samples(context, items):
    """The toy source kind: item n's payload is the byte 10 * n, of the toy payload kind."""
    for item in items:
        yield item, "toy-shard", item.label, bytes([10 * int(item.path)]), "toy-gray", None


@pytest.fixture
def toy_kinds(monkeypatch):
    monkeypatch.setitem(PAYLOADS, "toy-gray", PayloadKind("toy-gray", ("gray",), _gray_into))
    monkeypatch.setitem(SOURCE_KINDS, "toy", SourceKind("toy", _toy_samples))


def _toy_source(count):
    items = [FolderItem(f"toy-{n}", str(n), n % 3) for n in range(count)]
    return Source("toy", f"toy source: {count} samples", [[item] for item in items], "gray")


@pytest.mark.parametrize("workers", [0, 1])
def test_a_registered_source_kind_and_payload_kind_load_through_get_data(toy_kinds, workers):
    loader = get_data(_toy_source(7), "validation", batch_size=3, workers=workers, instance=SINGLE,
                      normalization="device", transform=ValidationCrop(image_size=SIZE, resize_size=SIZE),
                      on_error="fail", with_keys=True)
    batches = list(loader)
    keys = [key for batch in batches for key in batch.keys]
    assert keys == [f"toy-{n}" for n in range(7)]
    assert [len(batch.keys) for batch in batches] == [3, 3, 1]
    for batch in batches:
        for image, label, key in zip(batch.images, batch.labels, batch.keys):
            n = int(key.split("-")[1])
            assert image.shape == (3, SIZE, SIZE)
            assert bool((image == 10 * n).all()), f"{key}: not the toy payload's grey level {10 * n}"
            assert int(label) == n % 3
    assert not loader.report.skipped


def test_payload_kinds_are_found_by_member_extension(toy_kinds):
    assert get_payload("gray").name == "toy-gray"
    assert get_payload("npy").name == "npy"
    assert get_payload("pth").name == "pth"
    assert get_payload("jpg").name == "encoded"
    assert get_payload("webp").name == "encoded"  # and anything unclaimed is an encoded image
    assert get_payload("tiff").name == "encoded"


def test_an_unregistered_source_kind_is_named():
    known = ", ".join(SOURCE_KINDS)
    assert known.startswith("shards, folder, synthetic")
    with pytest.raises(UnknownSourceKindError, match=re.escape(f"unknown source kind 'toy' (known: {known})")):
        get_data(_toy_source(2), "validation", batch_size=2, instance=SINGLE)


def test_an_unregistered_payload_kind_is_a_bad_sample(monkeypatch):
    """A source kind naming a payload kind nobody registered: each sample skipped with the reason."""
    monkeypatch.setitem(SOURCE_KINDS, "toy", SourceKind("toy", _toy_samples))
    loader = get_data(_toy_source(2), "validation", batch_size=2, instance=SINGLE,
                      transform=ValidationCrop(image_size=SIZE, resize_size=SIZE))
    with pytest.raises(Exception, match="every sample"):
        list(loader)
    assert [s.reason for s in loader.report.skipped] == [
        "UnknownPayloadError: unknown payload kind 'toy-gray' (known: encoded, npy, pth, array)"] * 2


def test_every_kind_resolves_and_resolve_source_asks_each_in_the_registry_order():
    """Issue 46: a kind resolves what names it (its `resolve` hook); the registry lists every kind once to ask."""
    from imagenet_shards.loader.source_kinds import RESOLVING, SOURCE_KINDS
    from imagenet_shards.loader.source_kinds.shards import KIND
    from imagenet_shards.loader.source_kinds.synthetic import SyntheticSettings

    assert sorted(kind.name for kind in RESOLVING) == sorted(SOURCE_KINDS)
    assert all(kind.resolve is not None for kind in RESOLVING)
    assert SOURCE_KINDS[KIND].resolve_loose is not None  # shards.py makes Sources of the shard kind
    resolved = resolve_source("Generated", "validation", image_size=32, synthetic_length=5)
    assert (resolved.kind, resolved.total, resolved.settings) == ("synthetic", 5, SyntheticSettings((32, 32, 3)))
    assert resolved.columns is None and resolved.label_offset == 0  # the shard kind's settings read as before
