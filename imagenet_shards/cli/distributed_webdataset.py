"""Repartition a converted dataset so that every one of N instances reads an equal share.

    python distributed_webdataset.py --target DIR --num-instances N
           [--remainder POLICY | --remainder SPLIT=POLICY ...] [--splits train validation]
           [--dry-run] [--overwrite] [--verify-shards copied|all]

Whole shards are assigned to instances as they are; only the samples needed to balance are copied,
byte for byte, into one remainder shard per instance. The output goes to DIR/distributed/<N>-instances/
(manifest.json, written last, plus per-instance shard lists and sample indexes); the original shards
and metadata.json are only read. See imagenet_shards/repartition/ for the plan and the guarantees.

Exit codes: 0 done (or already up to date), 1 bad data (nothing written), 2 wrong arguments.
"""

import argparse
import os
import sys

from imagenet_shards.balance import POLICIES, UnknownPolicyError, check_policy
from imagenet_shards.errors import Error, UsageError, exit_code
from imagenet_shards.reference import read_reference_metadata
from imagenet_shards.reference.layout import adopt, check_reference_dataset
from imagenet_shards.repartition.report import describe_plan
from imagenet_shards.repartition.run import repartition

REMAINDER_HELP = f"""how to handle samples that do not divide evenly: {', '.join(POLICIES)}.
spread: counts differ by at most 1, every sample kept exactly once (for evaluation);
pad: equal counts, by repeating named samples; drop: equal counts, by leaving named samples out.
POLICY applies to every split; SPLIT=POLICY to one (repeat, or separate with commas).
Default: train=drop, any other split=spread."""


def parse_policies(values):
    policies = {}
    for value in values or []:
        for item in filter(None, value.split(",")):
            split, _, policy = item.rpartition("=")
            try:
                check_policy(policy)
            except UnknownPolicyError as error:
                raise argparse.ArgumentTypeError(f"--remainder {item!r}: {error}") from None
            policies[split or None] = policy
    return policies


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--target", required=True, help="the converted dataset (the folder holding metadata.json)")
    parser.add_argument("--num-instances", required=True, type=int, help="how many instances will read it (N >= 1)")
    parser.add_argument("--remainder", action="append", metavar="[SPLIT=]POLICY", help=REMAINDER_HELP)
    parser.add_argument("--splits", nargs="+", metavar="SPLIT", help="splits to repartition (default: all in metadata.json)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (per instance: shards, samples, bytes); write nothing")
    parser.add_argument("--overwrite", action="store_true", help="replace splits already repartitioned for N with another policy")
    parser.add_argument(
        "--verify-shards",
        choices=("copied", "all"),
        default="copied",
        help="sha256-check the shards samples are copied from (default, ~1 shard per instance)\n"
        "or every shard of the splits (reads the whole dataset once more)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def make_progress(quiet):
    if quiet or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(unit="B", unit_scale=True, desc="verify+copy", file=sys.stderr, leave=False)

    def progress(event, **info):
        if event in ("verified", "copied"):
            bar.update(info["bytes"])

    return progress, bar.close


def adopt_reference_dataset(target, dry_run):
    """A dataset made by the reference harness is adopted first (validate_dataset.py --adopt): its
    sample indexes and metadata.json are written beside the shards, no shard byte changes.
    Returns an exit code to stop with, or None to go on."""
    if dry_run:
        print(f"note: {target} is a dataset made by the reference harness; a real run first adopts it (checks its "
              f"folder checksum and shards, then writes its sample indexes and metadata.json; no shard changes), "
              f"as validate_dataset.py --adopt does; dry run: nothing written")
        return 0
    print(f"{target}: a dataset made by the reference harness: checking and adopting it first "
          f"(as validate_dataset.py --adopt)", flush=True)
    check = check_reference_dataset(target)
    if check.errors:
        for _, file, key, problem in check.errors[:20]:
            print(f"error: {file or '.'}{f' [{key}]' if key else ''}: {problem}", file=sys.stderr)
        print(f"error: {target}: not adopted, not repartitioned ({len(check.errors)} problem(s)); the dataset is "
              f"untouched", file=sys.stderr)
        return 1
    written = adopt(target, check)
    print(f"adopted: wrote {', '.join(written)} (no shard changed)")
    return None


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        policies = parse_policies(args.remainder)
    except argparse.ArgumentTypeError as error:
        parser.error(str(error))
    if os.path.isdir(args.target) and read_reference_metadata(args.target) is not None:
        code = adopt_reference_dataset(args.target, args.dry_run)
        if code is not None:
            return code
    progress, close = make_progress(args.quiet)
    try:
        result = repartition(
            args.target,
            args.num_instances,
            splits=args.splits,
            policies=policies,
            dry_run=args.dry_run,
            overwrite=args.overwrite,
            verify=args.verify_shards,
            progress=progress,
        )
    except (Error, OSError) as error:  # RepartitionUsageError (exit 2), bad data (exit 1)
        close()
        print(f"error: {error}", file=sys.stderr)
        if not isinstance(error, UsageError):
            print("the original dataset is untouched", file=sys.stderr)
        return exit_code(error)
    close()

    fmt = result.format
    if result.no_op:
        print(f"up to date: {result.output / 'manifest.json'} already repartitions {', '.join(result.kept_splits)} "
              f"for {args.num_instances} instances from this metadata.json; nothing to do")
        return 0
    for plan in result.plans:
        print(describe_plan(plan, fmt))
    if result.kept_splits:
        print(f"already up to date, left as they are: {', '.join(result.kept_splits)}")
    if result.dry_run:
        for split, old, new in result.conflicts:
            print(f"note: {split} is already repartitioned with {old!r}; replacing it with {new!r} needs --overwrite")
        print(f"dry run: nothing written (would write {result.output}; shards are sha256-checked only in a real run)")
        return 0
    if result.stale_replaced:
        print("replaced a repartition made from an earlier metadata.json (the dataset was re-converted)")
    copied = sum(plan.copied_bytes for plan in result.plans)
    print(
        f"wrote {result.output / 'manifest.json'}: {sum(p.copied_samples for p in result.plans)} samples copied "
        f"({copied / 1e6:.1f} MB), {result.verified_shards} shards sha256-verified "
        f"({result.verified_bytes / 1e6:.1f} MB), {result.elapsed:.1f} s"
    )
    reference = {split: entry["reference_loader"] for split, entry in (result.manifest or {}).get("splits", {}).items()
                 if split in {plan.split for plan in result.plans} and "reference_loader" in entry}
    if reference:
        last = result.manifest["num_instances"] - 1
        print("also for the reference harness's loader (Graphcore's webdataset_format.py): " + ", ".join(
            f"{split}-{{000000..{last:06d}}}.tar ({sum(r['samples'] for r in entry['remainders'])} samples)"
            for split, entry in reference.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
