#!/usr/bin/env python3
"""Repartition a converted dataset so that every one of N instances reads an equal share.

A thin wrapper: the command is imagenet_shards/cli/distributed_webdataset.py, installed by `pip install .` as `distributed-webdataset`.
Its --help and docstring describe the options and exit codes.
"""

import sys

from imagenet_shards.cli.distributed_webdataset import main

if __name__ == "__main__":
    sys.exit(main())
