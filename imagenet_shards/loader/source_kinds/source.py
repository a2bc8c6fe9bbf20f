"""What resolving a `source` argument yields (resolve_source, in __init__.py, dispatches; each kind's `resolve`
hook makes one): a `Source` holds what every kind has (kind, description, groups, payload, classes, stored steps,
layout) and `settings`, the kind's own settings object (ShardSettings, SyntheticSettings, Cifar10Arrays,
MixParts), so a new kind adds its settings to its own module, not a field here (tools/layout.py checks it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from imagenet_shards.errors import DatasetError
from imagenet_shards.index import SampleColumns
from imagenet_shards.storage import join_location


class SourceError(DatasetError):
    """A source that cannot be used: names it and says why."""


@dataclass(frozen=True)
class ResolveRequest:
    """What resolve_source was asked besides the source: what a kind's `resolve` hook reads."""

    split: str
    instance_count: int = 1
    image_size: int = 224  # synthetic: the images' side
    synthetic_length: Optional[int] = None  # synthetic: images per split (None: ImageNet's count)
    seed: int = 0
    use_repartition: bool = True  # shards: read this instance's part of a repartition made for instance_count
    label_offset: Optional[int] = None  # shards without metadata: stored label - offset (None: detected)
    resolve: Optional[Callable] = None  # resolve(source, request) -> Source: a nested source (a Mix's parts)


@dataclass
class FolderItem:
    key: str  # path relative to the split folder, without extension
    path: str
    label: int


@dataclass
class OwnShare:
    """This instance's samples fixed by a repartition manifest."""

    manifest: str
    policy: str
    columns: SampleColumns  # in shard order
    counts: list  # samples per instance
    padded_keys: list
    dropped_keys: list  # split-level: samples no instance reads


@dataclass
class ShardSettings:
    """The shard kind's settings (converted datasets, shard lists, TFRecords without metadata)."""

    columns: SampleColumns  # the sample index, in shard order (each shard a row range); items are rows
    base: Optional[str] = None  # where shard names are relative to
    locations: dict = field(default_factory=dict)  # shard name -> path/URL (scanned shard lists)
    metadata: Optional[dict] = None
    repartition: Optional[dict] = None  # see shards._repartition; load_own_share() reads this instance's part
    label_offset: int = 0  # TFRecord: stored label - label_offset = class index (metadata or detected)
    shard_format: Optional[object] = None  # imagenet_shards.formats.ShardFormat of the shards (None: known by name)
    cache: Optional[object] = None  # the imagenet_shards.shard_cache.ShardCache they are read through (get_data cache=)

    @property
    def total(self) -> int:
        return len(self.columns)


def _shard_setting(name: str, default=None):
    """A Source attribute that reads (and sets) its ShardSettings' field: the shard kind's readers, the loader,
    the ledger and the tools read `source.columns`, `source.cache`... as before; other kinds read `default`."""
    def read(source):
        return getattr(source.settings, name, default) if isinstance(source.settings, ShardSettings) else default

    def write(source, value):
        if isinstance(source.settings, ShardSettings):
            setattr(source.settings, name, value)
        elif value != default:  # other kinds read the default: setting it again is no change (the loader's cache=None)
            raise AttributeError(f"{name}: a setting of the shard kind, not of {source.kind}")

    return property(read, write, doc=f"The shard kind's {name} (ShardSettings.{name}); {default!r} for other kinds.")


@dataclass
class Source:
    kind: str  # a key of imagenet_shards.loader.source_kinds.SOURCE_KINDS: how its items are read
    description: str
    groups: list  # folder, synthetic, cifar10: lists of items (FolderItems or ints), dataset order; shards: []
    payload: str  # "jpg" | "npy" | "array" | "file"
    classes: Optional[list] = None
    stored_steps: list = field(default_factory=list)
    tensor_layout: str = "HWC"
    settings: Optional[object] = None  # the kind's own settings object (its module says which), or None

    columns = _shard_setting("columns")
    base = _shard_setting("base")
    locations = _shard_setting("locations", {})
    metadata = _shard_setting("metadata")
    repartition = _shard_setting("repartition")
    label_offset = _shard_setting("label_offset", 0)
    shard_format = _shard_setting("shard_format")
    cache = _shard_setting("cache")

    @property
    def total(self) -> int:
        """The samples of an epoch: the settings' total where the kind keeps one, else the groups' items."""
        total = getattr(self.settings, "total", None)
        return total if total is not None else sum(len(g) for g in self.groups)

    def locate(self, shard: str) -> str:
        if shard in self.locations:
            return self.locations[shard]
        return join_location(self.base, shard)
