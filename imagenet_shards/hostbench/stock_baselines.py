"""How the usual library reads each format, for `host_benchmark.py --compare`: the stock baselines,
keyed by format name (imagenet_shards.formats' names). The formats themselves know nothing of them.

    img        webdataset: WebDataset(urls).decode("pil").to_tuple("jpg", "cls")
    tensor     webdataset: .decode() (np.load of the .npy), a uint8 HWC array
    tfrecord   the tfrecord package's torch TFRecordDataset (with each shard's .tfindex) + PIL decode
    lmdb       a map-style Dataset over the environments' keys, txn.get + PIL decode per item

Each `build(shards, transform, instance, metadata)` returns a Dataset (or iterable of (image, label))
that imagenet_shards.hostbench.pipelines wraps in a DataLoader with the standard transforms.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Callable, Optional

from imagenet_shards.formats.lmdb_format import decode_value, open_environment
from imagenet_shards.formats.tfrecord import tfrecord_index_path
from imagenet_shards.formats.tfslim_imagenet import FEATURE_ENCODED, FEATURE_LABEL


@dataclass(frozen=True)
class StockBaseline:
    """How the usual library reads one format.

    `build(shards, transform, instance, metadata)` returns a torch Dataset (or any iterable of
    (image, label)) over the shard paths, applying `transform` (a torchvision transform from a PIL
    image, or from a uint8 HWC array for `tensor_input`).
    """

    key: str
    label: str
    description: str
    build: Callable
    tensor_input: bool = False


def _webdataset(shard_paths, instance):
    import webdataset as wds

    # empty_check=False: stock webdataset refuses fewer shards than workers otherwise; the
    # node splitter only matters under a launcher (the stock default refuses several nodes).
    return wds.WebDataset(
        [str(p) for p in shard_paths], shardshuffle=False, empty_check=False,
        nodesplitter=wds.split_by_node if instance.count > 1 else wds.single_node_only,
    )


def webdataset_pil_dataset(shard_paths, transform, instance, metadata=None):
    """Stock webdataset: decode("pil") + a PIL transform, (image, label) tuples."""
    return _webdataset(shard_paths, instance).decode("pil").to_tuple("jpg", "cls").map_tuple(transform, int)


def webdataset_npy_dataset(shard_paths, transform, instance, metadata=None):
    """Stock webdataset: decode() (np.load for .npy), then `transform` on the uint8 HWC array if any."""
    dataset = _webdataset(shard_paths, instance).decode().to_tuple("npy", "cls")
    return dataset.map_tuple(transform, int) if transform is not None else dataset


class TFRecordExampleTransform:
    """The stock pipeline's per-record step: PIL decode + `transform`; label - offset."""

    def __init__(self, transform, label_offset: int):
        self.transform = transform
        self.label_offset = label_offset

    def __call__(self, features):
        from PIL import Image

        image = Image.open(io.BytesIO(features[FEATURE_ENCODED])).convert("RGB")
        return self.transform(image), int(features[FEATURE_LABEL][0]) - self.label_offset


def tfrecord_torch_dataset(shard_paths, transform, instance, metadata=None):
    """The tfrecord package's torch TFRecordDataset (one per shard, with its .tfindex, chained) + PIL decode.

    With an index and DataLoader workers, the package gives each worker its slice of every shard;
    with no workers it starts each shard at a random record (and wraps around). It has no node
    splitting: instances take every Nth shard. Its reader checks no CRC (the project's does).
    """
    from tfrecord.torch.dataset import TFRecordDataset
    from torch.utils.data import ChainDataset

    paths = list(shard_paths)[instance.index :: instance.count]
    if not paths:
        raise ValueError("no shards for the stock tfrecord baseline")
    example = TFRecordExampleTransform(transform, int((metadata or {}).get("label_offset", 0)))
    description = {FEATURE_ENCODED: "byte", FEATURE_LABEL: "int"}
    return ChainDataset([TFRecordDataset(str(p), str(tfrecord_index_path(p)), description, transform=example)
                         for p in paths])


class LMDBMapDataset:
    """The usual way to read LMDB in PyTorch: a map-style Dataset over every shard's keys (listed
    with a cursor once), each item a `get` + decode + transform; environments opened lazily per
    worker process (an LMDB handle must not cross a fork)."""

    def __init__(self, shard_paths, transform):
        self.paths = [str(p) for p in shard_paths]
        self.transform = transform
        self.items = []
        for shard, path in enumerate(self.paths):
            env = open_environment(path)
            with env.begin() as txn:
                self.items.extend((shard, bytes(key)) for key in txn.cursor().iternext(keys=True, values=False))
            env.close()
        self.environments = {}

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        from PIL import Image

        shard, key = self.items[index]
        env = self.environments.get(shard)
        if env is None:
            env = self.environments[shard] = open_environment(self.paths[shard])
        with env.begin(buffers=True) as txn:
            fields = decode_value(txn.get(key))
            payload = bytes(fields["payload"])
        image = Image.open(io.BytesIO(payload)).convert("RGB")
        return self.transform(image), fields["label"]

    def __getstate__(self):
        return {**self.__dict__, "environments": {}}


def lmdb_map_dataset(shard_paths, transform, instance, metadata=None):
    paths = list(shard_paths)[instance.index :: instance.count]
    if not paths:
        raise ValueError("no shards for the stock LMDB baseline")
    return LMDBMapDataset(paths, transform)


_PIL_STEPS = "PIL decode + RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize"

STOCK_BASELINES = {
    "img": StockBaseline("webdataset_pil", 'webdataset decode("pil") (baseline)',
                         'WebDataset(urls).decode("pil").to_tuple("jpg","cls").map_tuple(transform, int)',
                         webdataset_pil_dataset),
    "tensor": StockBaseline("webdataset_npy", "webdataset .npy decode() (baseline)",
                            'WebDataset(urls).decode().to_tuple("npy","cls"), + map_tuple(v2 RandomResizedCrop+flip, '
                            'int) for train; uint8 as stored', webdataset_npy_dataset, tensor_input=True),
    "tfrecord": StockBaseline("tfrecord_torch", "tfrecord TFRecordDataset + PIL (baseline)",
                              f"tfrecord.torch.TFRecordDataset(shard, shard.tfindex) per shard, chained; {_PIL_STEPS}",
                              tfrecord_torch_dataset),
    "lmdb": StockBaseline("lmdb_map", "LMDB map-style Dataset + PIL (baseline)",
                          f"map-style Dataset: keys listed by cursor, txn.get(key) + decode per item; {_PIL_STEPS}",
                          lmdb_map_dataset),
}


def stock_baseline_of(format_name: str) -> Optional[StockBaseline]:
    """The stock baseline of a registered format, or None (a format no stock library reads)."""
    return STOCK_BASELINES.get(format_name)
