"""See what a dataset holds: statistics, a contact sheet (--png), one sample's exact bytes (--key).

    python inspect_dataset.py PATH [--split S] [--sample N] [--seed S] [--json]
    python inspect_dataset.py PATH --png FILE [--count N] [--as-trained] [--synsets FILE]
    python inspect_dataset.py PATH --key KEY [--out FILE | --out -]

PATH: a converted dataset (local, http(s)://, s3://), a dataset of the reference harness, TF-slim
TFRecords, a folder or list of tar shards, an extracted ImageNet folder. Only the index and the
samples shown (or sampled for the statistics) are read (imagenet_shards/inspect/).
Exit codes: 0 shown; 1 a data problem (one line naming the file and the problem; the statistics
still print when only some sampled samples are unreadable); 2 usage error (bad option, no such path).
"""

import argparse
import sys

from imagenet_shards.cli.args import add_s3_arguments, apply_s3_arguments, non_negative_int, positive_int
from imagenet_shards.inspect.cli import run
from imagenet_shards.dataset_folder import SPLITS


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Exit codes: 0 shown, 1 data problem, 2 usage error.")
    parser.add_argument("path", metavar="PATH", help="dataset folder, shard file, http(s):// or s3:// URL")
    parser.add_argument("--split", choices=SPLITS, help="only this split (default: every split there is; "
                        "the contact sheet shows train when there is one)")
    parser.add_argument("--sample", type=non_negative_int, default=200, metavar="N",
                        help="samples read per split (seeded) for the resolution and quirk figures (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="draws the sampled and the shown samples (default 0)")
    parser.add_argument("--png", metavar="FILE", help="write a contact sheet (tiles + histograms) to FILE")
    parser.add_argument("--count", type=positive_int, default=32, metavar="N", help="tiles on the sheet (default 32)")
    parser.add_argument("--as-trained", action="store_true",
                        help="tiles show what the split's loader pipeline makes (train: the random crops), "
                             "not the stored images")
    parser.add_argument("--synsets", metavar="FILE", help='"<wnid> <words>" lines (default: synsets.txt, '
                        "LOC_synset_mapping.txt or synset_words.txt in or beside PATH)")
    parser.add_argument("--key", metavar="KEY", help="show one sample's metadata; with --out, write its stored bytes")
    parser.add_argument("--out", metavar="FILE", help="with --key: write the stored payload bytes here ('-': stdout)")
    parser.add_argument("--label-offset", type=int, choices=(0, 1), default=None,
                        help="TFRecords without metadata: stored label - offset = class index (TF-slim: 1); "
                             "default: detected, as the loader does")
    parser.add_argument("--json", action="store_true", help="print everything as JSON instead of text")
    add_s3_arguments(parser)
    args = parser.parse_args(argv)
    if args.out and not args.key:
        parser.error("--out needs --key")
    if args.key and (args.png or args.as_trained):
        parser.error("--key shows one sample; --png/--as-trained make a contact sheet: one or the other")
    if args.as_trained and not args.png:
        parser.error("--as-trained needs --png")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_s3_arguments(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
