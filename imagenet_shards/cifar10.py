"""CIFAR-10's python batches, read without trusting pickle: the reference harness's `--data cifar10`.

The files are those of `cifar-10-python.tar.gz` (https://www.cs.toronto.edu/~kriz/cifar.html), extracted:

    <path>/cifar-10-batches-py/   (or <path> itself)
        data_batch_1 ... data_batch_5   train: 5 x 10,000 images
        test_batch                      validation: 10,000 images
        batches.meta                    {b"label_names": [b"airplane", ...], ...}

Each batch is a pickle of {b"batch_label": bytes, b"labels": [int], b"data": uint8 array (N, 3072: the
red, green and blue 32x32 planes), b"filenames": [bytes]}. Nothing is ever downloaded (these hosts
have no network): a missing file is a `CifarError` saying where to put it.

A pickle can run any code while it loads. `RestrictedUnpickler` accepts only that structure: dicts,
lists, bytes/str, ints, and the one uint8 array, whose three numpy globals (`_reconstruct`, `ndarray`,
`dtype`) are replaced by stand-ins that take a shape and raw bytes and nothing else (numpy itself is
never called on the pickle's arguments); so is `_codecs.encode`, latin-1 text to bytes only, which
protocol 2 pickles written by Python 3 use for bytes. Any other global, a persistent id, or an array of another
dtype is refused with the file named, before anything it names is imported or called. The loaded
structure is then checked (keys, types, label range, sizes).
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np

from imagenet_shards.errors import DatasetError

FOLDER = "cifar-10-batches-py"
SPLIT_FILES = {"train": tuple(f"data_batch_{n}" for n in range(1, 6)), "validation": ("test_batch",)}
META_FILE = "batches.meta"
SIDE = 32
CLASSES = 10
WHERE = (f"download cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) on a machine with a "
         f"network, extract it so that PATH/{FOLDER}/ holds data_batch_1 ... data_batch_5, test_batch and "
         f"batches.meta, and pass --imagenet-data-path PATH")


class CifarError(DatasetError):
    """CIFAR-10 batches that are missing, refused or malformed: names the file and the problem."""


class _DType:
    """Stands in for numpy.dtype: only "u1" (uint8)."""

    def __init__(self, name=None, align=False, copy=False):
        name = name.decode() if isinstance(name, bytes) else name
        if name != "u1":
            raise pickle.UnpicklingError(f"an array of dtype {name!r}, expected uint8 ('u1')")

    def __setstate__(self, state):
        if not isinstance(state, tuple) or not all(isinstance(v, (int, str, bytes, type(None))) for v in state):
            raise pickle.UnpicklingError("a dtype state that is not uint8's")


class _Array:
    """Stands in for a pickled numpy.ndarray: keeps (shape, raw bytes) of a C-ordered uint8 array."""

    def __init__(self):
        self.shape, self.raw = None, None

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) != 5:
            raise pickle.UnpicklingError("an array state of an unexpected form")
        _, shape, dtype, fortran, raw = state
        if not isinstance(dtype, _DType) or fortran or not isinstance(raw, (bytes, bytearray)):
            raise pickle.UnpicklingError("only a C-ordered uint8 array with raw bytes is accepted")
        if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise pickle.UnpicklingError(f"an array shape {shape!r} that is not a tuple of sizes")
        if int(np.prod(shape, dtype=np.int64)) != len(raw):
            raise pickle.UnpicklingError(f"an array of shape {shape} with {len(raw):,} bytes")
        self.shape, self.raw = shape, bytes(raw)


_NDARRAY = object()  # the `ndarray` argument of _reconstruct


def _reconstruct(cls, shape, dtype_code):
    if cls is not _NDARRAY:
        raise pickle.UnpicklingError("_reconstruct of something other than ndarray")
    return _Array()


def _latin1(text, encoding):
    """Stands in for _codecs.encode: how Python 3's protocol 2 writes bytes (text + "latin1")."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode of something other than latin-1 text")
    return text.encode("latin-1")


