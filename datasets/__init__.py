"""The ImageNet-shards library (this folder's `datasets` package; not Hugging Face's `datasets`).

Both packages are called `datasets`, and Python imports whichever it finds first. Training code
that wants this one checks with `require_this_package()` in examples/train_imagenet.py's first
lines (README, "Use it from a training script"). Code that wanted Hugging Face's package and got
this one fails on its first attribute with a one-line message saying so (`__getattr__` below),
not somewhere deep.
"""

import os as _os

IMAGENET_SHARDS = True  # the mark a training script checks: this is not another `datasets`
_HERE = _os.path.dirname(_os.path.abspath(__file__))


def __getattr__(name):
    """Attributes this package lacks: name the likely mix-up (Hugging Face's API asked of this one)."""
    if name.startswith("__") or _os.path.exists(_os.path.join(_HERE, name)) or \
            _os.path.exists(_os.path.join(_HERE, name + ".py")):
        raise AttributeError(f"module 'datasets' has no attribute {name!r}")
    raise AttributeError(
        f"module 'datasets' has no attribute {name!r}: this `datasets` is the ImageNet-shards library "
        f"({_HERE}), not Hugging Face's `datasets`; run that code where this folder is not on sys.path")
