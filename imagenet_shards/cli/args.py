"""Argument types and defaults shared by the command-line scripts.

argparse turns an ArgumentTypeError into "argument --x: <message>" and exit code 2,
so every script reports a bad number the same way.
"""

import argparse
import os


def _number(text, kind, what):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def int_between(low: int, high=None):
    def parse(text):
        value = _number(text, int, "an integer")
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is above {high}")
        return value

    parse.__name__ = f"integer in {low}..{high}" if high is not None else f"integer >= {low}"
    return parse


positive_int = int_between(1)
non_negative_int = int_between(0)


def positive_float(text):
    value = _number(text, float, "a number")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def usable_cpus() -> int:
    """CPUs this process may run on (a cgroup or taskset may allow fewer than the machine has)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def add_s3_arguments(parser) -> None:
    """--s3-endpoint, --s3-retries and --read-timeout, for every command that reads or writes s3:// locations."""
    parser.add_argument("--s3-endpoint", metavar="URL", default=None,
                        help="S3-compatible endpoint (MinIO, Ceph, SeaweedFS ...), path-style addressing. Default: "
                             "AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, then S3_ENDPOINT_URL, then AWS. Credentials, "
                             "profile and region come from boto3's usual chain (AWS_ACCESS_KEY_ID ...)")
    parser.add_argument("--s3-retries", type=non_negative_int, default=None, metavar="N",
                        help="retries per S3 request (botocore standard mode: 5xx, SlowDown, connection errors) "
                             "and resumes of a broken read without progress (default 5)")
    parser.add_argument("--read-timeout", type=float, default=None, metavar="SECONDS",
                        help="seconds an S3 or http(s) read waits for bytes before it fails and is retried "
                             "(default 60; DATASETS_READ_TIMEOUT)")


def apply_s3_arguments(args) -> None:
    """Make --s3-endpoint/--s3-retries/--read-timeout this process's (and its children's) S3 settings."""
    from imagenet_shards.storage import configure_s3

    configure_s3(endpoint=getattr(args, "s3_endpoint", None), retries=getattr(args, "s3_retries", None),
                 read_timeout=getattr(args, "read_timeout", None))