_ALLOWED = {
    ("_codecs", "encode"): _latin1,  # bytes in a protocol-2 pickle written by Python 3
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,  # numpy < 2 and the original files
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,  # numpy >= 2
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _DType,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles only the structure of CIFAR-10's batches (see the module docstring)."""

    def find_class(self, module, name):
        allowed = _ALLOWED.get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(f"refused the global {module}.{name} (only CIFAR-10's dict/list/bytes/int "
                                         f"structure and one uint8 array are accepted)")
        return allowed

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent id")


def restricted_load(data: bytes, source) -> dict:
    """The dict a CIFAR-10 pickle holds, arrays as `_Array`; CifarError naming `source` when refused."""
    try:
        value = RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
    except pickle.UnpicklingError as error:
        raise CifarError(f"{source}: not loaded: {error}") from None
    except Exception as error:  # truncated or not a pickle: EOFError, ValueError, ...
        raise CifarError(f"{source}: not a CIFAR-10 batch ({type(error).__name__}: {error})") from None
    if not isinstance(value, dict):
        raise CifarError(f"{source}: holds a {type(value).__name__}, expected a dict")
    return {(key.decode() if isinstance(key, bytes) else key): item for key, item in value.items()}


def batches_folder(path) -> Path:
    """The folder holding the batches: PATH/cifar-10-batches-py or PATH itself; CifarError saying where
    to put them when neither has them."""
    path = Path(path)
    for folder in (path / FOLDER, path):
        if (folder / SPLIT_FILES["validation"][0]).is_file() or (folder / SPLIT_FILES["train"][0]).is_file():
            return folder
    raise CifarError(f"{path}: no CIFAR-10 python batches here (nothing is downloaded): {WHERE}")


def is_cifar_folder(path) -> bool:
    try:
        batches_folder(path)
    except CifarError:
        return False
    return True


def load_split(path, split: str):
    """(images uint8 [N, 32, 32, 3] HWC, labels int64 [N], class names) of `split` ("train": the five
    data batches; otherwise the test batch)."""
    folder = batches_folder(path)
    names = SPLIT_FILES["train" if split == "train" else "validation"]
    images, labels = [], []
    for name in names:
        batch_path = folder / name
        if not batch_path.is_file():
            raise CifarError(f"{batch_path}: missing ({split} needs {', '.join(names)}): {WHERE}")
        data, batch_labels = _check_batch(restricted_load(batch_path.read_bytes(), batch_path), batch_path)
        images.append(data)
        labels.append(batch_labels)
    return np.concatenate(images), np.concatenate(labels), class_names(folder)


def _check_batch(batch: dict, source):
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, _Array) or len(data.shape) != 2 or data.shape[1] != 3 * SIDE * SIDE:
        raise CifarError(f"{source}: 'data' is not a uint8 array of N x {3 * SIDE * SIDE} pixels")
    if not isinstance(labels, list) or len(labels) != data.shape[0]:
        raise CifarError(f"{source}: 'labels' is not a list of {data.shape[0]:,} labels (one per image)")
    if not all(type(label) is int and 0 <= label < CLASSES for label in labels):
        raise CifarError(f"{source}: a label is not a class number 0..{CLASSES - 1}")
    planes = np.frombuffer(data.raw, dtype=np.uint8).reshape(data.shape[0], 3, SIDE, SIDE)
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), np.asarray(labels, dtype=np.int64)


def class_names(folder: Path) -> list:
    """batches.meta's label_names, or "0".."9" when the file is absent."""
    path = folder / META_FILE
    if not path.is_file():
        return [str(n) for n in range(CLASSES)]
    names = restricted_load(path.read_bytes(), path).get("label_names")
    if not isinstance(names, list) or len(names) != CLASSES or not all(isinstance(n, (bytes, str)) for n in names):
        raise CifarError(f"{path}: 'label_names' is not a list of {CLASSES} names")
    return [n.decode() if isinstance(n, bytes) else n for n in names]
