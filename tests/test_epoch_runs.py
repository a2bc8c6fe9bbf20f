"""One DataLoader iteration across epochs (imagenet_shards/loader/read/epoch_runs.py), on the converted sample
dataset (36 train / 12 validation samples): the workers run on into the next epoch, and what they
hand over is exactly what a fresh loader gives for that epoch."""

import gc
import shutil

import pytest
import torch

from imagenet_shards.launcher import Instance
from imagenet_shards.loader.image_loader import SampleError, get_data
from imagenet_shards.index import read_sample_index

SINGLE = Instance(0, 1, "explicit")


@pytest.fixture(scope="module")
def img(converted):
    return converted("img")


def epoch_of(loader, stop_after=None):
    """(keys, images) of one `for` over the loader, stopping after `stop_after` batches if given."""
    keys, images = [], []
    for number, batch in enumerate(loader):
        keys.extend(batch.keys)
        images.append(batch.images.clone())
        if stop_after is not None and number + 1 == stop_after:
            break
    return keys, torch.cat(images)


def fresh_epoch(img, epoch, split="train", workers=2):
    return epoch_of(get_data(img, split, 4, workers, instance=SINGLE, epoch=epoch, with_keys=True,
                             normalization="device"))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("read_ahead", [True, False])
def test_epoch_after_epoch_is_one_iteration_and_each_equals_a_fresh_loader(img, workers, read_ahead):
    loader = get_data(img, "train", 4, workers, instance=SINGLE, with_keys=True, normalization="device",
                      read_ahead=read_ahead)
    epoch_of(loader)
    runs = loader._runs
    generation = runs.generation
    for epoch in range(1, 6):  # `for` without set_epoch goes on with the next epoch
        keys, images = epoch_of(loader)
        if epoch < 3:
            expected_keys, expected_images = fresh_epoch(img, epoch, workers=workers)
            assert keys == expected_keys and torch.equal(images, expected_images)
        assert loader.report.epoch == epoch and loader.report.complete
        # 9 batches of 4: 4 for worker 0, 5 for worker 1, yet what waits ahead of its turn stays
        # bounded (a worker's batches would pile up by one an epoch without Fillers)
        assert sum(len(queue) for queue in runs.queues) <= 1
    # read ahead: one generation (no reset between epochs); else one generation an epoch
    assert runs.generation == generation + (0 if read_ahead else 5)
    assert loader.dataset.ring.fresh == 0  # every batch was let go: the ring never ran short


def test_another_epoch_or_a_break_midway_starts_a_new_generation(img):
    loader = get_data(img, "train", 4, 2, instance=SINGLE, with_keys=True, normalization="device")
    epoch_of(loader)
    generation = loader._runs.generation
    loader.set_epoch(5)  # not the epoch the workers ran on into: what they sent for epoch 1 is thrown away
    keys, images = epoch_of(loader)
    expected_keys, expected_images = fresh_epoch(img, 5)
    assert keys == expected_keys and torch.equal(images, expected_images)
    assert loader._runs.generation == generation + 1
    for _ in range(3):
        epoch_of(loader, stop_after=1)  # epochs 6, 7, 8 left after their first batch
    assert loader._runs.generation == generation + 3  # epoch 6 went on from 5; 7 and 8 did not
    keys, images = epoch_of(loader)
    expected_keys, expected_images = fresh_epoch(img, 9)
    assert keys == expected_keys and torch.equal(images, expected_images)
    assert loader._runs.generation == generation + 4
    # the batches of abandoned epochs gave their buffers back: the ring never allocated past its slots
    assert loader.dataset.ring.fresh == 0


def test_validation_epochs_run_on_with_the_same_samples(img):
    loader = get_data(img, "validation", 4, 2, instance=SINGLE, with_keys=True, normalization="device")
    first = epoch_of(loader)
    for _ in range(3):
        keys, images = epoch_of(loader)
        assert keys == first[0] and torch.equal(images, first[1])
    assert sorted(first[0]) == sorted(r.key for r in read_sample_index(img / "samples-validation.index.tsv"))


def _failing_loader(img, tmp_path):
    target = tmp_path / "corrupt"
    shutil.copytree(img, target)
    bad = read_sample_index(target / "samples-train.index.tsv")[9]
    with open(target / bad.shard, "r+b") as handle:  # not a JPEG any more
        handle.seek(bad.payload_offset)
        handle.write(b"\0" * 16)
    return get_data(target, "train", 4, 2, instance=SINGLE, on_error="fail", normalization="device")


def test_a_worker_error_leaves_no_cycle_holding_the_workers(img, tmp_path):
    """DataLoader re-raises a worker's error from a frame holding it; left as it is, that cycle keeps
    the DataLoader iterator until the garbage collector runs, which closes its queues first and
    makes the workers' shutdown wait 5 s each. The loader must be freed by reference counting."""
    loader = _failing_loader(img, tmp_path)
    gc.collect()
    gc.disable()  # from here on, only reference counting frees anything
    try:
        try:
            for _ in loader:
                pass
        except SampleError:
            pass
        else:
            pytest.fail("the corrupt sample did not fail")
        del loader
        # (the failed iterator is shut down and dropped at the error: none may be left, not even in a cycle)
        left = [o for o in gc.get_objects() if type(o).__name__ == "_MultiProcessingDataLoaderIter"]
        assert left == [], "the DataLoader iterator outlived its loader (a reference cycle holds it)"
    finally:
        gc.enable()


def test_validation_with_skipped_samples_keeps_every_epoch_and_the_turns(img, tmp_path):
    """Two bad samples in worker 0's share (spread policy: nothing substituted) leave it one batch
    short of worker 1 every epoch; its Fillers keep the workers' turns aligned across epochs."""
    target = tmp_path / "corrupt"
    shutil.copytree(img, target)
    records = read_sample_index(target / "samples-validation.index.tsv")
    for bad in records[:2]:  # the first of 12 samples: worker 0's, in batches of 2
        with open(target / bad.shard, "r+b") as handle:
            handle.seek(bad.payload_offset)
            handle.write(b"\0" * 16)
    loader = get_data(target, "validation", 2, 2, instance=SINGLE, with_keys=True, normalization="device")
    expected = sorted(r.key for r in records[2:])
    for _ in range(4):
        with pytest.warns(UserWarning, match="skipped"):
            keys, _ = epoch_of(loader)
        assert sorted(keys) == expected and len(loader.report.skipped) == 2
        assert sum(len(queue) for queue in loader._runs.queues) <= 1
