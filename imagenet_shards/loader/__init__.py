"""The loader training code imports: `from imagenet_shards.loader import get_data`.

Everything a training script needs from the loader is here, imported lazily so that the light modules
of this package (share_plan, shard_reader) load without torch; `dir()` and tab completion list it all.
What a script needs beside the loader (the launcher, exit codes, CPU accounting, torchvision with the
CPU fix) is in `imagenet_shards.training`.
"""

import importlib as _importlib

# {exported name: module under imagenet_shards.loader (or the package) that defines it}
_EXPORTS = {
    "get_data": "loader.image_loader",
    "Mix": "loader.mix",
    "GlobalOrder": "loader.plan.global_order",
    **{name: "loader.options" for name in ("Cache", "DataSource", "Normalization", "Order", "TrainCrop",
                                            "UserTransform", "ValidationCrop")},
    "SourceError": "loader.sources",
    "SampleError": "loader.read.read_loop",
    "ResumeError": "loader.plan.resume",
    "is_worker_death": "loader.read.worker_shards",
    "NormalizeOnDevice": "normalization",
    "mixup_cutmix": "loader.transform.user_transforms",
    "strong_augmentation": "loader.transform.user_transforms",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_importlib.import_module(f"{__name__.rsplit('.', 1)[0]}.{module}"), name)


def __dir__():
    return sorted(set(_EXPORTS) | {name for name in globals() if not name.startswith("_")})
