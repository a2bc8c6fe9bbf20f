"""`python -m imagenet_shards.sample`: see imagenet_shards.sample.cli."""

import sys

from imagenet_shards.sample.cli import main

if __name__ == "__main__":
    sys.exit(main())
