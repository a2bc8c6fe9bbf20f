"""The checks of a raw image folder (`train/<class>/*`, `validation/<class>/*`).

`validate_raw(root, workers, deep, write_manifest, progress)` returns a `Report`
(imagenet_shards.validate.report): the reference harness's checksum and counts against the published
ImageNet values, and, when the folder has a manifest (`write_manifest=True` records one), every
file against it. See imagenet_shards.validate.raw_checksum (the manifest) and
imagenet_shards.reference.checksum (the checksum). How a folder that is not ImageNet is reported:
  - no manifest: the folder is taken to be ImageNet, as in the reference harness; any
    difference from the published checksum and counts is corruption (exit code 1), and
    the report suggests `--write-manifest` for a dataset of one's own;
  - a manifest: it is the reference; added, missing and changed files are corruption,
    and the ImageNet comparison is only informational (report notes).
Files are hashed (and with `deep` decoded) in batches over `workers` processes. A manifest that
cannot be written is a ValidationUsageError.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from imagenet_shards.dataset_folder import find_split_folder, split_of_folder
from imagenet_shards.formats.shard_check import ERROR, decode_problem, error, warning
from imagenet_shards.reference.checksum import IMAGENET, list_files, md5_sha256_of_file, reference_checksum
from imagenet_shards.validate import raw_checksum
from imagenet_shards.validate.report import Report, ValidationUsageError, sorted_problems

RAW_TASK_BYTES = 64 << 20  # raw mode: files per worker task, by total size
RAW_TASK_FILES = 256


def _hash_raw_files(job):
    """Worker: hash (and with deep, decode) a batch of raw files. job = (root, [relative paths], want_sha, deep)."""
    root, paths, want_sha256, deep = job
    out = []
    for relative in paths:
        path = os.path.join(root, relative)
        try:
            md5, sha, size = md5_sha256_of_file(path, want_sha256)
        except OSError as exc:
            out.append((relative, None, None, None, f"cannot read: {exc.strerror or exc}"))
            continue
        why = None
        if deep:
            try:
                with open(path, "rb") as handle:
                    why = decode_problem("JPEG", handle.read(), require_rgb_jpeg=False)
            except OSError as exc:
                why = f"cannot read: {exc.strerror or exc}"
        out.append((relative, size, md5, sha, why))
    return out


def _raw_batches(root, files, want_sha256, deep):
    batch, batch_bytes = [], 0
    for relative, size in files:
        batch.append(relative)
        batch_bytes += size
        if len(batch) >= RAW_TASK_FILES or batch_bytes >= RAW_TASK_BYTES:
            yield (str(root), batch, want_sha256, deep), batch_bytes
            batch, batch_bytes = [], 0
    if batch:
        yield (str(root), batch, want_sha256, deep), batch_bytes


def _run_raw_jobs(root, files, want_sha256, deep, workers, progress):
    jobs = list(_raw_batches(root, files, want_sha256, deep))
    bar = progress(sum(size for _, size in files), "files") if progress else None
    try:
        if workers <= 1 or len(jobs) <= 1:
            for job, size in jobs:
                yield from _hash_raw_files(job)
                if bar is not None:
                    bar.update(size)
        else:
            import multiprocessing

            with multiprocessing.Pool(min(workers, len(jobs))) as pool:
                for batch in pool.imap_unordered(_hash_raw_files, [job for job, _ in jobs]):
                    yield from batch
                    if bar is not None:
                        bar.update(sum(item[1] or 0 for item in batch))
    finally:
        if bar is not None:
            bar.close()


def _raw_split_of(path):
    """The split a root-relative path of a raw folder belongs to (val/ is validation), or None."""
    top = path.split("/", 1)[0]
    return split_of_folder(top)


def _split_label(split):
    return {"train": "Train data", "validation": "Validation data"}.get(split, f"{split.capitalize()} data")


@dataclass
class _RawListing:
    """What listing the split folders found: the files to hash, each one's split, per split the files that
    cannot be read (hashed as empty, as checksumdir does), and per split its folder, class and image counts."""

    files: list = field(default_factory=list)  # (path relative to root, size)
    split_of: dict = field(default_factory=dict)
    broken_by_split: dict = field(default_factory=lambda: defaultdict(list))
    layout: dict = field(default_factory=dict)


def validate_raw(root, workers=1, deep=False, write_manifest=False, progress=None) -> Report:
    """Check train/ and validation/ folders: the reference checksum, counts, and the manifest if any."""
    root = Path(root)
    started = time.perf_counter()
    report = Report(str(root), "raw")
    problems = report.problems
    manifest_path = root / raw_checksum.MANIFEST_FILE
    recorded = _read_recorded_manifest(manifest_path, write_manifest, problems)
    have_manifest = recorded is not None and not write_manifest
    folders = {split: find_split_folder(root, split) for split in raw_checksum.RAW_SPLITS}
    listing = _list_split_folders(folders, problems)
    hashed = _hash_listed_files(root, listing, recorded is not None or write_manifest, deep, workers, progress,
                                problems)
    imagenet_findings = _imagenet_findings(folders, listing, hashed, recorded, write_manifest)

    current = {path: raw_checksum.ManifestEntry(path, size, sha) for path, (size, _, sha) in hashed.items()}
    if write_manifest:
        _write_manifest(report, manifest_path, recorded, current)
    elif have_manifest:
        for path, kind, text in raw_checksum.compare_with_manifest(recorded, current):
            problems.append(error(path, text))
    _report_imagenet_findings(report, imagenet_findings, recorded, have_manifest, write_manifest)

    report.problems = sorted_problems(problems)
    _raw_verdicts(report, folders, recorded, have_manifest, write_manifest)
    seconds = time.perf_counter() - started
    total = sum(size for size, _, _ in hashed.values())
    report.stats = {
        "splits": listing.layout,
        "files_checked": len(hashed),
        "bytes_checked": total,
        "manifest": str(manifest_path) if (have_manifest or write_manifest) else None,
        "workers": workers,
        "deep": deep,
        "seconds": round(seconds, 3),
        "mb_per_s": round(total / seconds / 1e6, 1) if seconds > 0 else None,
    }
    return report


def _read_recorded_manifest(manifest_path, write_manifest, problems):
    """The folder's manifest entries, or None when it has none (or an unreadable one, named as a problem
    unless it is about to be replaced)."""
    recorded = None
    if manifest_path.exists():
        try:
            recorded = raw_checksum.read_manifest(manifest_path)
        except raw_checksum.ManifestError as exc:
            if not write_manifest:
                problems.append(error(raw_checksum.MANIFEST_FILE, str(exc).removeprefix(f"{manifest_path}: ")))
    return recorded


def _list_split_folders(folders, problems) -> _RawListing:
    """List every split folder's files: unlistable folders and dangling links are errors, files outside a
    class folder and empty class folders warnings."""
    listing = _RawListing()
    files, split_of, broken_by_split, layout = listing.files, listing.split_of, listing.broken_by_split, listing.layout
    for split, folder in folders.items():
        if folder is None:
            continue
        listed, broken, unreadable = list_files(folder)
        for relative, reason in unreadable:
            problems.append(error(f"{folder.name}/{relative}", f"cannot list the folder: {reason}"))
        for relative, reason in broken:
            path = f"{folder.name}/{relative}"
            broken_by_split[split].append(path)
            problems.append(error(path, f"cannot read: {reason} (a dangling link?)"))
        class_folders = set()
        images = 0
        for relative, size in listed:
            path = f"{folder.name}/{relative}"
            files.append((path, size))
            split_of[path] = split
            parts = relative.split(os.sep)
            if len(parts) == 1:
                problems.append(warning(path, "file outside any class folder (ImageFolder ignores it; it still "
                                              "changes the reference checksum)"))
            else:
                class_folders.add(parts[0])
                images += 1
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.is_dir() and entry.name not in class_folders:
                problems.append(warning(f"{folder.name}/{entry.name}", "class folder holds no files"))
        all_classes = {e.name for e in os.scandir(folder) if e.is_dir()}
        layout[split] = {"folder": folder.name, "classes": len(all_classes), "images": images, "files": len(listed)}
    return listing


def _hash_listed_files(root, listing, want_sha256, deep, workers, progress, problems) -> dict:
    """{path: (size, md5, sha256)} of every listed file that could be read; the rest, and (with `deep`)
    the images that do not decode, are errors."""
    hashed = {}
    for relative, size, md5, sha, why in _run_raw_jobs(root, listing.files, want_sha256, deep, workers, progress):
        if size is None:
            problems.append(error(relative, why))
            listing.broken_by_split[listing.split_of[relative]].append(relative)
            continue
        hashed[relative] = (size, md5, sha)
        if why:
            problems.append(error(relative, why))
    return hashed


def _imagenet_findings(folders, listing, hashed, recorded, write_manifest) -> list:
    """[(split folder, text)]: how each split differs from the published ImageNet checksum and counts
    (each split's reference checksum is recorded in the listing's layout)."""
    files, split_of, broken_by_split, layout = listing.files, listing.split_of, listing.broken_by_split, listing.layout
    imagenet_findings = []  # (split folder, text)
    for split, folder in folders.items():
        expected = IMAGENET[split]
        if folder is None:
            if recorded is None or write_manifest:
                imagenet_findings.append((f"{split}/", f"folder missing: the standard layout has {split}/ with "
                                                       f"{expected.images:,} images"))
            continue
        md5s = [hashed[path][1] for path, _ in files if split_of.get(path) == split and path in hashed]
        # checksumdir hashes a file it cannot read as empty; so does this, to stay comparable
        md5s += [hashlib.md5().hexdigest()] * len(broken_by_split[split])
        checksum = reference_checksum(md5s)
        layout[split]["reference_checksum"] = checksum
        layout[split]["imagenet_checksum_matches"] = checksum == expected.checksum
        where = f"{folder.name}/"
        if checksum != expected.checksum:
            imagenet_findings.append((where, f"checksum {checksum} differs from the standard ImageNet layout "
                                             f"({expected.checksum})"))
        for what, have, want in (("images", layout[split]["images"], expected.images),
                                 ("classes", layout[split]["classes"], expected.classes)):
            if have != want:
                imagenet_findings.append((where, f"{have:,} {what}, the standard ImageNet {split} split has {want:,}"))
    return imagenet_findings


def _write_manifest(report, manifest_path, recorded, current):
    """Record `current` as the folder's manifest; what changed since a previous one is a warning."""
    if recorded is not None:
        for path, kind, text in raw_checksum.compare_with_manifest(recorded, current):
            report.problems.append(warning(path, f"{text} (the previous manifest is replaced)"))
    try:
        raw_checksum.write_manifest(manifest_path, current.values())
    except (OSError, raw_checksum.ManifestError) as exc:
        raise ValidationUsageError(f"{manifest_path}: cannot write the manifest: {exc}") from None
    report.notes.append(f"manifest written: {manifest_path} ({len(current):,} files, "
                        f"{sum(e.size for e in current.values()):,} bytes)")


