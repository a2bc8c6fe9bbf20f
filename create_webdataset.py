"""Convert ImageNet (extracted folders or the downloaded archives) into WebDataset shards.

A thin wrapper: the command is imagenet_shards/cli/create_webdataset.py, installed by `pip install .` as `create-webdataset`.
Its --help and docstring describe the options and exit codes.
"""

import sys

from imagenet_shards.cli.create_webdataset import build_parser, main  # noqa: F401 (tests and benchmarks call them)

if __name__ == "__main__":
    sys.exit(main())
