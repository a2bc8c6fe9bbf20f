"""imagenet_shards.loader.image_loader on the converted sample dataset (36 train / 12 validation samples, shards of 8).

Real stack throughout: real shards from create_webdataset.py, real DataLoader workers, real HTTP
servers (`python -m http.server`, and a Range-capable one), torchvision as the reference.
"""

import io
import os
import shutil
import socket
import subprocess
import tempfile
import sys
import time
import urllib.request
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from PIL import Image

from conftest import REPO, run_script
from imagenet_shards.index import read_sample_index
from imagenet_shards.launcher import Instance
from imagenet_shards.loader import DataSource, Normalization, Order, TrainCrop, ValidationCrop
from imagenet_shards.loader.image_loader import SampleError, get_data
from imagenet_shards.normalization import IMAGENET_MEAN, IMAGENET_STD, NormalizeOnDevice
from imagenet_shards.formats.npy import decode_npy
from imagenet_shards.loader.transform.pipeline import plan_steps
from imagenet_shards.preprocess import parse_stored_steps
from imagenet_shards.formats.tar import iter_tar_samples
from imagenet_shards.torchvision_cpu import transforms
from http_range_server import RangeHandler, serve as serve_with_ranges

SINGLE = Instance(0, 1, "explicit")


def keys_of(directory, split):
    return [r.key for r in read_sample_index(Path(directory) / f"samples-{split}.index.tsv")]


def read_all(loader):
    """(images, labels, keys) of one epoch, concatenated."""
    images, labels, keys = [], [], []
    for batch in loader:
        images.append(batch.images)
        labels.append(batch.labels)
        keys.extend(batch.keys)
    return torch.cat(images), torch.cat(labels), keys


def stored_payloads(directory, split, ext):
    """key -> payload bytes, read with the plain tar reader."""
    found = {}
    for shard in sorted(Path(directory).glob(f"{split}-*.tar")):
        for sample in iter_tar_samples(shard):
            found[sample["__key__"]] = bytes(sample[ext])
    return found


@pytest.fixture(scope="module")
def img(converted):
    return converted("img")


@pytest.fixture(scope="module")
def tensor(converted):
    return converted("tensor")


# ------------------------------------------------------------------ pipelines and normalisation


def test_validation_pixels_equal_torchvision(img, sample_source):
    """Resize(256) + CenterCrop(224), converted shards and the ImageFolder source alike."""
    reference = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.PILToTensor()])
    payloads = stored_payloads(img, "validation", "jpg")
    for source in (img, sample_source):
        loader = get_data(source, "validation", 5, 0, normalization="device", instance=SINGLE, with_keys=True,
                          transform=ValidationCrop(use_draft=False))
        images, labels, keys = read_all(loader)
        assert images.dtype == torch.uint8 and images.shape == (12, 3, 224, 224)
        for image, key in zip(images, keys):
            name = key.rsplit("/", 1)[-1]
            expected = reference(Image.open(io.BytesIO(payloads[name])).convert("RGB"))
            assert torch.equal(image, expected), key


def test_host_and_device_normalisation_agree(img):
    host = get_data(img, "validation", 4, 0, normalization="host", instance=SINGLE, with_keys=True)
    device = get_data(img, "validation", 4, 0, normalization="ipu", instance=SINGLE, with_keys=True)
    host_images, host_labels, host_keys = read_all(host)
    raw, labels, keys = read_all(device)
    assert raw.dtype == torch.uint8 and host_images.dtype == torch.float32
    assert keys == host_keys and torch.equal(labels, host_labels)
    on_device = NormalizeOnDevice(torch.nn.Identity())(raw)
    assert on_device.dtype == torch.float32
    assert (on_device - host_images).abs().max().item() <= 1e-6
    reference = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)(raw.float() / 255)
    assert (reference - host_images).abs().max().item() <= 1e-5
    half, _, _ = read_all(get_data(img, "validation", 4, 0, normalization=Normalization("host", "float16"),
                                   instance=SINGLE, with_keys=True))
    assert half.dtype == torch.float16
    assert torch.equal(half, NormalizeOnDevice(torch.nn.Identity(), dtype=torch.float16)(raw))