def _report_imagenet_findings(report, imagenet_findings, recorded, have_manifest, write_manifest):
    """With a manifest the ImageNet comparison is a note; without one the folder is taken to be ImageNet
    and every difference is an error."""
    if have_manifest or write_manifest:
        by_folder = defaultdict(list)
        for where, text in imagenet_findings:
            by_folder[where].append(text)
        for where, texts in by_folder.items():
            report.notes.append(f"{where} not the standard ImageNet layout ({'; '.join(texts)}); informational: "
                                f"this folder is checked against its {raw_checksum.MANIFEST_FILE}")
        if have_manifest:
            report.notes.append(f"checked against {raw_checksum.MANIFEST_FILE} ({len(recorded):,} files recorded)")
    else:
        for where, text in imagenet_findings:
            report.problems.append(error(where, text))
        if imagenet_findings:
            report.notes.append(f"not ImageNet but your own dataset? Record it once with --write-manifest; later runs "
                                f"check every file against {raw_checksum.MANIFEST_FILE} and name what was added, "
                                f"removed or changed")


def _raw_verdicts(report, folders, recorded, have_manifest, write_manifest):
    """One verdict per split shown (its errors), and `Manifest` when an error belongs to no split."""
    if have_manifest or write_manifest:  # the splits that exist, or that the manifest says should
        shown = {s for s, f in folders.items() if f is not None}
        shown |= {_raw_split_of(path) for path in (recorded or {}) if not write_manifest}
    else:  # taken to be ImageNet: both splits are expected
        shown = set(raw_checksum.RAW_SPLITS)
    for split in raw_checksum.RAW_SPLITS:
        if split in shown:
            report.verdicts[_split_label(split)] = not any(
                p.severity == ERROR and _raw_split_of(p.file) == split for p in report.problems)
    if any(p.severity == ERROR and _raw_split_of(p.file) is None for p in report.problems):
        report.verdicts["Manifest"] = False
