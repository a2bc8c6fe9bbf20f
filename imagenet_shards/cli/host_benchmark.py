"""How fast can this host feed images to accelerators? Measure one source, or compare every format.

One source (the reference harness's options; prints `Throughput of the iteration:<x> img/sec`):

    python host_benchmark.py --data real --imagenet-data-path converted/img --batch-size 64 \\
        --dataloader-worker 8 --normalization-location device --iterations 3 --seconds 20

Format comparison of a directory holding the source folder and its converted forms
(DIR/source/{train,validation}/, DIR/img/, DIR/tensor/, ...; found by content), against the
bare decode+augment ceiling and the ImageFolder and stock webdataset baselines:

    python host_benchmark.py --compare DIR --seconds 5 --json results.json --plot results.png

Which format and how many workers deliver R images/s per instance (the arithmetic shown), measured
now or from a saved report:

    python host_benchmark.py --compare DIR --recommend --target-rate 3000 [--instances N] [--cores-per-instance C]
    python host_benchmark.py --recommend results.json --target-rate 2000 --instances 8 --recommend-plot rec.png

The same dataset read locally and from copies of it over http(s) and s3 (GETs per epoch, time to
first byte, and the transport ceiling: raw ranged GETs with no decode):

    python host_benchmark.py --compare DIR --formats img --split validation \\
        --compare-transport http://host:8000/img s3://bucket/img --s3-endpoint http://host:8333

How many accelerators of a kind this host and its storage keep busy (emulated: a batch, then a sleep of
the profile's compute time; the largest N with AU >= 0.9, as MLPerf Storage; docs/emulated-accelerators.md):

    python host_benchmark.py --data imagenet --imagenet-data-path DIR|URL --accelerators auto \\
        --profile resnet50-h100 --depth storage|pipeline [--runs 5] --json emu.json --plot emu.png

Under torchrun (or poprun/SLURM/OpenMPI with MASTER_ADDR/MASTER_PORT or --rendezvous) every
instance reads its own share; rank 0 prints each instance's figures and the aggregate.
See imagenet_shards/hostbench/timing.py for how every figure is counted.
"""

import argparse
import os
import sys
import warnings
from pathlib import Path

from imagenet_shards.cli.args import add_s3_arguments, apply_s3_arguments, non_negative_int, positive_float, positive_int, usable_cpus


def percentage(text) -> float:
    value = float(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"{text} is not a percentage in (0, 100]")
    return value


def fraction(text) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a ratio in [0, 1]")
    return value
from imagenet_shards.errors import DatasetError
from imagenet_shards.launcher import add_instance_arguments

DATA_ALIASES = {"synthetic": "generated"}  # --data: the reference's name for the same images made in memory
# --data values the benchmark reads itself (a dataset at --imagenet-data-path, or images made in memory); every
# other value is a loader source kind (loader/source_kinds/), asked about its location by name.
NOT_KINDS = ("real", "imagenet", "generated")