def test_stored_steps_are_skipped(tensor):
    """The tensor format stores validation as Resize(256) + CenterCrop(224): the loader copies it."""
    payloads = stored_payloads(tensor, "validation", "npy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader = get_data(tensor, "validation", 5, 1, normalization="device", instance=SINGLE, with_keys=True)
        images, _, keys = read_all(loader)
    assert len(keys) == 12
    for image, key in zip(images, keys):
        stored = decode_npy(payloads[key])
        assert stored.shape == (224, 224, 3)
        assert torch.equal(image, torch.from_numpy(stored.copy()).permute(2, 0, 1)), key
    # train runs its random crops on the stored 256x256 crops
    train = get_data(tensor, "train", 4, 0, normalization="device", instance=SINGLE)
    assert train.dataset.pipeline.steps == ("RandomResizedCrop", "RandomHorizontalFlip")
    assert next(iter(train))[0].shape == (4, 3, 224, 224)


def test_stored_step_that_runtime_upsamples_is_a_warning(tensor):
    with pytest.warns(UserWarning, match=r"short side of 256 px: the runtime RandomResizedCrop\(288\) upsamples"):
        get_data(tensor, "train", 4, 0, instance=SINGLE, transform=TrainCrop(image_size=288))
    steps = parse_stored_steps(["Resize(128)"])
    remaining, notes = plan_steps(False, 224, 256, steps)
    assert [s.name for s in remaining] == ["Resize", "CenterCrop"] and "upsamples" in notes[0]
    remaining, notes = plan_steps(False, 224, 256, parse_stored_steps("Resize(512)"))
    assert "undoes the stored Resize(512)" in notes[0]
    remaining, notes = plan_steps(False, 224, 256, parse_stored_steps(["Resize(256)"]))
    assert [s.name for s in remaining] == ["CenterCrop"] and notes == []


def test_a_stored_pipeline_that_is_not_steps_is_an_error_naming_metadata_json(img, tmp_path):
    import json

    from imagenet_shards.loader.sources import SourceError

    target = tmp_path / "img"
    shutil.copytree(img, target)
    metadata = json.loads((target / "metadata.json").read_text())
    metadata["validation_transform_pipeline"] = ["Resize(256"]
    (target / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(SourceError, match=r"metadata.json: validation_transform_pipeline: preprocessing step "
                                          r"'Resize\(256' does not parse"):
        get_data(str(target), "validation", 4, 0, instance=SINGLE)


def test_train_is_deterministic_per_epoch_and_changes_with_it(img):
    def epoch_keys(epoch, workers):
        loader = get_data(img, "train", 4, workers, instance=SINGLE, epoch=epoch, with_keys=True,
                          normalization="device")
        return read_all(loader)

    first, _, keys0 = epoch_keys(3, 2)
    again, _, keys0_again = epoch_keys(3, 2)
    _, _, keys1 = epoch_keys(4, 2)
    assert keys0 == keys0_again and torch.equal(first, again)
    assert keys0 != keys1 and sorted(keys0) == sorted(keys1) == sorted(keys_of(img, "train"))
    # iterating again without set_epoch moves to the next epoch
    loader = get_data(img, "train", 4, 2, instance=SINGLE, epoch=3, with_keys=True, normalization="device")
    assert read_all(loader)[2] == keys0 and loader.report.epoch == 3
    assert read_all(loader)[2] == keys1 and loader.report.epoch == 4


# ------------------------------------------------------------------ shares: instances x workers


@pytest.mark.parametrize("fmt", ["img", "tfrecord"])
@pytest.mark.parametrize("count", [2, 3, 5])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_simulated_instances_validation_exactly_once(converted, fmt, count, workers):
    dataset = converted(fmt)
    seen = []
    for index in range(count):
        loader = get_data(dataset, "validation", 2, workers, instance=Instance(index, count, "explicit"),
                          with_keys=True, normalization="device")
        seen += read_all(loader)[2]
        assert loader.report.complete and not loader.report.skipped
    assert Counter(seen) == Counter(keys_of(dataset, "validation"))


@pytest.mark.parametrize("fmt", ["img", "tfrecord"])
@pytest.mark.parametrize("count", [2, 3, 5])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_simulated_instances_train_equal_batches(converted, fmt, count, workers, policy):
    dataset = converted(fmt)
    all_keys = keys_of(dataset, "train")
    read, batches, padded, last_batches, policy_dropped = Counter(), set(), Counter(), Counter(), []
    for index in range(count):
        loader = get_data(dataset, "train", 3, workers, instance=Instance(index, count, "explicit"), with_keys=True,
                          normalization="device", order=Order(policy=policy), epoch=1)
        n = 0
        for batch in loader:
            n += 1
            assert len(batch.keys) == 3
            read.update(batch.keys)
        assert n == len(loader) == loader.report.batches
        batches.add(n)
        padded.update(loader.report.padded)
        last_batches.update(loader.report.last_batch_dropped)
        policy_dropped = loader.report.policy_dropped  # the same list on every instance
    assert len(batches) == 1
    # what was read, plus what the reports say was left out, is the dataset plus the named repeats
    assert read + last_batches + Counter(policy_dropped) == Counter(all_keys) + padded
    if policy == "drop":
        assert not padded and len(policy_dropped) == 36 % count
    else:
        assert not policy_dropped and sum(padded.values()) == -(-36 // count) * count - 36


@pytest.mark.parametrize("normalization", ["device", "host"])
def test_batches_kept_by_the_caller_are_never_overwritten(img, normalization):
    """Output buffers are reused only once nothing references them (see BatchRing)."""
    loader = get_data(img, "train", 2, 2, instance=SINGLE, with_keys=True, normalization=normalization)
    kept, copies = [], []
    for batch in loader:
        kept.append(batch.images)
        copies.append(batch.images.clone())
    assert len(kept) == 18 and all(torch.equal(k, c) for k, c in zip(kept, copies))
    assert loader.dataset.ring.fresh > 0  # the ring ran out of free slots and did not wait
    # The same epoch again, dropping each batch: the workers reuse their buffers, same content.
    again = get_data(img, "train", 2, 2, instance=SINGLE, with_keys=True, normalization=normalization)
    for _ in range(2):  # the second epoch reuses buffers received in the first
        copies_again = [batch.images.clone() for batch in again]
    again.set_epoch(0)
    copies_again = [batch.images.clone() for batch in again]
    assert again.dataset.ring.reused > 0
    assert all(torch.equal(a, b) for a, b in zip(copies, copies_again))


def test_labels_cross_the_worker_boundary_as_arrays_and_arrive_as_int64_tensors(img):
    """A worker's message holds the labels as a numpy array (a tensor would cost a shared-memory
    segment per batch); DataLoader hands the message over as it is; the batch has int64 labels."""
    from imagenet_shards.loader.output.batch_ring import BatchBuilder, BatchRing
    from imagenet_shards.loader.image_loader import as_sent

    builder = BatchBuilder(2, 8, False, False, torch.float32, None, None, False, BatchRing(1, 3), 0)
    for label, key in ((3, "a"), (7, "b")):
        builder.slot()
        builder.add(label, key)
    message = builder.emit()
    assert type(message.labels).__name__ == "ndarray" and as_sent(message) is message
    loader = get_data(img, "train", 4, 2, instance=SINGLE, with_keys=True, normalization="device")
    assert loader._loader is None
    _, labels, keys = read_all(loader)
    assert loader._loader.collate_fn is as_sent
    recorded = {r.key: r.label for r in read_sample_index(Path(img) / "samples-train.index.tsv")}
    assert labels.dtype == torch.int64 and labels.tolist() == [recorded[key] for key in keys]


def test_fewer_shards_than_workers(img):
    """2 validation shards, 3 workers; and a one-shard source read by 2 workers."""
    loader = get_data(img, "validation", 2, 3, instance=SINGLE, with_keys=True, normalization="device")
    assert Counter(read_all(loader)[2]) == Counter(keys_of(img, "validation"))
    one_shard = [str(img / "validation-000001.tar")]
    loader = get_data(one_shard, "validation", 1, 2, instance=SINGLE, with_keys=True, normalization="device")
    keys = read_all(loader)[2]
    assert len(keys) == 4 and loader.report.workers_reported == 2


def test_repartition_is_used_when_present(img, tmp_path):
    target = tmp_path / "ds"
    shutil.copytree(img, target)
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 3, "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    validation, train_batches = [], set()
    for index in range(3):
        instance = Instance(index, 3, "explicit")
        loader = get_data(target, "validation", 2, 1, instance=instance, with_keys=True, normalization="device")
        validation += read_all(loader)[2]
        assert loader.report.repartition.endswith("distributed/3-instances/manifest.json")
        loader = get_data(target, "train", 4, 2, instance=instance, with_keys=True, normalization="device")
        keys = read_all(loader)[2]
        train_batches.add(len(keys) // 4)
        assert loader.report.repartition and len(keys) == 12
    assert Counter(validation) == Counter(keys_of(img, "validation"))
    assert train_batches == {3}


def test_stale_repartition_is_ignored_with_a_warning(img, tmp_path):
    target = tmp_path / "ds"
    shutil.copytree(img, target)
    result = run_script("distributed_webdataset.py", "--target", target, "--num-instances", 2, "--quiet")
    assert result.returncode == 0, result.stdout + result.stderr
    # A later re-conversion changes metadata.json; the old repartition no longer describes the data.
    metadata = target / "metadata.json"
    metadata.write_text(metadata.read_text().replace('"shuffle": true', '"shuffle": true ', 1))
    with pytest.warns(UserWarning, match="made for another version of this dataset"):
        loader = get_data(target, "validation", 2, 0, instance=Instance(0, 2, "explicit"), with_keys=True,
                          normalization="device")
    assert len(read_all(loader)[2]) == 6
    assert not loader.report.repartition


def test_foreign_shards_without_index_are_scanned(img, tmp_path):
    for shard in img.glob("validation-*.tar"):
        shutil.copy(shard, tmp_path / shard.name)
    with pytest.warns(UserWarning, match="without a sample index"):
        loader = get_data(tmp_path, "validation", 5, 2, instance=Instance(1, 2, "explicit"), with_keys=True,
                          normalization="device")
    second = read_all(loader)[2]
    with pytest.warns(UserWarning, match="without a sample index"):
        first = read_all(get_data(tmp_path, "validation", 5, 0, instance=Instance(0, 2, "explicit"),
                                  with_keys=True, normalization="device"))[2]
    assert Counter(first + second) == Counter(keys_of(img, "validation"))


def test_synthetic_source(tmp_path):
    loader = get_data(DataSource("synthetic", synthetic_length=100), "train", 8, 2, instance=Instance(1, 3, "explicit"),
                      normalization="host")
    batches = list(loader)
    assert len(batches) == len(loader) == 33 // 8
    assert batches[0][0].shape == (8, 3, 224, 224) and batches[0][0].dtype == torch.float32


def test_bad_arguments_are_clear(img):
    with pytest.raises(ValueError, match="normalization location 'gpu'"):
        get_data(img, "train", 4, normalization="gpu", instance=SINGLE)
    with pytest.raises(ValueError, match="on_error"):
        get_data(img, "train", 4, on_error="ignore", instance=SINGLE)
    with pytest.raises(ValueError, match="unknown policy 'even'"):
        get_data(img, "train", 4, order=Order(policy="even"), instance=SINGLE)
    with pytest.raises(Exception, match="no such file"):
        get_data(img / "missing", "train", 4, instance=SINGLE)


# ------------------------------------------------------------------ bad data


def _corrupt_copy(img, tmp_path, split="train"):
    target = tmp_path / "corrupt"
    shutil.copytree(img, target)
    records = read_sample_index(target / f"samples-{split}.index.tsv")
    return target, records


def test_corrupt_image_is_skipped_and_replaced_in_train(img, tmp_path):
    target, records = _corrupt_copy(img, tmp_path)
    bad = records[9]
    with open(target / bad.shard, "r+b") as handle:  # destroy the JPEG's start marker: not an image any more
        handle.seek(bad.payload_offset)
        handle.write(b"\0" * 16)
    # DataSource(verify=False): the decoder is what finds it (with verification on, its CRC32C does first)
    loader = get_data(DataSource(target, verify=False), "train", 4, 2, instance=SINGLE, with_keys=True,
                      normalization="device")
    with pytest.warns(UserWarning, match="1 samples skipped"):
        _, _, keys = read_all(loader)
    report = loader.report
    assert len(keys) == 36 and report.batches == len(loader) == 9
    assert [(s.key, s.shard) for s in report.skipped] == [(bad.key, bad.shard)]
    assert "UnidentifiedImageError" in report.skipped[0].reason
    assert bad.key not in keys and len(report.substituted) == 1
    (missing, repeated), = report.substituted
    assert missing == bad.key and Counter(keys)[repeated] == 2
    # validation does not substitute: one sample fewer
    with pytest.raises(SampleError, match=rf"{bad.shard}: sample '{bad.key}'"):
        read_all(get_data(target, "train", 4, 1, instance=SINGLE, with_keys=True, on_error="fail"))


def test_truncated_shard_skip_and_fail(img, tmp_path):
    target, records = _corrupt_copy(img, tmp_path, "validation")
    shard = records[0].shard
    in_shard = [r for r in records if r.shard == shard]
    cut = in_shard[5]
    with open(target / shard, "r+b") as handle:
        handle.truncate(cut.record_offset + cut.record_size // 2)
    loader = get_data(target, "validation", 4, 2, instance=SINGLE, with_keys=True, normalization="device")
    with pytest.warns(UserWarning, match="skipped"):
        _, _, keys = read_all(loader)
    lost = [r.key for r in in_shard[5:]]
    assert sorted(s.key for s in loader.report.skipped) == sorted(lost)
    assert all("truncated" in s.reason and s.shard == shard for s in loader.report.skipped)
    assert Counter(keys) == Counter(k for k in keys_of(img, "validation") if k not in lost)
    with pytest.raises(SampleError, match=rf"{shard}: sample '{cut.key}'.*truncated"):
        read_all(get_data(target, "validation", 4, 0, instance=SINGLE, with_keys=True, on_error="fail"))


def test_a_shard_that_no_longer_matches_its_index_names_the_member(img, tmp_path):
    """A payload member renamed in the shard (its header's name field; the index unchanged): the
    sample is bad with both names, read through the local fast path (no record built) and with 2 workers."""
    target, records = _corrupt_copy(img, tmp_path, "validation")
    bad = records[3]
    header = bad.payload_offset - 512  # the payload member's tar header precedes its data
    with open(target / bad.shard, "r+b") as handle:
        handle.seek(header)
        name = handle.read(100).split(b"\0", 1)[0]
        assert name == f"{bad.key}.jpg".encode()
        handle.seek(header)
        handle.write(b"X" + name[1:])
    loader = get_data(target, "validation", 4, 2, instance=SINGLE, with_keys=True, normalization="device")
    with pytest.warns(UserWarning, match="1 samples skipped"):
        _, _, keys = read_all(loader)
    (skipped,) = loader.report.skipped
    assert (skipped.key, skipped.shard) == (bad.key, bad.shard) and bad.key not in keys
    assert f"the shard holds 'X{name[1:].decode()}', its index says '{bad.key}.jpg'" in skipped.reason
    assert "does not match its index" in skipped.reason


# ------------------------------------------------------------------ http


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(url, process=None):
    for _ in range(100):
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if process is not None and process.poll() is not None:
                raise RuntimeError(f"the server exited: {process.stderr.read()}")
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


@pytest.fixture(scope="module")
def http_base(img):
    """`python -m http.server` serving the converted dataset (it ignores Range: answers 200)."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                "--directory", str(img)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}/"
    try:
        _wait_for(base + "metadata.json", process)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_http_reads_equal_local_reads(img, http_base):
    local = get_data(img, "train", 4, 2, instance=Instance(1, 2, "explicit"), with_keys=True,
                     normalization="device")
    remote = get_data(http_base, "train", 4, 2, instance=Instance(1, 2, "explicit"), with_keys=True,
                      normalization="device")
    local_images, local_labels, local_keys = read_all(local)
    remote_images, remote_labels, remote_keys = read_all(remote)
    assert remote_keys == local_keys and torch.equal(remote_labels, local_labels)
    assert torch.equal(remote_images, local_images)  # same samples, same seeded augmentation
    # a brace pattern of shard URLs finds the dataset's index beside them
    pattern = http_base + "validation-{000000..000001}.tar"
    _, _, keys = read_all(get_data(pattern, "validation", 5, 1, instance=SINGLE, with_keys=True))
    assert Counter(keys) == Counter(keys_of(img, "validation"))


def test_http_range_requests(img):
    server, base = serve_with_ranges(img)
    served_before = RangeHandler.ranges_served
    try:
        expected = read_all(get_data(img, "validation", 3, 0, instance=Instance(1, 3, "explicit"),
                                     with_keys=True, normalization="device"))
        got = read_all(get_data(base, "validation", 3, 0, instance=Instance(1, 3, "explicit"),
                                with_keys=True, normalization="device"))
        assert got[2] == expected[2] and torch.equal(got[0], expected[0])
        assert RangeHandler.ranges_served > served_before
    finally:
        server.shutdown()
        server.server_close()


WORKER_UNDER_TMPDIR = """
import sys
from imagenet_shards.loader import get_data
loader = get_data(sys.argv[1], "train", 4, 1, normalization="device", instance=(0, 1))
print(len(next(iter(loader))[0]), flush=True)
"""


def test_workers_under_a_tmpdir_too_long_for_a_socket_are_refused_not_a_hang(converted, tmp_path):
    """Found by benchmarks/soak.py (seed 1, under pytest's long tmp_path): workers pass batches through a
    Unix socket in TMPDIR; past its 108-byte path the worker's send failed in a background thread and the
    training waited for ever. Now get_data's first iteration names the folder (UsageError, exit 1 here)."""
    from imagenet_shards.loader.image_loader import LISTENER_SUFFIX, UNIX_SOCKET_PATH

    base = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))  # pytest's tmp_path may itself be too long
    long = base / ("t" * (UNIX_SOCKET_PATH - LISTENER_SUFFIX - len(str(base)) - 1))  # the socket's path: 108 bytes,
    long.mkdir()  # the shortest that fails (a clean-clone CI run hung there with the bound off by one)
    short = base / "s"
    short.mkdir()
    runs = {}
    for name, folder in (("long", long), ("short", short)):
        runs[name] = subprocess.run([sys.executable, "-c", WORKER_UNDER_TMPDIR, str(converted("img"))], timeout=120,
                                    capture_output=True, text=True, cwd=REPO,
                                    env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(folder)})
    assert runs["short"].returncode == 0 and runs["short"].stdout.strip() == "4", runs["short"].stderr[-2000:]
    failed = runs["long"]
    assert failed.returncode == 1
    last = failed.stderr.strip().splitlines()[-1]
    assert "TempDirError" in last and str(long) in last and "TMPDIR" in last, failed.stderr[-2000:]
    shutil.rmtree(base)


def test_the_image_folder_listing_is_torchvision_s(sample_source, tmp_path):
    """imagenet_shards.dataset_folder.image_folder_samples lists a folder as torchvision's ImageFolder does (it is
    what resolving a folder source uses, so that listing one does not import torchvision): the same classes,
    paths and order, and the same errors."""
    from imagenet_shards.dataset_folder import image_folder_samples
    from imagenet_shards.torchvision_cpu import torchvision

    folder_module = torchvision.datasets.folder
    for split in ("train", "validation"):
        folder = str(sample_source / split)
        classes, class_to_index = folder_module.find_classes(folder)
        expected = folder_module.make_dataset(folder, class_to_index, extensions=folder_module.IMG_EXTENSIONS)
        assert image_folder_samples(folder) == (classes, expected) and len(expected) > 0
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.JPEG").write_bytes(b"")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "notes.txt").write_text("not an image")
    for folder in (tmp_path, tmp_path / "a"):  # a class without an image; no class folder
        with pytest.raises(FileNotFoundError) as theirs:
            folder_module.make_dataset(str(folder), folder_module.find_classes(str(folder))[1],
                                       extensions=folder_module.IMG_EXTENSIONS)
        with pytest.raises(FileNotFoundError) as ours:
            image_folder_samples(str(folder))
        assert str(ours.value) == str(theirs.value)
