"""pin_memory: batches come pinned in the ring's own page-locked buffers (imagenet_shards/loader/output/batch_ring.py).

The CUDA tests run where a GPU is (the device machine; CI has none and skips them): every batch is
copied to the GPU with non_blocking=True and let go at once, as a training loop does, behind a
second of GPU work, so no copy has run when the workers want their buffers back; a buffer that
went back to its worker before its copy ran shows up as a batch that differs from the same epoch
read unpinned (checked: freeing the buffers at once fails this test on an H200).
"""

import gc
import pickle

import pytest
import torch

from imagenet_shards.launcher import Instance
from imagenet_shards.loader.output.batch_ring import BatchRing
from imagenet_shards.loader.image_loader import get_data

SINGLE = Instance(0, 1, "explicit")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def img(converted):
    return converted("img")


def test_a_ring_sent_to_a_spawned_worker_carries_no_page_locks():
    ring = BatchRing(2, 3)
    ring.pin, ring.locked, ring.locked_by = True, {(0, 0): 1234}, 1
    copy = pickle.loads(pickle.dumps(ring))
    assert copy.locked == {} and copy.locked_by is None and not copy.pin
    ring.locked = {}  # nothing was locked for real


def test_without_cuda_pin_memory_changes_nothing(img):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only path")
    loader = get_data(img, "validation", 4, 2, instance=SINGLE, normalization="device", pin_memory=True)
    batches = [images.clone() for images, _ in loader]
    assert batches and not loader.dataset.ring.locked and not loader.dataset.ring.pin


@cuda
@pytest.mark.parametrize("workers", [0, 2])
def test_pinned_batches_copied_asynchronously_equal_the_unpinned_epoch(img, workers):
    # batches of 2: 18 a train epoch, more than a worker's ring slots, so slots come round in an epoch
    expected = [images.clone() for images, _ in get_data(img, "train", 2, workers, instance=SINGLE,
                                                         normalization="device", seed=3)]
    loader = get_data(img, "train", 2, workers, instance=SINGLE, normalization="device", seed=3, pin_memory=True)
    for delayed in (True, False):  # behind a second of GPU work; then again with the buffers locked before
        loader.set_epoch(0)
        if delayed:
            torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU time: every copy below waits behind it
        on_device = []
        for images, labels in loader:
            assert images.is_pinned() and labels.is_pinned()
            on_device.append(images.to("cuda", non_blocking=True))
        torch.cuda.synchronize()
        assert len(on_device) == len(expected) == 18
        assert all(torch.equal(d.cpu(), e) for d, e in zip(on_device, expected))
    ring = loader.dataset.ring
    assert ring.locked and ring.reused > 0
    del loader, ring
    gc.collect()  # unlocks the buffers; a second unlock or one in a worker would raise in CUDA


@cuda
def test_a_refused_page_lock_falls_back_to_pinned_copies(img, monkeypatch):
    from imagenet_shards.loader.output import batch_ring

    monkeypatch.setattr(batch_ring, "page_lock", lambda tensor: None)
    loader = get_data(img, "validation", 4, 2, instance=SINGLE, normalization="device", pin_memory=True)
    for _ in range(2):
        batches = [images for images, _ in loader]
        assert batches and all(images.is_pinned() for images in batches)
    assert not loader.dataset.ring.locked
