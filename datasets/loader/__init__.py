"""The loader training code imports: `from datasets.loader import get_data`.

`get_data` lives in `datasets.loader.image_loader`; it is resolved lazily here so that the
light modules of this package (share_plan, shard_reader) can be imported without torch.

If another package named `datasets` (Hugging Face's) was imported first, an editable install
(`pip install -e .`) would still find this subpackage and attach it to the other one; it refuses
with one line instead of failing somewhere deep.
"""

import sys as _sys

if not getattr(_sys.modules.get("datasets"), "IMAGENET_SHARDS", False):
    _other = getattr(_sys.modules.get("datasets"), "__file__", None)
    raise ImportError(f"`datasets` is another package of that name ({_other}), e.g. Hugging Face's, imported before "
                      f"the ImageNet-shards library ({__file__.rsplit('/loader/', 1)[0]}); put the library first on "
                      f"sys.path (PYTHONPATH) or use an environment without the other one")

__all__ = ["Cache", "DataSource", "GlobalOrder", "Mix", "Normalization", "Order", "TrainCrop", "UserTransform",
           "ValidationCrop", "get_data"]
OPTION_GROUPS = ("Cache", "DataSource", "Normalization", "Order", "TrainCrop", "UserTransform", "ValidationCrop")


def __getattr__(name):
    if name == "get_data":
        from datasets.loader.image_loader import get_data

        return get_data
    if name == "Mix":
        from datasets.loader.mix import Mix

        return Mix
    if name in OPTION_GROUPS:  # get_data's option groups (datasets/loader/options.py)
        from datasets.loader import options

        return getattr(options, name)
    if name == "GlobalOrder":
        from datasets.loader.global_order import GlobalOrder

        return GlobalOrder
    raise AttributeError(f"module 'datasets.loader' has no attribute {name!r}")
