"""ImageNet shards for distributed training: convert, balance, validate and load (README.md).

Import it as `imagenet_shards`, installed (`pip install .`) or from this checkout on sys.path:
`from imagenet_shards.loader import get_data` is the training script's entry (README, "From your training
code"). Until 0.1 this package was `datasets`, the import name of Hugging Face's `datasets`; the checkout
keeps a `datasets/` alias for one release, with a DeprecationWarning (docs/commands.md, "The import name").
"""

from pkgutil import extend_path

# `make` installs the native region decoder as imagenet_shards/_jpeg_crop into .venv's site-packages (so a
# build never lands in the checkout): the package's path takes in every `imagenet_shards` folder on sys.path.
__path__ = extend_path(__path__, __name__)
