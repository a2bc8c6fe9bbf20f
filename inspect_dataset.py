"""See what a dataset holds: statistics, a contact sheet (--png), one sample's exact bytes (--key).

A thin wrapper: the command is imagenet_shards/cli/inspect_dataset.py, installed by `pip install .` as `inspect-dataset`.
Its --help and docstring describe the options and exit codes.
"""

import sys

from imagenet_shards.cli.inspect_dataset import main

if __name__ == "__main__":
    sys.exit(main())
