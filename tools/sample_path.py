"""The path of a sample: which of the library's files a sample's way crosses, from `get_data` to the
first byte of its payload read, measured with a profile hook rather than read off the code.

    python tools/sample_path.py DATASET [--workers 2] [--split train]

Prints two call chains of library frames (stdlib and torch frames left out): in this process, the stack
at each first entry into a library file from `get_data` until the first batch is asked for (what
`source` becomes: a resolved Source, then a plan); in a DataLoader worker, the stack at the first call
that hands out a payload's bytes (`lend_payload`, the mapped shard's view of a local payload, or
`read_member`, a pread). docs/loader-stages.md, "The path of a sample", lists what it printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = str(REPO / "imagenet_shards") + os.sep
PAYLOAD_READS = ("lend_payload", "read_member")  # the functions that hand out a payload's bytes


def library_stack(frame) -> list:
    """"file:function" of each library frame from the outermost to `frame`."""
    out = []
    while frame is not None:
        if frame.f_code.co_filename.startswith(LIBRARY):
            out.append(f"{frame.f_code.co_filename[len(LIBRARY):]}:{frame.f_code.co_name}")
        frame = frame.f_back
    return out[::-1]


class Walk:
    """The profile hook: first entries into library files here, the first payload read in a worker."""

    def __init__(self):
        self.parent, self.entered, self.worker_stack = os.getpid(), {}, None

    def __call__(self, frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(LIBRARY):
            return
        if os.getpid() == self.parent:
            self.entered.setdefault(frame.f_code.co_filename[len(LIBRARY):], library_stack(frame))
        elif self.worker_stack is None and frame.f_code.co_name in PAYLOAD_READS:
            self.worker_stack = library_stack(frame)
            text = "\n    ".join([f"in a worker (pid {os.getpid()}), the first payload read:", *self.worker_stack])
            os.write(2, (text + "\n").encode())  # one write (under PIPE_BUF): the two workers' lines do not interleave


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--split", default="train")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from imagenet_shards.loader import get_data

    walk = Walk()
    sys.setprofile(walk)
    try:
        batches = iter(get_data(args.dataset, args.split, batch_size=4, workers=args.workers))
        sys.setprofile(None)
        print("here, from get_data to the first batch asked for (each library file's first entry):", file=sys.stderr)
        for name, stack in walk.entered.items():
            print(f"    {name}  <- {' > '.join(stack[-4:-1])}", file=sys.stderr)
        sys.setprofile(walk)  # forked workers inherit it
        next(batches)
    finally:
        sys.setprofile(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
