"""Convert ImageNet (extracted folders or the downloaded archives) into WebDataset shards.

    python create_webdataset.py --source SRC --target OUT [--format img|tensor|...] [--seed N] ...
    python create_webdataset.py --source SRC --target s3://BUCKET/PREFIX [--staging DIR] [--s3-endpoint URL] ...
    python create_webdataset.py --source CONVERTED --target OUT --format tensor   (derived: keys, labels, splits kept)

With an s3:// target the dataset is written to a local staging folder (--staging, else a temporary
one deleted after a successful upload), each shard is uploaded as soon as it is published, and
metadata.json last (see imagenet_shards/tools/upload.py).

Exit codes: 0 done (skipped images are listed, not fatal), 1 the conversion failed (bad
data with --on-error fail, unreadable source, full disk), 2 usage error. The library is
imagenet_shards.convert: converter.py runs a conversion, and its docstring maps the parts (plan, encode,
target_state) whose docstrings describe the output and the guarantees.
"""

import argparse
import sys
from pathlib import Path

from imagenet_shards.convert.converter import convert, format_summary
from imagenet_shards.pixel_limit import max_pixels
from imagenet_shards.errors import Error, exit_code
from imagenet_shards.convert.plan import (
    DEFAULT_IMAGE_QUALITY,
    DEFAULT_SAMPLES_PER_SHARD,
    ConvertOptions,
)
from imagenet_shards.formats import FORMATS, format_names, get_format
from imagenet_shards.cli.args import add_s3_arguments, apply_s3_arguments, int_between, positive_int, usable_cpus
from imagenet_shards.dataset_folder import SPLITS
from imagenet_shards.launcher import LauncherError, add_instance_arguments, instance_from_args
from imagenet_shards.convert.imagenet_source import LAYOUTS
from imagenet_shards.storage import is_url


TENSOR_STEPS = get_format("tensor").default_steps


