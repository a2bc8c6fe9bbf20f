"""Check that a dataset is intact and name every corrupt, missing or extra file and sample.

A thin wrapper: the command is imagenet_shards/cli/validate_dataset.py, installed by `pip install .` as `validate-dataset`.
Its --help and docstring describe the options and exit codes.
"""

import sys

from imagenet_shards.cli.validate_dataset import main

if __name__ == "__main__":
    sys.exit(main())
