"""Upload a converted dataset (repartitions included) to an S3-compatible object store, verified.

A thin wrapper: the command is imagenet_shards/cli/upload_dataset.py, installed by `pip install .` as `upload-dataset`.
Its --help and docstring describe the options and exit codes.
"""

import sys

from imagenet_shards.cli.upload_dataset import main

if __name__ == "__main__":
    sys.exit(main())
