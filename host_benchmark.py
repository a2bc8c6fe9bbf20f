#!/usr/bin/env python3
"""How fast can this host feed images to accelerators? Measure one source, or compare every format.

A thin wrapper: the command is imagenet_shards/cli/host_benchmark.py, installed by `pip install .` as `host-benchmark`.
Its --help and docstring describe the options and exit codes.
"""

import sys

from imagenet_shards.cli.host_benchmark import main, parse_args  # noqa: F401 (tests call them)

if __name__ == "__main__":
    sys.exit(main())
