"""Is a dataset intact, and if not, which file and which sample is wrong? The one entry: `validate`.

`validate(path, ...)` looks at the folder and hands it to the check for its kind:
  - a converted dataset (`metadata.json` of this project): imagenet_shards.validate.converted, which
    also checks its repartitions (imagenet_shards.validate.repartition_checks);
  - a dataset made by the reference harness (its metadata.json has no "splits"):
    `validate_reference`, by imagenet_shards.reference.checks (folder checksum, every shard walked;
    `adopt` then indexes it);
  - a raw image folder (`train/`, `validation/`): imagenet_shards.validate.raw;
  - shards without metadata.json: an unfinished conversion, reported as such.
A path that is none of these, or cannot be read, is a ValidationUsageError (exit code 2).
A dataset on S3 is checked by imagenet_shards.validate.remote.

Functional core: checks return `Problem` records and nothing here prints; validate_dataset.py
renders the `Report` (imagenet_shards.validate.report).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from imagenet_shards import reference
from imagenet_shards.reference import checks as reference_checks
from imagenet_shards.formats import is_any_shard_file
from imagenet_shards.formats.shard_check import Problem, error
from imagenet_shards.index import SAMPLE_INDEX_SUFFIX
from imagenet_shards.dataset_folder import METADATA_FILE
from imagenet_shards.dataset_folder import find_split_folder
from imagenet_shards.validate import raw_checksum
from imagenet_shards.validate.converted import TOOL_FOLDERS, validate_converted
from imagenet_shards.validate.raw import validate_raw
from imagenet_shards.validate.report import Report, ValidationUsageError, sorted_problems


def validate_reference(root, deep=False, adopt=False, progress=None) -> Report:
    """A dataset made by the reference harness (imagenet_shards.reference.checks.check_dataset): its folder
    checksum, every shard walked; with `adopt`, once intact, this project's indexes and metadata written."""
    started = time.perf_counter()
    report = Report(str(root), "converted")
    problems, report.notes, stats = reference_checks.check_dataset(root, deep, adopt, progress)
    report.problems = sorted_problems([Problem(*p) for p in problems])
    report.verdicts["Dataset"] = report.ok
    seconds = time.perf_counter() - started
    report.stats = dict(stats, seconds=round(seconds, 3),
                        mb_per_s=round(stats["bytes_checked"] / seconds / 1e6, 1) if seconds > 0 else None)
    return report


def validate(path, workers=1, deep=False, write_manifest=False, progress=None, adopt=False) -> Report:
    """Validate a converted dataset or a raw image folder; ValidationUsageError if it is neither.

    `progress(total_bytes, description)` may return a tqdm-like object (update(n), close()).
    `adopt`: a dataset made by the reference harness is, once found intact, adopted
    (imagenet_shards.reference.layout.adopt); for any other dataset it is a usage error.
    """
    root = Path(path)
    if not root.exists():
        raise ValidationUsageError(f"{root}: no such file or directory")
    if not root.is_dir():
        raise ValidationUsageError(f"{root}: not a directory")
    try:
        with os.scandir(root) as entries:
            next(entries, None)
    except OSError as exc:
        raise ValidationUsageError(f"{root}: cannot read: {exc.strerror or exc}") from None
    if workers < 1:
        raise ValidationUsageError(f"--workers must be at least 1, got {workers}")
    if (root / METADATA_FILE).exists():
        if write_manifest:
            raise ValidationUsageError(f"{root}: --write-manifest is for raw image folders; a converted dataset is "
                                       f"checked against its {METADATA_FILE}")
        if reference.read_reference_metadata(root) is not None:
            return validate_reference(root, deep, adopt, progress)
        if adopt:
            raise ValidationUsageError(f"{root}: --adopt is for datasets made by the reference harness; this one "
                                       f"already has this project's {METADATA_FILE}")
        return validate_converted(root, workers, deep, progress)
    if adopt:
        raise ValidationUsageError(f"{root}: --adopt needs a dataset made by the reference harness "
                                   f"(shards and its {METADATA_FILE})")
    if any(find_split_folder(root, split) for split in raw_checksum.RAW_SPLITS):
        return validate_raw(root, workers, deep, write_manifest, progress)
    leftovers = sorted(p.name for p in root.iterdir() if p.name in TOOL_FOLDERS or is_any_shard_file(p.name)
                       or p.name.endswith(SAMPLE_INDEX_SUFFIX))
    if leftovers:  # shards without metadata.json: a conversion that did not finish, or lost its metadata
        report = Report(str(root), "converted")
        report.problems.append(error(METADATA_FILE, f"missing, but the folder holds converter output "
                                                    f"({', '.join(leftovers[:3])}{', ...' if len(leftovers) > 3 else ''}): "
                                                    f"the conversion did not finish (metadata.json is written last) "
                                                    f"or it was deleted; create_webdataset.py --resume finishes or "
                                                    f"repairs it"))
        report.verdicts["Dataset"] = False
        return report
    raise ValidationUsageError(f"{root}: neither a converted dataset (no {METADATA_FILE}) nor a raw image folder "
                               f"(no train/ or validation/ folder)")
