"""See what a dataset holds: statistics, a contact sheet (--png), one sample's exact bytes (--key).

    python inspect_dataset.py PATH [--json]
    python inspect_dataset.py PATH --png sheet.png [--count 32] [--seed 0] [--as-trained]
    python inspect_dataset.py PATH --key KEY [--out FILE]

See datasets/inspect/cli.py for the options and exit codes (0 shown, 1 data problem, 2 usage error).
"""

import sys

from datasets.inspect.cli import main

if __name__ == "__main__":
    sys.exit(main())
