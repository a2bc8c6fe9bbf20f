"""`python -m datasets.sample`: see datasets.sample.cli."""

import sys

from datasets.sample.cli import main

if __name__ == "__main__":
    sys.exit(main())
