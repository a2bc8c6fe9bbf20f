"""Tar tools over shards, as WebDataset's tarshow / tar2tsv / tarcat / tarsplit, aware of this harness's indexes.

    python tar_tools.py show  SHARD|- [--start N] [--count M]
    python tar_tools.py tsv   SHARD... [--fields __key__,cls,jpg.size,json.source]
    python tar_tools.py cat | split | sort | shuffle  INPUT... --out DIR|- [--split S] [--seed S]
                            [--samples-per-shard N] [--max-shard-bytes B]
    python tar_tools.py reindex DATASET_DIR

What each command reads and writes: imagenet_shards/tools/tar_shards.py. Exit codes: 0 done, 1 data problem
(one line naming the file and the problem), 2 usage error.
"""

import argparse
import sys

from imagenet_shards.cli.args import add_s3_arguments, apply_s3_arguments, non_negative_int, positive_int
from imagenet_shards.tools.tar_shards import DEFAULT_FIELDS, STDIO, run


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Exit codes: 0 done, 1 data problem, 2 usage error.")
    commands = parser.add_subparsers(dest="command", required=True)
    show_parser = commands.add_parser("show", help="members and sizes of a shard's samples")
    show_parser.add_argument("shard", help="a shard (path, URL) or - for a tar on stdin")
    show_parser.add_argument("--start", type=non_negative_int, default=0, help="first sample shown (0-based)")
    show_parser.add_argument("--count", type=positive_int, default=None, help="samples shown (default: all)")
    tsv_parser = commands.add_parser("tsv", help="tabulate fields of every sample (tar2tsv)")
    tsv_parser.add_argument("shards", nargs="+", help="shards (paths, URLs, brace patterns) or -")
    tsv_parser.add_argument("--fields", default=DEFAULT_FIELDS,
                            help=f"comma-separated: __key__, __offset__, EXT, EXT.size, payload.size, json.FIELD "
                                 f"(default {DEFAULT_FIELDS})")
    for name, text in (("cat", "concatenate samples into new shards with a new index"),
                       ("split", "re-shard to N samples or B bytes per shard"),
                       ("sort", "rewrite the samples in key order"),
                       ("shuffle", "rewrite the samples in a seeded random order")):
        writer = commands.add_parser(name, help=text)
        writer.add_argument("inputs", nargs="+", metavar="INPUT", help="shards, URLs, brace patterns, a converted "
                            "dataset folder (its --split shards) or - (a tar on stdin)")
        writer.add_argument("--out", required=True, help="output dataset folder, or - for one tar on stdout")
        writer.add_argument("--split", default=None, help="the split read from dataset folders and written "
                            "(default: the indexed inputs' split, else train)")
        writer.add_argument("--samples-per-shard", type=positive_int, default=None, metavar="N")
        writer.add_argument("--max-shard-bytes", type=positive_int, default=None, metavar="B")
        writer.add_argument("--seed", type=int, default=None, help="shuffle: the permutation's seed (required)")
    reindex_parser = commands.add_parser("reindex", help="re-create a sample index of the earlier version "
                                         "(payload sha256) with CRC32Cs, in place")
    reindex_parser.add_argument("dataset", help="a converted dataset folder")
    add_s3_arguments(parser)
    args = parser.parse_args(argv)
    if args.command == "split" and not (args.samples_per_shard or args.max_shard_bytes):
        parser.error("split needs --samples-per-shard or --max-shard-bytes")
    if args.command == "shuffle" and args.seed is None:
        parser.error("shuffle needs --seed (the same seed gives the same order)")
    if getattr(args, "out", None) == STDIO and (args.samples_per_shard or args.max_shard_bytes):
        parser.error("--out - writes one tar: no --samples-per-shard / --max-shard-bytes")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_s3_arguments(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