def build_parser():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
    )
    source = parser.add_argument_group("what to read")
    source.add_argument("--data", choices=("real", "generated", "synthetic", "imagenet", "cifar10"), default="real",
                        help="imagenet: whatever --imagenet-data-path holds, detected as the reference harness "
                             "does: metadata.json -> WebDataset shards (made here or by the reference harness), "
                             "<split>/ class folders -> ImageFolder, otherwise TFRecord shards; real: a dataset "
                             "converted to shards only (a directory, shard list or URL pattern; an extracted "
                             "folder is refused; the reference's `real` is instead a few bundled sample images); "
                             "generated or synthetic: images made in memory (no reads); cifar10: CIFAR-10's python "
                             "batches in --imagenet-data-path (PATH/cifar-10-batches-py/, never downloaded; loaded "
                             "with a restricted unpickler). Default: real")
    source.add_argument("--imagenet-data-path", metavar="PATH",
                        help="the converted dataset or the extracted folder to read (--data real or imagenet)")
    add_s3_arguments(source)
    source.add_argument("--split", choices=("train", "validation"), default="train",
                        help="which split and pipeline: train (RandomResizedCrop + flip) or validation "
                             "(Resize + CenterCrop). Default: train")
    source.add_argument("--compare", metavar="DIR",
                        help="compare every format found in DIR (the source folder and its converted forms, "
                             "detected by metadata.json's format) x each normalisation location, against the "
                             "bare decode+augment ceiling and the ImageFolder and stock webdataset baselines")
    source.add_argument("--formats", metavar="LIST",
                        help="with --compare: only these formats, comma-separated (e.g. folder,img)")
    source.add_argument("--compare-transport", metavar="URL", nargs="+", action="extend", default=None,
                        help="with --compare: other copies of a dataset in DIR (http(s):// or s3://, with "
                             "--s3-endpoint), checked to hold the same shards (names, sizes, sha256 in "
                             "metadata.json): adds that format's device row read from each copy, one untimed "
                             "epoch counting its GETs, and transport-ceiling rows (raw ranged GETs, no decode)")

    add_loading_arguments(parser.add_argument_group("how to load"))
    add_measuring_arguments(parser)
    add_emulation_arguments(parser.add_argument_group(
        "emulated accelerators (imagenet_shards/hostbench/emulate.py; docs/emulated-accelerators.md)"))
    return parser


def add_emulation_arguments(group) -> None:
    group.add_argument("--accelerators", metavar="N|auto",
                       help="emulate N accelerators (one process each, its own loader: a batch, then a sleep of the "
                            "profile's compute time), or auto: the largest N with AU >= --au-threshold (doubling, "
                            "then bisection). Under torchrun each rank is one accelerator. Reuses --batch-size (the "
                            "profile's batch), --batches (steps per accelerator; default 500 steps in all) or "
                            "--seconds (per N), --dataloader-worker (per accelerator; default CPUs / N), --split, "
                            "--seed, --normalization-location (default device), --decode-location, --no-verify, "
                            "--json, --plot; --runs replaces --rounds; the profile's rate replaces --target-rate")
    group.add_argument("--profile", metavar="NAME|FILE",
                       help="resnet50-h100 (batch 400, 0.224 s) or resnet50-a100 (400, 0.435 s): MLPerf Storage's; "
                            "resnet50-h200-measured (256, 0.0552 s: docs/train-on-gpu.md); "
                            "a DLIO workload .yaml (reader.batch_size, train.computation_time); or a "
                            "examples/train_imagenet.py --step-log file (the measured step time less the data wait)")
    group.add_argument("--compute-time", type=float, metavar="S",
                       help="seconds of compute per batch (by hand, with --batch-size; or overriding the profile's)")
    group.add_argument("--depth", choices=("storage", "pipeline"), default="storage",
                       help="storage: bytes read and CRC32C-checked, no decode (as MLPerf Storage); pipeline: the "
                            "real train pipeline (decode, crop, flip). Default: storage")
    group.add_argument("--au-threshold", type=float, default=None, metavar="AU",
                       help="the AU a run must reach on every accelerator, in (0, 1] (default 0.9, MLPerf's)")
    group.add_argument("--runs", type=positive_int, default=1,
                       help="runs of the fixed N (auto: of the N found, the search's run included), with their "
                            "spread (default 1; MLPerf Storage: 5)")
    group.add_argument("--max-accelerators", type=positive_int, default=None, metavar="N",
                       help="auto: the largest N tried (default 64)")
    group.add_argument("--drop-page-cache", action="store_true",
                       help="before each run, posix_fadvise(DONTNEED) on the split's local shards, so that run's "
                            "first epoch comes from storage, not memory")


