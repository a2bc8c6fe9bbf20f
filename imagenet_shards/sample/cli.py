"""The command line of `python -m imagenet_shards.sample`: options, the printed summary, exit codes.

Exit 0 when built, 1 for a data problem (SampleDatasetError or OSError, one line on stderr),
2 for a usage error (argparse).
"""

import argparse
import sys

from imagenet_shards.sample.build import build_sample_dataset
from imagenet_shards.sample.names import LAYOUTS, QUIRKS_JSON, TRAIN_DIR, VAL_DIR, SampleDatasetError
from imagenet_shards.sample.listings import IMAGENET_MEAN_BYTES
from imagenet_shards.sample.render import QUALITY


def format_summary(summary: dict) -> str:
    """The lines printed after a build, from build_sample_dataset's summary."""
    splits = summary["splits"]
    overall = summary["all"]
    params = summary["parameters"]
    lines = [
        f"sample dataset in {summary['out']}: {params['classes']} classes, layouts {'+'.join(params['layouts'])}, "
        f"seed {params['seed']}, photos {params['photos']}",
    ]
    for split in (TRAIN_DIR, VAL_DIR):
        s = splits[split]
        lines.append(f"  {split:<10} {s['images']:>7} images  mean {s['mean_bytes'] / 1000:6.1f} KB  "
                     f"mean {s['mean_width']:.0f}x{s['mean_height']:.0f} px")
    lines.append(
        f"  all        {overall['images']:>7} images  mean {overall['mean_bytes'] / 1000:6.1f} KB "
        f"(ImageNet ~{IMAGENET_MEAN_BYTES // 1000} KB: {overall['mean_bytes'] / IMAGENET_MEAN_BYTES:.0%})  "
        f"mean {overall['mean_width']:.0f}x{overall['mean_height']:.0f} px, sides {summary['min_side']}-"
        f"{summary['max_side']} px ({summary['sides_300_500']:.0%} in 300-500), JPEG quality {QUALITY[0]}-{QUALITY[1]}")
    photo_note = (f"  photos: {summary['photos_used']} used of {summary['photos_found']} found"
                  f", {summary['upscaled']} images upscaled from small photos")
    if summary["photos_skipped"]:
        photo_note += f", {len(summary['photos_skipped'])} unreadable photos skipped"
    if summary["shared_photos"]:
        photo_note += "; fewer distinct photos than classes: some classes share photos"
    lines.append(photo_note)
    if summary["quirks"]:
        lines.append("  quirks:   " + "; ".join(
            f"{q['kind']} {q['split']}/{q['name']}" for q in summary["quirks"]) + f"  (see {QUIRKS_JSON})")
    lines.append(f"  built in {summary['elapsed_s']:.1f} s")
    return "\n".join(lines)


def parse_args(argv=None):
    """The options; a bad one exits 2 with argparse's usage message."""
    parser = argparse.ArgumentParser(
        prog="python -m imagenet_shards.sample",
        description="Build a small ImageNet-like dataset (extracted folders and/or the downloaded tar "
                    "archives with a ground-truth file) from real photos.")
    parser.add_argument("--out", required=True, help="output folder (new or empty, or one this builder made)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--photos", default=None,
                        help="folder of photos, searched recursively for *.jpg/*.jpeg/*.png "
                             "(default: the bundled imagenet_shards/photos; ../shared/photos has more)")
    parser.add_argument("--quirks", action="store_true",
                        help="inject ImageNet's quirks: PNG named .JPEG, CMYK, grayscale, EXIF-rotated")
    parser.add_argument("--layout", choices=("folder", "archive", "both"), default="both")
    parser.add_argument("--workers", type=int, default=None, help="rendering processes (default: one per core)")
    args = parser.parse_args(argv)
    for name in ("classes", "train_per_class"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.val_per_class < 0:
        parser.error(f"--val-per-class must be >= 0, got {args.val_per_class}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    return args


def main(argv=None) -> int:
    """Build, print the summary; 0 when built, 1 for a data problem (one line on stderr)."""
    args = parse_args(argv)
    layouts = LAYOUTS if args.layout == "both" else (args.layout,)
    try:
        summary = build_sample_dataset(args.out, args.classes, args.train_per_class, args.val_per_class, args.seed,
                                       args.photos, args.quirks, layouts, args.workers)
    except (SampleDatasetError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(format_summary(summary))
    return 0
