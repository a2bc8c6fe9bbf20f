"""The loader training code imports: `from datasets.loader import get_data`.

`get_data` lives in `datasets.loader.image_loader`; it is resolved lazily here so that the
light modules of this package (share_plan, shard_reader) can be imported without torch.
"""

__all__ = ["get_data"]


def __getattr__(name):
    if name == "get_data":
        from datasets.loader.image_loader import get_data

        return get_data
    raise AttributeError(f"module 'datasets.loader' has no attribute {name!r}")