def add_loading_arguments(loading) -> None:
    loading.add_argument("--batch-size", type=positive_int, default=None, help="images per batch per instance "
                         "(default 64; with --accelerators: the profile's)")
    loading.add_argument("--dataloader-worker", type=non_negative_int, default=None, metavar="N",
                         help="DataLoader worker processes per instance (default: one per usable CPU, "
                              f"{usable_cpus()} here); 0 loads in the main process")
    loading.add_argument("--disable-async-loading", action="store_true",
                         help="load synchronously in the main process (the same as --dataloader-worker 0)")
    loading.add_argument("--normalization-location", choices=("host", "device", "ipu"), default=None,
                         help="host: batches are normalised float32; device (alias ipu): batches are uint8 NCHW "
                              "and the accelerator normalises. Default: host (device with --eight-bit-io)")
    loading.add_argument("--decode-location", choices=("host", "device"), default="host",
                         help="host: the DataLoader workers decode the JPEGs; device: the accelerator does "
                              "(get_data(jpeg_decode='device'), nvJPEG; a CPU stand-in without CUDA), the workers "
                              "read, verify and draw the crops (implies --normalization-location device)")
    loading.add_argument("--eight-bit-io", action="store_true",
                         help="transfer uint8 images (implies --normalization-location device)")
    loading.add_argument("--dataloader-rebatch-size", type=positive_int, default=None, metavar="N",
                         help="workers build batches of N images, joined into --batch-size batches in the main "
                              "process (the reference's option: a smaller host memory footprint per worker). "
                              "Default: --batch-size (no rebatching)")
    loading.add_argument("--webdataset-percentage-to-use", type=percentage, default=100.0, metavar="P",
                         help="WebDataset sources: read only the first P%% of the split's shards (rounded up), as "
                              "the reference harness does. Default 100")
    loading.add_argument("--webdataset-memory-cache-ratio", type=fraction, default=0.0, metavar="R",
                         help="WebDataset sources: the first R (0..1) of the shards used are read into memory "
                              "before timing, so their samples come from RAM (here: the page cache the loader maps "
                              "shards from), the rest from storage, as the reference's memory cache. Default 0")
    loading.add_argument("--use-bbox-info", action="store_true",
                         help="train: RandomResizedCrop prefers crops that overlap the sample's bounding box (its "
                              "json's bbox, from imagenet_2012_bounding_boxes.csv) by at least 0.1 of the crop area, "
                              "up to 10 draws, as the reference harness intends")
    loading.add_argument("--no-verify", action="store_true",
                         help="do not check each sample's CRC32C against the sample index as it is read "
                              "(get_data(DataSource(path, verify=False))); --compare otherwise adds one verify-off "
                              "row per format")
    loading.add_argument("--seed", type=non_negative_int, default=0, help="shuffle and augmentation seed")
    loading.add_argument("--image-size", type=positive_int, default=224, metavar="PX",
                         help="output side of every pipeline (default 224; validation resizes to 256/224 of it "
                              "first). JPEGs are decoded only where the crop (train) or center crop (validation) "
                              "needs pixels when native/jpeg_crop is built; DATASETS_JPEG_DECODE=pil decodes "
                              "whole images")


