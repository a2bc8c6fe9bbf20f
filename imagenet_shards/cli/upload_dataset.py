"""Upload a converted dataset (repartitions included) to an S3-compatible object store, verified.

    python upload_dataset.py LOCAL_DATASET s3://BUCKET/PREFIX [--s3-endpoint URL] [--workers N] [--resume | --overwrite]

Every file is one PUT carrying its SHA256 (shards: the one metadata.json recorded at conversion),
so the server rejects bytes corrupted in transit; each upload is checked with HEAD (size and
stored checksum, else ETag = md5); metadata.json goes last, as the commit marker. An existing
dataset under the prefix is refused unless --resume (skip objects that already match) or
--overwrite. Exit codes: 0 uploaded and verified, 1 some file failed (named), 2 usage error or the
store cannot be used (unreachable, bad credentials, no such bucket).
"""

import argparse
import sys

from imagenet_shards.cli.args import add_s3_arguments, apply_s3_arguments, positive_int
from imagenet_shards.storage import StorageUnavailable
from imagenet_shards.tools.upload import UploadError, describe, upload_dataset


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("local", metavar="LOCAL_DATASET", help="a converted dataset folder (has metadata.json)")
    parser.add_argument("target", metavar="s3://BUCKET/PREFIX")
    parser.add_argument("--workers", type=positive_int, default=4, help="parallel PUTs (default 4)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--resume", action="store_true", help="upload only the objects missing or different")
    mode.add_argument("--overwrite", action="store_true", help="replace an existing dataset under the prefix")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_s3_arguments(parser)
    args = parser.parse_args(argv)
    if not args.target.startswith("s3://"):
        parser.error(f"the target must be s3://BUCKET/PREFIX, got {args.target!r}")
    return args


def main(argv=None):
    args = parse_args(argv)
    apply_s3_arguments(args)
    try:
        report = upload_dataset(args.local, args.target, workers=args.workers, resume=args.resume,
                                overwrite=args.overwrite, progress=not args.no_progress)
    except (UploadError, StorageUnavailable) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(describe(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
