"""The path of a sample: which of the library's files a sample's way crosses, from `get_data` to the
first byte of its payload read, measured with a profile hook rather than read off the code.

    python tools/sample_path.py DATASET [--workers 2] [--split train]

The path is the library frames (stdlib and torch frames left out) on three stacks, where `source`
becomes something new:
  1. the Source: where the kind that claims `source` returns it from its `resolve` hook;
  2. the share: where this instance's share of the epoch's order is dealt (`share_plan.plan_instance`);
  3. the bytes: in a DataLoader worker, at the first call that hands out a payload's bytes
     (`lend_payload`, a view of the mapped shard; `read_member`, a pread), from the worker's loop on.
It prints each stack, then the files of the three, in order of first appearance, and their count.
docs/loader-stages.md, "The path of a sample", lists what it printed.
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
    """"file:function" of each library frame from the outermost to `frame`; in a DataLoader worker, from its
    worker loop on (the frames above it were the main process's when it forked)."""
    out = []
    while frame is not None and frame.f_code.co_name != "_worker_loop":
        if frame.f_code.co_filename.startswith(LIBRARY):
            out.append(f"{frame.f_code.co_filename[len(LIBRARY):]}:{frame.f_code.co_name}")
        frame = frame.f_back
    return out[::-1]


class Walk:
    """The profile hook: the stacks where the Source is returned and the share dealt (here), and where a
    worker first hands out a payload's bytes (its stack written to stderr: it runs in another process)."""

    def __init__(self, resolve_hooks, deal):
        self.parent, self.resolve_hooks, self.deal = os.getpid(), resolve_hooks, deal
        self.claimed = self.dealt = self.worker_stack = None

    def __call__(self, frame, event, arg):
        code = frame.f_code
        if not code.co_filename.startswith(LIBRARY):
            return
        if os.getpid() == self.parent:
            if event == "return" and arg is not None and code in self.resolve_hooks and self.claimed is None:
                self.claimed = library_stack(frame)
            elif event == "call" and code is self.deal and self.dealt is None:
                self.dealt = library_stack(frame)
        elif event == "call" and self.worker_stack is None and code.co_name in PAYLOAD_READS:
            self.worker_stack = library_stack(frame)
            text = "\n    ".join([f"3. the bytes, in a worker (pid {os.getpid()}):", *self.worker_stack])
            files = ", ".join(files_of(self.claimed or [], self.dealt or [], self.worker_stack))
            text += f"\nthe path of a sample: {len(files.split(', '))} files: {files}"
            os.write(2, (text + "\n").encode())  # one write (under PIPE_BUF): the two workers' lines do not interleave


def files_of(*stacks) -> list:
    """The files of `stacks`' frames, in order of first appearance."""
    return list(dict.fromkeys(entry.split(":")[0] for stack in stacks for entry in stack))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--split", default="train")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from imagenet_shards.loader import get_data
    from imagenet_shards.loader.plan import share_plan
    from imagenet_shards.loader.source_kinds import SOURCE_KINDS

    hooks = {hook.__code__ for kind in SOURCE_KINDS.values() for hook in (kind.resolve, kind.resolve_loose) if hook}
    walk = Walk(hooks, share_plan.plan_instance.__code__)
    sys.setprofile(walk)
    try:
        batches = iter(get_data(args.dataset, args.split, batch_size=4, workers=args.workers))
        sys.setprofile(None)
        for title, stack in (("1. the Source", walk.claimed), ("2. the share", walk.dealt)):
            print("\n    ".join([f"{title}:", *(stack or ["(not reached)"])]), file=sys.stderr)
        sys.setprofile(walk)  # forked workers inherit it
        next(batches)
    finally:
        sys.setprofile(None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