def add_measuring_arguments(parser) -> None:
    """The cache, timing, decision, output and distributed option groups."""
    cache = parser.add_argument_group("node-local shard cache (imagenet_shards/shard_cache/)")
    cache.add_argument("--cache-dir", metavar="DIR",
                       help="keep shards read from s3:// or http(s):// in DIR (shared by the node's processes; "
                            "verified against metadata.json). With --compare-transport: adds two whole epochs per "
                            "copy read through a fresh cache under DIR (cold, warm) beside two local and two "
                            "uncached ones, with GETs, store bytes and the cache goals")
    cache.add_argument("--cache-limit", metavar="SIZE", default=None,
                       help="the most bytes the cache holds, e.g. 200GB or 512MiB (LRU; default: the disk's free "
                            "space less 1 GiB)")
    cache.add_argument("--cache-prefetch", type=non_negative_int, default=0, metavar="N",
                       help="fetch the next N shards of each reader's plan into the cache ahead of it (default 0)")
    cache.add_argument("--cache-remote-paths", action="store_true",
                       help="cache a local --imagenet-data-path too, as a network file system (NFS) path")

    timing = parser.add_argument_group("how long to measure")
    timing.add_argument("--iterations", type=positive_int, default=2,
                        help="measurements of one source, each with fresh workers (default 2)")
    timing.add_argument("--warmup-batches", type=non_negative_int, default=None, metavar="N",
                        help="batches pulled before timing starts, not counted (default: 2 per worker, at least 2)")
    limit = timing.add_mutually_exclusive_group()
    limit.add_argument("--batches", type=positive_int, default=None, metavar="N",
                       help="measure N batches after the warm-up (repeating epochs if needed)")
    limit.add_argument("--seconds", type=positive_float, default=None, metavar="S",
                       help="measure for S seconds after the warm-up (default with --compare: 5; "
                            "otherwise one whole epoch per iteration)")
    timing.add_argument("--rounds", type=positive_int, default=1,
                        help="with --compare: measure every row this many times, interleaved, and report the "
                             "round with the median images/s; a goal's ratio is the median of the rounds' "
                             "ratios (default 1)")

    decision = parser.add_argument_group("the format decision (imagenet_shards/hostbench/recommend.py)")
    decision.add_argument("--recommend", nargs="?", const="", default=None, metavar="SAVED.json",
                          help="with --compare: after measuring, recommend one format and --dataloader-worker count "
                               "for --target-rate, with the arithmetic; or, without --compare, from the rows of a "
                               "saved --json report (nothing is measured)")
    decision.add_argument("--target-rate", type=positive_float, metavar="R",
                          help="images/s each instance must receive (e.g. what one accelerator consumes)")
    decision.add_argument("--instances", type=positive_int, default=1, metavar="N",
                          help="instances per host, sharing its cores and its storage ceiling (default 1)")
    decision.add_argument("--cores-per-instance", type=positive_float, metavar="C",
                          help="cores each instance may use (default: the measuring host's usable CPUs / N)")
    decision.add_argument("--dataset-images", type=positive_int, metavar="IMAGES",
                          help="images in the split to be trained on, for the page-cache check (default: the "
                               "split's samples in DIR; ImageNet train: 1281167)")
    decision.add_argument("--recommend-plot", metavar="FILE.png",
                          help="draw images/s per instance against worker count for each format, with the target")

    output = parser.add_argument_group("output")
    output.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    output.add_argument("--plot", metavar="FILE.png", help="write a bar chart (PNG)")

    distributed = parser.add_argument_group("distributed")
    distributed.add_argument("--rendezvous", metavar="URL",
                             help="torch.distributed init method to gather figures (e.g. file:///shared/rdv or "
                                  "tcp://host:port) when the launcher sets no MASTER_ADDR/MASTER_PORT")
    add_instance_arguments(parser)


