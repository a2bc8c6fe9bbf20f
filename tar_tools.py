"""Tar tools over shards, as WebDataset's tarshow / tar2tsv / tarcat / tarsplit, aware of this harness's indexes.

A thin wrapper: the command is imagenet_shards/cli/tar_tools.py, installed by `pip install .` as `tar-tools`.
Its --help and docstring describe the options and exit codes.
"""

import sys

from imagenet_shards.cli.tar_tools import main

if __name__ == "__main__":
    sys.exit(main())
