"""Where `resolve_source` was: it is now in the source kinds' registry, imagenet_shards/loader/source_kinds/
(`from imagenet_shards.loader.source_kinds import resolve_source`), with the dispatch over the kinds' `resolve`
hooks it holds. This module re-exports the names it had, the same objects, for one release (it goes in the
release after 0.2.0, with loader.MOVED); the library imports them from their new places.
"""

from __future__ import annotations

from imagenet_shards.loader.source_kinds import resolve_source
from imagenet_shards.loader.source_kinds.shards import REBUILD_REPARTITION, load_own_share
from imagenet_shards.loader.source_kinds.source import (FolderItem, OwnShare, ResolveRequest, ShardSettings, Source,
                                                        SourceError)
from imagenet_shards.loader.source_kinds.synthetic import LENGTH as SYNTHETIC_LENGTH
from imagenet_shards.loader.source_kinds.synthetic import NAMES as SYNTHETIC_NAMES

__all__ = ["FolderItem", "OwnShare", "REBUILD_REPARTITION", "ResolveRequest", "SYNTHETIC_LENGTH", "SYNTHETIC_NAMES",
           "ShardSettings", "Source", "SourceError", "load_own_share", "resolve_source"]
