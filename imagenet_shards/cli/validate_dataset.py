"""Check that a dataset is intact and name every corrupt, missing or extra file and sample.

    python validate_dataset.py --imagenet-data-path PATH [--deep] [--workers N] [--json FILE] [--write-manifest]
    python validate_dataset.py PATH ...
    python validate_dataset.py s3://BUCKET/PREFIX [--quick] [--s3-endpoint URL] ...
    python validate_dataset.py PATH --adopt     a dataset made by the reference harness: check, then index it
    python validate_dataset.py A --same-as B    do A and B (any formats, copies, repartitions) hold the same samples?

PATH is either a converted dataset (it has metadata.json: shards, sample indexes and
repartitions are checked) or a raw image folder with train/ and validation/ (the reference
checksum against ImageNet's, or every file against the folder's own manifest). A converted
dataset on S3 is listed (missing, extra objects), streamed once and checked as locally;
--quick compares sizes and the server's stored checksums only (see imagenet_shards/validate/remote.py).
A dataset made by the reference harness (Graphcore's create_webdataset.py; its metadata.json has
no "splits") is checked against its md5 folder checksum, and every shard is walked (structure,
members, counts); `--adopt` then writes this project's sample indexes and metadata.json beside
the shards (no shard byte changes), after which it is checked, loaded and repartitioned as a
converted dataset.

Output: the reference lines (`Dataset OK.` / `Dataset is corrupted.`, `Train data OK.` ...),
then one line per problem naming the file and the sample key. Exit codes: 0 intact
(warnings allowed), 1 corruption found, 2 usage error or unreadable path.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from imagenet_shards.cli.args import add_s3_arguments, apply_s3_arguments, usable_cpus
from imagenet_shards.storage import StorageUnavailable, is_s3
from imagenet_shards.validate.report import ValidationUsageError
from imagenet_shards.validate.validator import validate

MAX_LINES_PER_FILE = 20  # more problems in one file are summarised in one line; --json has them all


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[2],
        epilog="Exit codes: 0 intact (warnings allowed), 1 corruption found, 2 usage error or unreadable path.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", nargs="?", metavar="PATH", help="the dataset folder (same as --imagenet-data-path)")
    parser.add_argument("--imagenet-data-path", dest="data_path", metavar="PATH", help="the dataset folder: "
                        "converted (has metadata.json) or raw (has train/ and validation/ class folders)")
    parser.add_argument("--deep", action="store_true", help="also decode every image (PIL verify + load) and tensor, "
                        "and hash every payload (slower: about 1,000 images/s per worker)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes that check shards (or raw files) in parallel (default: one per CPU)")
    parser.add_argument("--json", dest="json_path", metavar="FILE", help="write the full report as JSON to FILE")
    parser.add_argument("--write-manifest", action="store_true", help="raw folders: record every file's path, size and "
                        "sha256 in PATH/dataset_manifest.tsv; later runs check against it and name each file "
                        "added, missing or changed")
    parser.add_argument("--adopt", action="store_true", help="a dataset made by the reference harness: once its "
                        "folder checksum and shards check out, write this project's sample indexes and metadata.json "
                        "beside the shards (no shard byte changes; the folder checksum in metadata.json is updated "
                        "to include them, so the reference validator still accepts the folder)")
    parser.add_argument("--same-as", metavar="B", help="instead of checking PATH alone: prove that PATH and B (any "
                        "formats, local or http(s)/s3, or a repartition DIR/distributed/<N>-instances) hold the same "
                        "samples: keys, classes, boxes and pixels (after the recorded steps B adds to PATH, or PATH to "
                        "B, within a stated bound); names the first differing keys and counts each kind")
    parser.add_argument("--split", choices=("train", "validation"), action="append", default=None,
                        help="with --same-as: only this split (repeatable; default: every split of either)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--quick", action="store_true", help="s3:// only: check object sizes and the checksums the "
                        "server stored at upload, without reading the shards")
    parser.add_argument("--staging", metavar="DIR", default=None, help="s3:// only: where the objects are streamed "
                        "to be checked (needs the dataset's size free; deleted afterwards; default: the temp folder)")
    add_s3_arguments(parser)
    args = parser.parse_args(argv)
    if args.path and args.data_path and Path(args.path) != Path(args.data_path):
        parser.error("give the dataset path once (positional or --imagenet-data-path), not two different ones")
    args.path = args.path or args.data_path
    if not args.path:
        parser.error("the dataset path is required (--imagenet-data-path PATH, or PATH)")
    if args.workers is None:
        args.workers = usable_cpus()
    if args.workers < 1:
        parser.error(f"--workers must be at least 1, got {args.workers}")
    if args.same_as is None and args.split:
        parser.error("--split applies to --same-as only")
    if args.same_as is not None and (args.deep or args.write_manifest or args.adopt or args.quick):
        parser.error("--same-as compares two datasets; --deep, --write-manifest, --adopt and --quick check one")
    if args.quick and not is_s3(args.path):
        parser.error("--quick is for s3:// datasets (a local check reads the shards anyway)")
    return args


def progress_bar(total, description):
    from tqdm import tqdm

    return tqdm(total=total, desc=description, unit="B", unit_scale=True, unit_divisor=1000, file=sys.stderr,
                dynamic_ncols=True, leave=False, disable=None)  # no bar in logs (non-TTY)


def plural(count, noun):
    return f"{count:,} {noun}" + ("" if count == 1 else "s")


def render(report):
    """The lines printed to stdout: verdicts, problems (at most MAX_LINES_PER_FILE per file), notes, summary."""
    lines = report.verdict_lines()
    shown = Counter()
    per_file = Counter(p.file for p in report.problems)
    for problem in report.problems:
        shown[problem.file] += 1
        if shown[problem.file] <= MAX_LINES_PER_FILE:
            lines.append(problem.line())
        elif shown[problem.file] == MAX_LINES_PER_FILE + 1:
            lines.append(f"{problem.severity}: {problem.file}: ... and {per_file[problem.file] - MAX_LINES_PER_FILE} "
                         f"more problems in this file (--json FILE lists them all)")
    lines += [f"note: {note}" for note in report.notes]
    if report.upgrade:  # an earlier layout: the line naming the command (and any damaged shard), no summary
        return lines
    stats = report.stats
    what = (f"{stats.get('shards_checked', 0)} shards, {stats.get('samples_checked', 0):,} samples"
            if report.mode == "converted" else f"{stats.get('files_checked', 0):,} files")
    rate = f" ({stats['mb_per_s']:,} MB/s)" if stats.get("mb_per_s") else ""
    lines.append(f"Checked {what}, {stats.get('bytes_checked', 0) / 1e6:,.1f} MB in {stats.get('seconds', 0):.1f} s"
                 f"{rate} with {plural(stats.get('workers', 1), 'worker')}: {plural(len(report.errors), 'error')}, "
                 f"{plural(len(report.warnings), 'warning')}.")
    return lines


def main(argv=None):
    args = parse_args(argv)
    if args.same_as is not None:
        return same_as_main(args)
    return checked(args, lambda: check(args), render, "checked")


def check(args):
    """The Report of the dataset at args.path: over S3 (imagenet_shards.validate.remote) or local/http."""
    progress = None if args.no_progress else progress_bar
    if is_s3(args.path):
        from imagenet_shards.validate.remote import validate_s3

        apply_s3_arguments(args)
        return validate_s3(args.path, workers=args.workers, deep=args.deep, quick=args.quick, progress=progress,
                           staging=args.staging)
    return validate(args.path, workers=args.workers, deep=args.deep, write_manifest=args.write_manifest,
                    progress=progress, adopt=args.adopt)


def same_as_main(args) -> int:
    """--same-as: exit 0 same samples, 1 a difference (named), 2 a dataset that cannot be read."""
    from imagenet_shards.tools.same_as import render as render_same_as, same_as

    apply_s3_arguments(args)
    return checked(args, lambda: same_as(args.path, args.same_as, args.split), render_same_as, "compared")


def checked(args, make_report, render_lines, done: str) -> int:
    """Print the report `make_report()` returns and return its exit code: 2 for a usage or storage error
    (one line), 130 when interrupted; --json FILE gets the report too."""
    try:
        report = make_report()
    except (ValidationUsageError, StorageUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"validate_dataset.py: interrupted; nothing was {done} to the end", file=sys.stderr)
        return 130
    for line in render_lines(report):
        print(line)
    return write_json_report(args, report) or report.exit_code


def write_json_report(args, report) -> int:
    """Write --json FILE; 2 when it cannot be written, else 0."""
    if args.json_path:
        try:
            with open(args.json_path, "w") as handle:
                json.dump(report.to_json(), handle, indent=1)
                handle.write("\n")
        except OSError as exc:
            print(f"error: cannot write the JSON report {args.json_path}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