def normalization_for_decode(parser, args) -> str:
    """--decode-location device hands out uint8 batches on the device: device normalisation, or a usage error."""
    if args.decode_location == "device":
        if args.normalization_location == "host":
            parser.error("--decode-location device hands out uint8 batches on the device, which the host cannot "
                         "have normalised: drop --normalization-location host")
        return "device"
    return args.normalization_location or "host"


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.accelerators is not None:
        return args  # checked by check_emulation (one line, exit 2), before torch is imported
    _refuse_emulation_options(parser, args)
    if args.normalization_location == "ipu":
        args.normalization_location = "device"
    if args.eight_bit_io:
        if args.normalization_location == "host":
            parser.error("--eight-bit-io transfers uint8 images, which the host cannot have normalised: "
                         "drop --normalization-location host")
        args.normalization_location = "device"
    args.normalization_location = normalization_for_decode(parser, args)
    _workers(parser, args)
    if args.warmup_batches is None:
        args.warmup_batches = max(2, 2 * args.dataloader_worker)
    if args.recommend is not None:
        if args.target_rate is None:
            parser.error("--recommend needs --target-rate R (images/s per instance)")
        if args.compare is None and not args.recommend:
            parser.error("--recommend needs --compare DIR (measure, then recommend) or a saved report: "
                         "--recommend SAVED.json")
        if args.compare is not None and args.recommend:
            parser.error("--recommend SAVED.json reads a saved report instead of measuring: drop --compare")
        if args.recommend and not os.path.isfile(args.recommend):
            parser.error(f"--recommend {args.recommend}: no such file")
    elif any(getattr(args, name) is not None for name in ("target_rate", "cores_per_instance", "dataset_images",
                                                          "recommend_plot")) or args.instances != 1:
        parser.error("--target-rate, --instances, --cores-per-instance, --dataset-images and --recommend-plot "
                     "apply to --recommend only")
    if args.recommend:
        pass  # a saved report: nothing below is measured
    elif args.compare is not None:
        if not os.path.isdir(args.compare):
            parser.error(f"--compare {args.compare}: no such directory")
        if args.batches is None and args.seconds is None:
            args.seconds = 5.0
        for location in args.compare_transport or ():
            if not location.startswith(("http://", "https://", "s3://")):
                parser.error(f"--compare-transport {location}: not an http(s):// or s3:// location (the local "
                             f"copy is the one in --compare DIR)")
    else:
        if args.formats or args.rounds != 1 or args.compare_transport:
            parser.error("--formats, --rounds and --compare-transport apply to --compare only")
        args.data = DATA_ALIASES.get(args.data, args.data)
        if args.data in ("real", "imagenet") and not args.imagenet_data_path:
            parser.error(f"--data {args.data} needs --imagenet-data-path (or use --data generated, or --compare DIR)")
        if args.data not in NOT_KINDS:  # --data names a loader source kind (cifar10): the kind checks its location
            from imagenet_shards.loader.source_kinds import get_source_kind  # light: numpy only, no torch

            check = get_source_kind(args.data).check_location
            try:
                if check is not None:
                    check(args.imagenet_data_path)
            except DatasetError as error:  # without a location, the kind's reason follows the option naming it
                parser.error(str(error) if args.imagenet_data_path else f"--data {args.data} {error}")
        path = args.imagenet_data_path
        if path and "://" not in path and "{" not in path:
            if not os.path.exists(path):
                parser.error(f"--imagenet-data-path {path}: no such file or directory")
            from imagenet_shards.hostbench.discovery import is_image_folder  # light: no torch

            converted = os.path.isfile(os.path.join(path, "metadata.json"))
            if args.data == "real" and os.path.isdir(path) and not converted and is_image_folder(Path(path)):
                parser.error(f"--data real: {path} is an extracted ImageNet folder, not a converted dataset "
                             f"(no metadata.json): use --data imagenet")
    if args.dataloader_rebatch_size is not None and args.dataloader_rebatch_size > args.batch_size:
        parser.error(f"--dataloader-rebatch-size {args.dataloader_rebatch_size} is larger than --batch-size "
                     f"{args.batch_size}: rebatching joins smaller worker batches into batches of --batch-size")
    _check_cache_arguments(parser, args)
    for name in ("json", "plot", "recommend_plot"):
        target = getattr(args, name)
        if target and not os.path.isdir(os.path.dirname(os.path.abspath(target))):
            parser.error(f"--{name.replace('_', '-')} {target}: the directory {os.path.dirname(os.path.abspath(target))} does not exist")
    return args


def _workers(parser, args) -> None:
    """--disable-async-loading (0 workers) or --dataloader-worker, default one per usable CPU."""
    if args.disable_async_loading:
        if args.dataloader_worker not in (None, 0):
            parser.error(f"--disable-async-loading loads in the main process, but --dataloader-worker "
                         f"{args.dataloader_worker} asks for workers: give one or the other")
        args.dataloader_worker = 0
    if args.dataloader_worker is None:
        args.dataloader_worker = usable_cpus()


def _refuse_emulation_options(parser, args) -> None:
    """The --accelerators options without --accelerators: a usage error; --batch-size's default, 64."""
    if any(getattr(args, name) is not None for name in ("profile", "compute_time", "au_threshold",
                                                        "max_accelerators")) or \
            args.runs != 1 or args.depth != "storage" or args.drop_page_cache:
        parser.error("--profile, --compute-time, --depth, --au-threshold, --runs, --max-accelerators and "
                     "--drop-page-cache apply to --accelerators only")
    if args.batch_size is None:
        args.batch_size = 64