def _source(text: str):
    """--source: a URL (a converted dataset on http(s) or s3) stays text; anything else is a path."""
    return text if is_url(text) else Path(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Convert ImageNet (train/<class>/*, validation/<class>/* folders, or the "
                    "ILSVRC2012_img_train.tar / ILSVRC2012_img_val.tar archives) into WebDataset shards "
                    "<split>-NNNNNN.tar with a per-sample index and metadata.json, reproducibly and resumably.")
    io_group = parser.add_argument_group("input and output")
    io_group.add_argument("--source", required=True, type=_source,
                          help="ImageNet folder: train/ and validation/ (or val/) class folders, or the archives "
                               "with ILSVRC2012_validation_ground_truth.txt and synsets.txt; or a converted "
                               "dataset (folder, http(s)://, s3://) to derive another format or resolution from")
    io_group.add_argument("--source-layout", choices=LAYOUTS, default="auto",
                          help="which layout of --source to read; auto: the folders when present, else the archives")
    io_group.add_argument("--target", required=True,
                          help="output folder, or s3://BUCKET/PREFIX; must be new or empty unless --resume or "
                               "--overwrite")
    io_group.add_argument("--staging", type=Path, default=None, metavar="DIR",
                          help="s3:// target: the local folder the dataset is written to before upload (kept; "
                               "--resume continues there). Default: a temporary folder, deleted after the upload")
    add_s3_arguments(io_group)
    io_group.add_argument("--splits", nargs="+", choices=SPLITS, default=list(SPLITS),
                          help="splits to convert (default: %(default)s)")
    fmt = parser.add_argument_group("what is stored")
    fmt.add_argument("--format", choices=format_names(), default="img",
                     help="; ".join(f"{f.name}: {f.description}" for f in FORMATS.values())
                          + " (JPEG formats copy RGB JPEGs without steps byte for byte)")
    fmt.add_argument("--train-preprocess-steps", nargs="+", default=[], metavar="STEP",
                     help="deterministic steps applied to train images, e.g. Resize(256) CenterCrop(224); "
                          "allowed: Resize(N), Resize(H, W), CenterCrop(N), CenterCrop(H, W). Default: none for "
                          f"img, {' '.join(TENSOR_STEPS['train'])} for tensor")
    fmt.add_argument("--validation-preprocess-steps", nargs="+", default=[], metavar="STEP",
                     help="the same for validation images. Default: none for img, "
                          f"{' '.join(TENSOR_STEPS['validation'])} for tensor")
    fmt.add_argument("--image-quality", type=int_between(1, 100), default=DEFAULT_IMAGE_QUALITY,
                     help="JPEG quality (1..100) for re-encoded images: with steps, or sources that are not RGB "
                          "JPEGs (default: %(default)s)")
    order = parser.add_argument_group("order and sharding")
    order.add_argument("--shuffle", action=argparse.BooleanOptionalAction, default=True,
                       help="one global seeded permutation of each split (default: on; --no-shuffle keeps class "
                            "order, which buffer-shuffling loaders cannot undo)")
    order.add_argument("--seed", type=int_between(0, 2**63 - 1), default=None,
                       help="seed of the permutation; drawn and recorded in metadata.json when not given")
    order.add_argument("--samples-per-shard", type=positive_int, default=DEFAULT_SAMPLES_PER_SHARD,
                       help="samples per shard, at most (default: %(default)s)")
    order.add_argument("--max-shard-bytes", type=positive_int, default=None,
                       help="also start a new shard before its estimated size passes this many bytes "
                            "(estimated from the source sizes: exact for img passthrough)")
    run = parser.add_argument_group("running")
    run.add_argument("--workers", type=positive_int, default=usable_cpus(),
                     help="processes that encode and write whole shards (default: the usable cores, "
                          "%(default)s); the output does not depend on it")
    run.add_argument("--resume", action="store_true",
                     help="finish an interrupted conversion: keep shards that verify (sha256), write the rest")
    run.add_argument("--overwrite", action="store_true",
                     help="delete the converted dataset in --target (only files this tool writes) and convert again")
    run.add_argument("--on-error", choices=("skip", "fail"), default="skip",
                     help="a bad image: skip it (counted and listed in the summary and metadata.json) or stop "
                          "at once naming it (default: %(default)s)")
    run.add_argument("--max-image-pixels", type=positive_int, default=max_pixels(),
                     help="decompression-bomb guard: images declaring more pixels are not decoded and count as "
                          "bad (default: PIL's %(default)s)")
    run.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    add_instance_arguments(parser)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        instance = instance_from_args(args)
    except LauncherError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    apply_s3_arguments(args)  # for an s3:// --source (a converted dataset) as for an s3:// --target
    remote = None
    if args.target.startswith("s3://"):
        if instance.count > 1:
            print("error: an s3:// --target is converted by one instance (convert locally, then upload_dataset.py)",
                  file=sys.stderr)
            return 2
        remote, args.target = args.target, _staging_folder(args)
        apply_s3_arguments(args)
        problem = _remote_target_problem(remote, args)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        from imagenet_shards.tools.upload import PublishedShardUploader

        uploader = PublishedShardUploader(args.target, remote)
    options = ConvertOptions(
        source=args.source, target=Path(args.target), format=args.format, splits=tuple(args.splits),
        shuffle=args.shuffle, seed=args.seed, samples_per_shard=args.samples_per_shard,
        max_shard_bytes=args.max_shard_bytes, image_quality=args.image_quality,
        train_steps=tuple(args.train_preprocess_steps), validation_steps=tuple(args.validation_preprocess_steps),
        workers=args.workers, resume=args.resume, overwrite=args.overwrite, on_error=args.on_error,
        max_image_pixels=args.max_image_pixels, source_layout=args.source_layout, instance=instance,
        progress=args.progress, on_published=uploader.published if remote else None,
    )
    try:
        summary = convert(options)
    except Error as error:  # UsageError (exit 2), ConversionError and any other data error (exit 1)
        print(f"error: {error}", file=sys.stderr)
        return exit_code(error)
    except KeyboardInterrupt:
        print("interrupted: nothing half-written is left under a final name; run again with --resume",
              file=sys.stderr)
        return 130
    print(format_summary(summary))
    if remote:
        return _finish_upload(uploader, args)
    return 0


def _staging_folder(args) -> str:
    if args.staging is not None:
        return str(args.staging)
    import tempfile

    args.temporary_staging = True
    return tempfile.mkdtemp(prefix="create-webdataset-staging-")


def _remote_target_problem(remote, args):
    """Why an s3:// target cannot be written to, or None (an existing dataset needs --resume/--overwrite)."""
    from imagenet_shards.storage import StorageUnavailable, list_objects

    try:
        existing = list_objects(remote)
    except (StorageUnavailable, ValueError) as error:
        return str(error)
    if existing and not (args.resume or args.overwrite):
        return f"{remote}: already holds {len(existing)} objects; use --resume or --overwrite"
    if existing and args.overwrite:
        from imagenet_shards.storage import delete_object, join_location

        for name in existing:  # the conversion starts over: nothing old stays visible under the prefix
            delete_object(join_location(remote, name))
    return None


def _finish_upload(uploader, args) -> int:
    import shutil

    from imagenet_shards.storage import StorageUnavailable
    from imagenet_shards.tools.upload import describe

    try:
        report = uploader.finish(progress=args.progress)
    except StorageUnavailable as error:
        print(f"error: {error}; the converted dataset stays in {args.target}", file=sys.stderr)
        return 1
    print(describe(report))
    if not report.ok:
        print(f"the converted dataset stays in {args.target}; upload_dataset.py {args.target} {report.target} "
              f"--resume finishes the upload", file=sys.stderr)
        return 1
    if getattr(args, "temporary_staging", False):
        shutil.rmtree(args.target, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
