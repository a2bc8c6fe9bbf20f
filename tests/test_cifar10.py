"""--data cifar10: CIFAR-shaped python batches load through the restricted unpickler; anything else in a
pickle is refused without running it; nothing is downloaded (a clear error says where the files go)."""

import pickle

import numpy as np
import pytest

from conftest import run_script, run_scripts
from imagenet_shards.cifar10 import FOLDER, CifarError, load_split, restricted_load

NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]


def batch(count, seed):
    """A batch as the real files hold it: the R, G and B 32x32 planes of each image, one row each."""
    rng = np.random.default_rng(seed)
    return {b"batch_label": f"batch {seed}".encode(), b"labels": [int(v) for v in rng.integers(0, 10, count)],
            b"data": rng.integers(0, 256, (count, 3072), dtype=np.uint8),
            b"filenames": [f"image_{seed}_{n}.png".encode() for n in range(count)]}


@pytest.fixture
def cifar(tmp_path):
    folder = tmp_path / FOLDER
    folder.mkdir()
    batches = {f"data_batch_{n}": batch(6, n) for n in range(1, 6)}
    batches["test_batch"] = batch(8, 0)
    for name, value in batches.items():
        (folder / name).write_bytes(pickle.dumps(value, protocol=2))  # the real files' protocol
    (folder / "batches.meta").write_bytes(pickle.dumps({b"num_cases_per_batch": 6, b"label_names": NAMES,
                                                        b"num_vis": 3072}, protocol=2))
    return tmp_path, batches


def test_cifar_shaped_batches_load_as_hwc_images_with_labels_and_names(cifar):
    root, batches = cifar
    images, labels, names = load_split(root, "train")
    assert images.shape == (30, 32, 32, 3) and images.dtype == np.uint8 and labels.tolist() == sum(
        (batches[f"data_batch_{n}"][b"labels"] for n in range(1, 6)), [])
    first = batches["data_batch_1"][b"data"][0]
    assert images[0, 0, 0].tolist() == [first[0], first[1024], first[2048]]  # R, G, B planes -> HWC
    assert images[0, 31, 31].tolist() == [first[1023], first[2047], first[3071]]
    assert names[:2] == ["airplane", "automobile"]
    images, labels, _ = load_split(root / FOLDER, "validation")  # the batches folder itself works too
    assert images.shape == (8, 32, 32, 3) and labels.tolist() == batches["test_batch"][b"labels"]


def test_the_loader_reads_cifar_batches(cifar):
    from imagenet_shards.loader import ValidationCrop, get_data

    root, batches = cifar
    loader = get_data(str(root), "validation", batch_size=4, transform=ValidationCrop(image_size=32),
                      normalization="device", with_keys=True)
    seen = {}
    for images, labels, keys in loader:
        assert tuple(images.shape) == (4, 3, 32, 32)
        seen.update(zip(keys, labels.tolist()))
    assert sorted(seen) == [f"cifar10-{n:09d}" for n in range(8)]
    assert [seen[f"cifar10-{n:09d}"] for n in range(8)] == batches["test_batch"][b"labels"]


class RunsCode:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_a_reduce_payload_is_refused_without_running_it(cifar, tmp_path):
    root, batches = cifar
    marker = tmp_path / "ran"
    evil = {**batches["test_batch"], b"labels": RunsCode(marker)}
    (root / FOLDER / "test_batch").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(CifarError, match=r"refused the global (__builtin__|builtins)\.exec") as raised:
        load_split(root, "validation")
    assert "test_batch" in str(raised.value)
    assert not marker.exists()
    result = run_script("host_benchmark.py", "--data", "cifar10", "--imagenet-data-path", root, "--split",
                        "validation", "--batches", 1, "--dataloader-worker", 0)
    assert result.returncode == 1 and ".exec (only CIFAR-10" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not marker.exists()


@pytest.mark.parametrize("value, message", [
    ({b"data": np.zeros((2, 3072), dtype=np.float32), b"labels": [0, 1]}, "dtype"),
    ({b"data": np.zeros((2, 100), dtype=np.uint8), b"labels": [0, 1]}, "N x 3072"),
    ({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0, 10]}, "class number"),
    ({b"data": np.zeros((2, 3072), dtype=np.uint8), b"labels": [0]}, "one per image"),
    ([1, 2], "expected a dict"),
])
def test_other_structures_are_named_errors(cifar, value, message):
    root, _ = cifar
    (root / FOLDER / "test_batch").write_bytes(pickle.dumps(value, protocol=2))
    with pytest.raises(CifarError, match=message):
        load_split(root, "validation")


def test_a_pickle_global_other_than_numpys_array_is_refused():
    with pytest.raises(CifarError, match="refused the global os.system"):
        restricted_load(b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00trueq\x01\x85q\x02Rq\x03.", "crafted")


def test_nothing_is_downloaded_and_the_error_says_where_the_files_go(tmp_path, cifar):
    root, _ = cifar
    nowhere, empty, result = run_scripts(
        ("host_benchmark.py", "--data", "cifar10"),
        ("host_benchmark.py", "--data", "cifar10", "--imagenet-data-path", tmp_path / "empty"),
        ("host_benchmark.py", "--data", "cifar10", "--imagenet-data-path", root, "--batches", 2, "--batch-size", 4,
         "--warmup-batches", 1, "--dataloader-worker", 0, "--image-size", 32))
    assert nowhere.returncode == 2 and "cifar-10-python.tar.gz" in nowhere.stderr
    assert "--imagenet-data-path" in nowhere.stderr
    assert empty.returncode == 2 and "no CIFAR-10 python batches here" in empty.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput of the iteration:" in result.stdout and "(cifar10)" in result.stdout