def _check_cache_arguments(parser, args) -> None:
    if args.cache_dir is None:
        if args.cache_limit is not None or args.cache_prefetch or args.cache_remote_paths:
            parser.error("--cache-limit, --cache-prefetch and --cache-remote-paths need --cache-dir")
        return
    if args.compare is not None and not args.compare_transport:
        parser.error("--cache-dir with --compare measures the cache over --compare-transport copies: give one")
    if args.cache_limit is not None:
        from imagenet_shards.shard_cache import CacheError, parse_size  # light: no torch

        try:
            parse_size(args.cache_limit)
        except CacheError as error:
            parser.error(f"--{error}")


def one_line(error, plain=()) -> str:
    """The message of an error on one line, without the traceback text a DataLoader worker's error
    carries; prefixed with its type unless it is one of `plain` (whose messages say it all)."""
    text = str(error).strip()
    if "Original Traceback" in text:  # re-raised from a DataLoader worker: its last line is the error
        text = text.splitlines()[-1].strip()
    kind = "" if isinstance(error, plain) else f"{type(error).__name__}: "
    return kind + (text.splitlines()[0] if text else type(error).__name__)


def main(argv=None):
    args = parse_args(argv)
    if args.accelerators is not None:
        from imagenet_shards.cli.emulation_args import check_emulation  # light: no torch
        from imagenet_shards.errors import UsageError

        try:
            check_emulation(args)
        except UsageError as error:
            print(f"host_benchmark: {error}", file=sys.stderr)
            return 2
    apply_s3_arguments(args)
    # A warning (e.g. "read by scanning its tar headers") is one line, not the line of source that warned.
    warnings.formatwarning = lambda message, category, *_, **__: f"host_benchmark: warning: {message}\n"
    # Imported after parsing so that --help and argument errors are instant (torch is slow to import).
    from imagenet_shards.hostbench.timing import BenchmarkError

    if args.recommend:  # a saved report: nothing measured, no torch
        from imagenet_shards.hostbench.decision import recommend_from_saved

        try:
            recommend_from_saved(args)
        except (BenchmarkError, OSError) as error:
            print(f"host_benchmark: {one_line(error, (BenchmarkError, OSError))}", file=sys.stderr)
            return 1
        return 0
    from imagenet_shards.storage import StorageUnavailable

    plain = (BenchmarkError, DatasetError, OSError, ValueError, StorageUnavailable)  # their messages say it all
    if args.compare is not None:
        # Before torch is imported: a folder without a dataset (or without a --formats) is a wrong path,
        # a --compare-transport that is not a copy of a compared dataset is bad data; either, at once.
        from imagenet_shards.hostbench.discovery import NothingToCompare, compared_sources  # light: no torch
        from imagenet_shards.hostbench.transports import remote_copies  # light: no torch

        try:
            args.found_sources = compared_sources(args.compare, args.formats)
            args.found_copies = remote_copies(args.compare_transport or [], args.found_sources)
        except NothingToCompare as error:
            print(f"host_benchmark: {error}", file=sys.stderr)
            return 2
        except Exception as error:
            print(f"host_benchmark: {one_line(error, plain)}", file=sys.stderr)
            return 1
    from imagenet_shards.hostbench.run import CannotStart, run_host_benchmark

    def warn(text):
        print(f"host_benchmark: warning: {text}", file=sys.stderr)

    try:
        failed = run_host_benchmark(args, warn)
    except CannotStart as error:
        print(f"host_benchmark: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("host_benchmark: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # bad data (a garbage tar, a failed split, ...): one line, never a traceback
        print(f"host_benchmark: {one_line(error, plain)}", file=sys.stderr)
        return 1
    if failed:
        print(f"host_benchmark: {len(failed)} row(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
