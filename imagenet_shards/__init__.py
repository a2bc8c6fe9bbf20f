"""ImageNet shards for distributed training: convert, balance, validate and load (README.md).

Import it as `imagenet_shards`, installed (`pip install .`) or from this checkout on sys.path:
`from imagenet_shards.loader import get_data` is the training script's entry (README, "From your training
code"). Before 0.2.0 this package was `datasets`, the import name of Hugging Face's `datasets`; the checkout
keeps a `datasets/` alias for one release, with a DeprecationWarning (docs/commands.md, "The import name").
"""
