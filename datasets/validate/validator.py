"""Is a dataset intact, and if not, which file and which sample is wrong?

Two kinds of folder are checked (`validate`):

**Converted dataset** (`metadata.json` present, see datasets.index for the layout):
  - metadata.json itself: required keys, lengths that agree with the shard lists, a class table;
  - every shard against its ShardRecord: present, size, sha256, sample count;
  - the tar structure: header checksums, member names (no absolute paths, no `..`),
    complete samples (`.cls`, `.json` and exactly one payload per key), nothing after the
    end-of-archive marker;
  - every sample against the split's sample index: key, label, byte offsets, payload CRC32C;
  - labels inside the class table and equal to the class the sample's `.json` names;
  - keys unique within a split;
  - repartitions under `distributed/<N>-instances/` against their manifest.json: the union
    of the instances' samples is the split (minus the keys named as dropped), instances are
    disjoint (except for the keys named as padding), counts follow the policy, remainder
    shards hold byte-identical copies;
  - files nobody lists are warnings (a loader never reads them), never corruption;
  - metadata.json's reference `checksum` (checksumdir's md5 dirhash, from the md5s metadata.json records for
    the shards and indexes that verified): a mismatch is a warning naming the likely cause (a
    .convert-state/ a crash left, files added), as the reference validate_dataset.py would say corrupted;
  - with `deep`, every image is decoded (PIL verify + load) and every tensor parsed.

**Raw image folder** (`train/<class>/*`, `validation/<class>/*`): the reference harness's
checksum and counts against the published ImageNet values, and, when the folder has a
manifest (`write_manifest=True` records one), every file against it. See
datasets.validate.raw_checksum. How a folder that is not ImageNet is reported:
  - no manifest: the folder is taken to be ImageNet, as in the reference harness; any
    difference from the published checksum and counts is corruption (exit code 1), and
    the report suggests `--write-manifest` for a dataset of one's own;
  - a manifest: it is the reference; added, missing and changed files are corruption,
    and the ImageNet comparison is only informational (report notes).

At file-hashing speed. A shard is first hashed alone (one sequential read, at sha256's speed:
what `openssl dgst -sha256` does). When its size and sha256 match metadata.json it is
byte-identical to what the converter wrote, indexed and published, so walking its headers again
would prove nothing: only the index's own account of it is checked (sample count, byte ranges,
labels within the class table; a TFRecord shard's .tfindex). When the size or sha256 differs, the
shard is walked (mapped, page cache) to name the damage: header checksums, structure, every sample
against the index, every payload's CRC32C (sha256 for an index of the earlier version), every
json. Remainder shards of repartitions (small: about one shard per instance) and, with `deep`,
all shards are always walked, `deep` also decoding every payload. Consequence: with the default
check, contents that match a resealed metadata.json (an edited shard whose new sha256 was written
into metadata.json) are trusted; `deep` reads them.
What this costs is measured by benchmarks/validate_benchmark.py (docs/design-figures.md).

Functional core: checks return `Problem` records and nothing here prints;
validate_dataset.py renders a `Report`. The per-format shard check is chosen in one place,
the registry (`datasets.formats.get_format(name).check_shard`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from datasets import metadata_digest, reference
from datasets.reference import checks as reference_checks
from datasets.fileio import PARTIAL_SUFFIX, hash_file, sha256_bytes
from datasets.layout import CONVERT_STATE_DIR, DISTRIBUTED_DIR, REPARTITION_MANIFEST, find_split_folder, split_of_folder
from datasets.formats import UnknownFormatError, get_format, is_any_shard_file, payload_extension_of
from datasets.formats.shard_check import (
    ERROR,
    WARNING,
    NOT_IN_INDEX,
    Problem,
    ShardResult,
    ShardTask,
    decode_problem,
    error,
    warning,
)
from datasets.index import (
    SAMPLE_INDEX_SUFFIX,
    METADATA_FILE,
    DatasetError,
    ShardRecord,
    parse_metadata,
)
from datasets.sample_columns import KeyTable, SampleColumns, ShardGroups, columns_from_records, parse_sample_columns
from datasets.validate import raw_checksum

# Folders the tools keep in a dataset, never read by a loader: not extra files.
TOOL_FOLDERS = {CONVERT_STATE_DIR}  # create_webdataset.py's resume records
RAW_TASK_BYTES = 64 << 20  # raw mode: files per worker task, by total size
RAW_TASK_FILES = 256



class ValidationUsageError(Exception):
    """The path cannot be validated at all (missing, unreadable, not a dataset): exit code 2."""


@dataclass
class Report:
    path: str
    mode: str  # "converted" or "raw"
    verdicts: dict = field(default_factory=dict)  # label ("Dataset", "Train data", ...) -> ok
    problems: list = field(default_factory=list)
    notes: list = field(default_factory=list)  # informational lines, no effect on the verdict
    stats: dict = field(default_factory=dict)

    @property
    def errors(self):
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self):
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def verdict_lines(self):
        """The reference harness's lines: `Dataset OK.` / `Dataset is corrupted.`, `Train data OK.` ..."""
        return [f"{label} OK." if ok else f"{label} is corrupted." for label, ok in self.verdicts.items()]

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "mode": self.mode,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "verdicts": self.verdict_lines(),
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "problems": [p.to_json() for p in self.problems],
            "notes": list(self.notes),
            "stats": dict(self.stats),
        }


def _sorted_problems(problems):
    # Errors first, grouped by file; within a file the order they were found in (a shard's own
    # problems, then its samples in shard order), which sorted() keeps as it is stable.
    return sorted(problems, key=lambda p: (p.severity != ERROR, p.file))


def label_offset_of(metadata) -> int:
    """metadata.json's label_offset (shards that store label + 1, as TF-slim's); 0 when absent."""
    value = metadata.get("label_offset", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def run_shard_task(task: ShardTask) -> ShardResult:
    return get_format(task.format).check_shard(task)


# ================================================================================ converted datasets


@dataclass
class _SplitState:
    name: str
    shards: list  # ShardRecords (metadata's, in order)
    columns: SampleColumns  # the index (no rows when it could not be read)
    index_ok: bool
    groups: ShardGroups = None  # the index's records per shard, in index order, built when asked for
    _table: KeyTable = None

    def __post_init__(self):
        self.groups = ShardGroups(self.columns, by_offset=False)

    @property
    def table(self) -> KeyTable:
        """The rows of the index by key (made once, when a repartition check first needs it)."""
        if self._table is None:
            self._table = KeyTable(self.columns)
        return self._table


def _no_index(split, shards) -> _SplitState:
    return _SplitState(split, shards, columns_from_records([]), False)


def _read_index(path: Path, name: str) -> SampleColumns:
    """The index at `path` as columns (with an earlier version's sha256s); errors name it by `name`."""
    with open(path, "rb") as stream:
        return parse_sample_columns(stream, name, hashes=True)


def _check_metadata(metadata, problems):
    """Consistency of metadata.json itself; returns {split: [ShardRecord]} of the usable splits."""
    meta = METADATA_FILE
    classes = metadata.get("classes")
    if not isinstance(classes, list) or not classes or not all(isinstance(c, str) for c in classes):
        problems.append(error(meta, "the class table ('classes') is missing, empty or not a list of names"))
    else:
        repeated = sorted(name for name, n in Counter(classes).items() if n > 1)
        if repeated:
            problems.append(error(meta, f"class names appear twice in the class table: {', '.join(repeated[:5])}"))
    splits = metadata.get("splits")
    if not isinstance(splits, dict) or not splits:
        problems.append(error(meta, "'splits' is missing or empty"))
        return {}
    usable = {}
    all_names = Counter()
    for split, entry in splits.items():
        if not isinstance(entry, dict):
            problems.append(error(meta, f"split {split!r}: its entry is not an object"))
            continue
        try:
            shards = [ShardRecord.from_json(s) for s in entry.get("shards", [])]
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(error(meta, f"split {split!r}: malformed shard list ({type(exc).__name__}: {exc})"))
            continue
        if not shards:
            problems.append(error(meta, f"split {split!r} lists no shards"))
        for shard in shards:
            all_names[shard.name] += 1
            if shard.name.startswith("/") or ".." in shard.name.split("/") or "/" in shard.name:
                problems.append(error(meta, f"split {split!r}: shard name {shard.name!r} is not a plain file name"))
            if (shard.samples < 0 or shard.bytes < 0 or not re.fullmatch(r"[0-9a-f]{64}", shard.sha256)
                    or not re.fullmatch(r"(?:[0-9a-f]{32})?", shard.md5)):
                problems.append(error(meta, f"split {split!r}: the record of {shard.name} is malformed: {shard}"))
        total = sum(shard.samples for shard in shards)
        length = entry.get("length")
        if length is not None and length != total:
            problems.append(error(meta, f"split {split!r}: length {length!r}, its shards hold {total:,} samples"))
        top = metadata.get(f"{split}_length")
        if top is not None and top != total:
            problems.append(error(meta, f"{split}_length is {top!r}, the {split} shards hold {total:,} samples"))
        skipped = entry.get("skipped") or []
        source_samples = entry.get("source_samples")
        if source_samples is not None and source_samples != total + len(skipped):
            problems.append(error(meta, f"split {split!r}: {source_samples!r} source samples, but "
                                        f"{total:,} written + {len(skipped):,} skipped = {total + len(skipped):,}"))
        for item in skipped:
            if isinstance(item, dict):
                problems.append(warning(meta, f"{split}: source image skipped at conversion: "
                                              f"{item.get('path')}: {item.get('reason')}"))
        usable[split] = shards
    for shard_name, count in all_names.items():
        if count > 1:
            problems.append(error(meta, f"shard {shard_name} is listed {count} times"))
    return usable


def _load_split_index(root, split, entry, shards, problems) -> _SplitState:
    info = entry.get("index") if isinstance(entry, dict) else None
    if not isinstance(info, dict) or "name" not in info:
        problems.append(error(METADATA_FILE, f"split {split!r} names no sample index: samples cannot be checked one by one"))
        return _no_index(split, shards)
    name = str(info["name"])
    try:
        (sha256,), size = hash_file(Path(root) / name)  # streamed: the index is read as columns below
        columns = _read_index(Path(root) / name, name)
    except OSError as exc:
        problems.append(error(name, f"cannot read the sample index: {exc.strerror or exc}"))
        return _no_index(split, shards)
    except DatasetError as exc:
        columns = None
        failure = exc
    if "bytes" in info and size != info["bytes"]:
        problems.append(error(name, f"size {size:,} bytes, metadata says {info['bytes']:,}"))
    if "sha256" in info and sha256 != info["sha256"]:
        problems.append(error(name, "sha256 differs from metadata (the index changed since conversion)"))
    if columns is None:
        problems.append(error(name, str(failure).removeprefix(f"{name}: ")))
        return _no_index(split, shards)
    for key, n in columns.duplicate_keys().items():
        problems.append(error(name, f"duplicated key: listed {n} times in the index", key))
    shard_names = {shard.name for shard in shards}
    unknown = [number for number, shard in enumerate(columns.shard_names) if shard not in shard_names]
    for row in np.flatnonzero(np.isin(columns.shard_ids, unknown)).tolist() if unknown else ():
        problems.append(error(name, f"placed in {columns.shard(row)!r}, which metadata does not list for {split}",
                              columns.key(row)))
    state = _SplitState(split, shards, columns, True)
    for shard in shards:
        if state.groups.count(shard.name) != shard.samples:
            problems.append(error(name, f"lists {state.groups.count(shard.name)} samples in {shard.name}, metadata "
                                        f"says {shard.samples}"))
    return state


def _missing_shard_problem(name, shard: ShardRecord, records):
    keys = [r.key for r in records]
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    lost = f"; its samples are lost: {shown}" if keys else ""
    return error(name, f"missing shard: listed in metadata with {shard.samples:,} samples{lost}")


def _ready(item) -> ShardTask:
    """A task with its shard's records: (task, None) is ready; (task without them, ShardGroups) gets them now,
    just before it runs (the pool's feeder takes tasks as workers free up: never all shards' records at once)."""
    task, groups = item
    return task if groups is None else dataclasses.replace(task, samples=tuple(groups[task.name]))


def _run_tasks(items, workers, progress, description):
    """Run shard tasks ((task, groups) as `_ready` takes them) over `workers` processes, largest first;
    yields results as they finish."""
    items = sorted(items, key=lambda item: -(item[0].record.bytes if item[0].record else 0))
    tasks = [task for task, _ in items]
    total = sum(_task_bytes(t) for t in tasks)
    bar = progress(total, description) if progress else None
    try:
        if workers <= 1 or len(tasks) <= 1:
            for item in items:
                result = run_shard_task(_ready(item))
                if bar is not None:
                    bar.update(_task_bytes(item[0]))
                yield result
        else:
            import multiprocessing

            with multiprocessing.Pool(min(workers, len(tasks))) as pool:
                for result in pool.imap_unordered(run_shard_task, map(_ready, items)):
                    if bar is not None:
                        bar.update(result.bytes_read or 0)
                    yield result
    finally:
        if bar is not None:
            bar.close()


def _task_bytes(task):
    try:
        return os.stat(task.path).st_size
    except OSError:
        return 0


def check_metadata_digest(metadata_bytes, problems, notes):
    """metadata.json against its own digest (datasets.metadata_digest): edited is an error, absent a note."""
    try:
        metadata = json.loads(metadata_bytes)
    except ValueError:
        return  # parse_metadata names it
    status, message = metadata_digest.digest_status(metadata)
    if status == metadata_digest.ABSENT:
        notes.append(message)
    elif status != metadata_digest.OK:
        problems.append(error(METADATA_FILE, message))


def validate_converted(root, workers=1, deep=False, progress=None) -> Report:
    root = Path(root)
    started = time.perf_counter()
    report = Report(str(root), "converted")
    problems = report.problems
    try:
        metadata_bytes = (root / METADATA_FILE).read_bytes()
    except OSError as exc:
        raise ValidationUsageError(f"{root / METADATA_FILE}: cannot read: {exc.strerror or exc}") from None
    check_metadata_digest(metadata_bytes, problems, report.notes)
    try:
        metadata = parse_metadata(metadata_bytes, METADATA_FILE)
    except DatasetError as exc:
        problems.append(error(METADATA_FILE, str(exc).removeprefix(f"{METADATA_FILE}: ")))
        report.verdicts["Dataset"] = False
        report.stats = {"seconds": round(time.perf_counter() - started, 3)}
        return report
    metadata_sha256, fmt = sha256_bytes(metadata_bytes), metadata.get("format")
    try:
        get_format(fmt)  # an unknown format is named here, before any shard is checked
    except UnknownFormatError as exc:
        problems.append(error(METADATA_FILE, str(exc)))
        report.verdicts["Dataset"] = False
        return report
    payload_ext = payload_extension_of(metadata)
    classes = tuple(metadata["classes"]) if isinstance(metadata.get("classes"), list) else ()  # else named below
    layout = metadata.get("tensor_layout")
    try:
        split_shards = _check_metadata(metadata, problems)
        states = {}
        for split, shards in split_shards.items():
            states[split] = _load_split_index(root, split, metadata["splits"][split], shards, problems)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a value of the wrong type
        problems.append(error(METADATA_FILE, f"malformed: {type(exc).__name__}: {exc}"))
        report.problems = _sorted_problems(problems)
        report.verdicts["Dataset"] = False
        return report

    tasks, expected_files = _shard_tasks(root, metadata, states, payload_ext, deep, problems)
    repartitions = _plan_repartition_checks(root, metadata, metadata_sha256, states, fmt, payload_ext,
                                            classes, deep, layout, problems)
    for plan in repartitions:
        tasks += [(task, None) for task in plan.tasks]

    results = {}
    for result in _run_tasks(tasks, workers, progress, "shards"):
        result.keys = _KeyList(result.keys)  # ~30 bytes a key, not a str object each
        results[result.name] = result
    _explain_foreign_samples(states, results)
    for result in results.values():
        problems.extend(result.problems)

    _cross_shard_checks(states, results, problems)
    for plan in repartitions:
        try:
            _check_repartition(root, plan, states, problems)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a value of the wrong type
            problems.append(error(f"{plan.folder}/{REPARTITION_MANIFEST}",
                                  f"malformed repartition manifest: {type(exc).__name__}: {exc}"))
    _check_extra_files(root, expected_files, repartitions, problems)
    reference_checks.check_folder_checksum(root, metadata, states, results, problems, report.notes)

    report.problems = _sorted_problems(problems)
    report.verdicts["Dataset"] = report.ok
    report.stats = _converted_stats(fmt, states, results, repartitions, workers, deep, time.perf_counter() - started)
    return report


def _shard_tasks(root, metadata, states, payload_ext, deep, problems):
    """(the shard checks to run as (task, ShardGroups) pairs, the files metadata.json accounts for); a
    missing shard is a problem, not a task."""
    fmt, classes, layout = metadata.get("format"), tuple(metadata.get("classes") or ()), metadata.get("tensor_layout")
    tasks, expected_files = [], {METADATA_FILE}
    for split, state in states.items():
        info = metadata["splits"][split].get("index")
        if isinstance(info, dict) and "name" in info:
            expected_files.add(str(info["name"]))
        for shard in state.shards:
            expected_files.add(shard.name)
            expected_files.update(get_format(fmt).companions(shard.name))
            path = Path(root) / shard.name
            if not path.is_file():
                problems.append(_missing_shard_problem(shard.name, shard, state.groups[shard.name]))
                continue
            tasks.append((ShardTask(str(path), shard.name, fmt, shard, (), payload_ext, classes, deep, deep, layout,
                                    split, label_offset_of(metadata)), state.groups))
    return tasks, expected_files


def _converted_stats(fmt, states, results, repartitions, workers, deep, seconds) -> dict:
    checked = sum(r.bytes_read for r in results.values())
    return {
        "format": fmt,
        "splits": {s: {"shards": len(st.shards), "samples": sum(x.samples for x in st.shards)} for s, st in states.items()},
        "shards_checked": len(results),
        "samples_checked": sum(len(r.keys) for r in results.values()),
        "bytes_checked": checked,
        "payloads_hashed": sum(r.payloads_hashed for r in results.values()),
        "payloads_decoded": sum(r.payloads_decoded for r in results.values()),
        "repartitions": [p.folder for p in repartitions],
        "workers": workers,
        "deep": deep,
        "seconds": round(seconds, 3),
        "mb_per_s": round(checked / seconds / 1e6, 1) if seconds > 0 else None,
    }


class _KeyList:
    """A checked shard's keys (ShardResult.keys, in shard order) as one utf-8 buffer and their hashes:
    ~30 bytes a key where a list of str takes ~70, for the cross-shard checks of a whole split."""

    def __init__(self, keys):
        encoded = [key.encode("utf-8", "surrogatepass") for key in keys]
        self.data = b"".join(encoded)
        self.offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(key) for key in encoded], out=self.offsets[1:])
        self.hashes = np.array([hash(key) for key in encoded], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.hashes)

    def __getitem__(self, i) -> str:
        return self.data[self.offsets[i]:self.offsets[i + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _explain_foreign_samples(states, results):
    """A sample the index places in another shard says which: shards swapped, renamed or mixed."""
    for state in states.values():
        affected = [results.get(shard.name) for shard in state.shards]
        affected = [r for r in affected if r is not None and any(p.problem == NOT_IN_INDEX for p in r.problems)]
        if not affected:
            continue
        wanted = {p.key for result in affected for p in result.problems if p.problem == NOT_IN_INDEX}
        home = {key: state.columns.shard(rows[-1]) for key, rows in state.columns.rows_with_keys(wanted).items()}
        for result in affected:
            result.problems = [
                error(p.file, f"sample belongs to {home[p.key]} according to the sample index (shards swapped, "
                              f"renamed or mixed?)", p.key)
                if p.problem == NOT_IN_INDEX and home.get(p.key, p.file) != p.file else p
                for p in result.problems
            ]


def _cross_shard_checks(states, results, problems):
    """Keys unique across the shards of a split; swapped or renamed shards named by their content."""
    by_sha = {}
    for state in states.values():
        for shard in state.shards:
            by_sha.setdefault(shard.sha256, []).append(shard.name)
    for state in states.values():
        checked = []
        for shard in state.shards:
            result = results.get(shard.name)
            if result is None:
                continue
            checked.append((shard.name, result.keys))
            if result.sha256 and result.sha256 != shard.sha256:
                others = [n for n in by_sha.get(result.sha256, []) if n != shard.name]
                if others:
                    problems.append(error(shard.name, f"its content is that of {', '.join(others)} in metadata: "
                                                      f"shards swapped, renamed or copied over one another"))
        for key, shards in _keys_in_several_shards(checked).items():
            if len(shards) > 1:
                for name in shards[1:]:
                    problems.append(error(name, f"duplicated key: the {state.name} split also has this key in {shards[0]}", key))


def _keys_in_several_shards(checked) -> dict:
    """{key: [shard names, in order]} of the keys found in more than one of `checked` ((name, _KeyList)),
    in order of first appearance: hashes first (numpy), then the few candidates' keys themselves."""
    if len(checked) < 2:
        return {}
    hashes = np.concatenate([keys.hashes for _, keys in checked])
    if not len(hashes):
        return {}
    owners = np.repeat(np.arange(len(checked)), [len(keys) for _, keys in checked])
    order = np.lexsort((owners, hashes))
    hashes, owners = hashes[order], owners[order]
    distinct = hashes[np.r_[True, (hashes[1:] != hashes[:-1]) | (owners[1:] != owners[:-1])]]
    candidates = np.unique(distinct[1:][distinct[1:] == distinct[:-1]])
    where = {}
    for name, keys in checked:
        hits = np.flatnonzero(np.isin(keys.hashes, candidates)).tolist() if len(candidates) else []
        for key in dict.fromkeys(keys[i] for i in hits):
            where.setdefault(key, []).append(name)
    return where


def _check_extra_files(root, expected, repartitions, problems):
    """Files nobody lists are warnings only: no loader reads them."""
    root = Path(root)
    repartition_folders = {p.folder for p in repartitions}
    for folder, dirs, names in os.walk(root):
        relative_folder = os.path.relpath(folder, root)
        if relative_folder == ".":
            relative_folder = ""
        if relative_folder in TOOL_FOLDERS:
            dirs[:] = []
            continue
        if relative_folder == DISTRIBUTED_DIR:
            for name in sorted(dirs):
                if f"{DISTRIBUTED_DIR}/{name}" in repartition_folders:
                    continue
                made_elsewhere = reference_checks.repartition_folder_problem(Path(folder) / name)
                if made_elsewhere:
                    problems.append(warning(f"{DISTRIBUTED_DIR}/{name}", made_elsewhere))
                else:
                    problems.append(warning(f"{DISTRIBUTED_DIR}/{name}", "repartition folder without a manifest.json "
                                                                         "(unfinished; distributed_webdataset.py completes it)"))
            dirs[:] = []  # each repartition folder is checked against its manifest
        for name in names:
            relative = f"{relative_folder}/{name}" if relative_folder else name
            if relative in expected:
                continue
            if name.endswith(PARTIAL_SUFFIX):
                problems.append(warning(relative, "partial file left by an interrupted write (safe to delete)"))
            else:
                problems.append(warning(relative, "extra file not listed in metadata.json (loaders ignore it)"))


# ================================================================================ repartitions


@dataclass
class _RepartitionPlan:
    folder: str  # relative: distributed/<N>-instances
    manifest: dict
    tasks: list
    instance_records: dict  # (split, instance number) -> SampleColumns or None
    expected_files: set


def _plan_repartition_checks(root, metadata, metadata_sha256, states, fmt, payload_ext, classes, deep, layout,
                             problems):
    """Read every repartition manifest; return what to check, with the remainder shards as tasks."""
    plans = []
    base = Path(root) / DISTRIBUTED_DIR
    if not base.is_dir():
        return plans
    for folder in sorted(p for p in base.iterdir() if p.is_dir()):
        relative = f"{DISTRIBUTED_DIR}/{folder.name}"
        manifest_path = folder / REPARTITION_MANIFEST
        manifest_name = f"{relative}/{REPARTITION_MANIFEST}"
        if not manifest_path.is_file():
            continue  # reported as an unfinished folder by _check_extra_files
        try:
            manifest = json.loads(manifest_path.read_bytes())
            if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
                raise ValueError("expected an object with 'splits'")
        except (OSError, ValueError) as exc:
            problems.append(error(manifest_name, f"unreadable repartition manifest: {exc}"))
            plans.append(_RepartitionPlan(relative, {}, [], {}, {manifest_name}))
            continue
        status, message = metadata_digest.digest_status(manifest)
        if status in (metadata_digest.EDITED, metadata_digest.MALFORMED):  # absent: made before manifests had one
            problems.append(error(manifest_name, message))
        plan = _RepartitionPlan(relative, manifest, [], {}, {manifest_name})
        plans.append(plan)
        try:
            _plan_one_repartition(root, folder, plan, metadata, metadata_sha256, states, fmt, payload_ext,
                                  classes, deep, layout, problems)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a value of the wrong type
            problems.append(error(manifest_name, f"malformed repartition manifest: {type(exc).__name__}: {exc}"))
            plan.manifest, plan.tasks = {}, []
    return plans


def _relative_path_problem(name):
    """Why a path a manifest names is unsafe to open (absolute, or climbing out with ..), or None."""
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
        return f"{name!r} is not a path inside the dataset"
    return None


def _plan_one_repartition(root, folder, plan, metadata, metadata_sha256, states, fmt, payload_ext, classes,
                          deep, layout, problems):
    manifest = plan.manifest
    manifest_name = f"{plan.folder}/{REPARTITION_MANIFEST}"
    match = re.fullmatch(r"(\d+)-instances", folder.name)
    n = manifest.get("num_instances")
    if match is None or n != int(match.group(1)):
        problems.append(error(manifest_name, f"num_instances {n!r} does not match the folder name {folder.name}"))
    if manifest.get("format") != metadata.get("format"):
        problems.append(error(manifest_name, f"format {manifest.get('format')!r}, the dataset is {metadata.get('format')!r}"))
    _expect_repartition_files(plan, manifest)
    if manifest.get("source_metadata_sha256") != metadata_sha256:
        problems.append(error(manifest_name, "stale repartition: made from a different metadata.json (the dataset "
                                             f"was re-converted or edited); re-run distributed_webdataset.py "
                                             f"--num-instances {n}"))
        plan.manifest = {}  # its records describe another dataset: comparing them would only add noise
        return
    for split, entry in manifest["splits"].items():
        state = states.get(split)
        if state is None:
            problems.append(error(manifest_name, f"split {split!r} is not in metadata.json"))
            continue
        for number, instance in enumerate(entry.get("instances") or []):
            index_name = instance.get("index")
            records = None
            unsafe = _relative_path_problem(index_name)
            if unsafe:
                problems.append(error(manifest_name, f"{split} instance {number}: its sample index {unsafe}"))
            else:
                try:
                    records = _read_index(Path(root) / index_name, index_name)
                except OSError as exc:
                    problems.append(error(index_name, f"cannot read the instance's sample index: {exc.strerror or exc}"))
                except DatasetError as exc:
                    problems.append(error(index_name, str(exc).removeprefix(f"{index_name}: ")))
            plan.instance_records[(split, number)] = records
            remainder = instance.get("remainder")
            if remainder is None:
                continue
            unsafe = _relative_path_problem(remainder)
            if unsafe:
                problems.append(error(manifest_name, f"{split} instance {number}: its remainder shard {unsafe}"))
                continue
            try:
                remainder_record = ShardRecord.from_json(instance.get("remainder_record"))
            except (KeyError, TypeError, ValueError):
                problems.append(error(manifest_name, f"{split} instance {number}: remainder {remainder} has no valid record"))
                remainder_record = None
            if remainder_record is not None and remainder_record.name != remainder:
                problems.append(error(manifest_name, f"{split} instance {number}: remainder {remainder} but its record "
                                                     f"names {remainder_record.name}"))
            path = Path(root) / remainder
            if not path.is_file():
                problems.append(error(remainder, f"missing remainder shard of {split} instance {number}"))
                continue
            mine = () if records is None else tuple(records.records(records.rows_of_shards([remainder])))
            plan.tasks.append(ShardTask(str(path), remainder, fmt, remainder_record, mine, payload_ext, classes,
                                        True, deep, layout, None, label_offset_of(metadata)))
            plan.expected_files.update(get_format(fmt).companions(remainder))
        remainders = entry.get(reference_checks.LOADER_REMAINDERS)
        if remainders is not None:
            def task(path, shard, mine):
                return ShardTask(str(path), shard.name, fmt, shard, mine, payload_ext, classes, True, deep, layout,
                                 None, label_offset_of(metadata))

            reference_checks.plan_loader_remainders(root, plan, split, remainders, problems, _relative_path_problem,
                                                    task)


def _expect_repartition_files(plan, manifest):
    for entry in (manifest.get("splits") or {}).values():
        for instance in entry.get("instances") or []:
            for name_key in ("index", "remainder", "shard_list"):
                value = instance.get(name_key)
                if isinstance(value, str):
                    plan.expected_files.add(value)


def _check_repartition(root, plan, states, problems):
    """Union, disjointness and counts of one repartition, from its manifest and instance indexes."""
    manifest = plan.manifest
    if manifest:
        manifest_name = f"{plan.folder}/{REPARTITION_MANIFEST}"
        for split, entry in manifest["splits"].items():
            state = states.get(split)
            if state is not None:
                _check_repartition_split(root, plan, manifest_name, manifest.get("num_instances"), split, entry,
                                         state, problems)
    _check_repartition_folder_files(root, plan, problems)


class _Reads:
    """Which instances read which samples of a split, without a dict over every key: per instance the
    split rows it reads (arrays), and apart the keys read that are not in the split."""

    def __init__(self):
        self.rows, self.numbers = [], []
        self.strays = defaultdict(list)  # key not in the split -> instance numbers reading it

    def add(self, number, records, found):
        self.rows.append(found[found >= 0])
        self.numbers.append(np.full(int(np.count_nonzero(found >= 0)), number, dtype=np.int64))
        for row in np.flatnonzero(found < 0).tolist():
            self.strays[records.key(row)].append(number)

    def joined(self):
        if not self.rows:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(self.rows), np.concatenate(self.numbers)


def _check_repartition_split(root, plan, where, n, split, entry, state, problems):
    policy = entry.get("policy")
    instances = entry.get("instances") or []
    if policy not in ("spread", "pad", "drop"):
        problems.append(error(where, f"{split}: unknown policy {policy!r}"))
    if len(instances) != n:
        problems.append(error(where, f"{split}: {len(instances)} instances listed, num_instances is {n}"))
    counts = [instance.get("samples") for instance in instances]
    if entry.get("samples_per_instance") is not None and entry.get("samples_per_instance") != counts:
        problems.append(error(where, f"{split}: samples_per_instance {entry.get('samples_per_instance')} "
                                     f"disagrees with the instances' counts {counts}"))
    split_shards = {shard.name for shard in state.shards}
    reads, padded, dropped = _Reads(), Counter(), set()
    actual_counts = []
    for number, instance in enumerate(instances):
        label = f"{split} instance {number}"
        if instance.get("instance", number) != number:
            problems.append(error(where, f"{label}: numbered {instance.get('instance')}"))
        records = plan.instance_records.get((split, number))
        padded.update(instance.get("padded_keys") or [])
        dropped.update(instance.get("dropped_keys") or [])
        whole = list(instance.get("shards") or [])
        for name in whole:
            if name not in split_shards:
                problems.append(error(where, f"{label} reads {name!r} whole, which is not a {split} shard in metadata"))
        _check_shard_list(root, plan, instance, whole, instance.get("remainder"), label, problems)
        if records is None:
            actual_counts.append(instance.get("samples"))
            continue
        actual_counts.append(len(records))
        if len(records) != instance.get("samples"):
            problems.append(error(instance.get("index"), f"{label}: the index lists {len(records):,} samples, the "
                                                         f"manifest says {instance.get('samples')!r}"))
        found = state.table.rows_of_columns(records)
        _check_instance_index(label, instance, whole, records, found, state, split, problems)
        reads.add(number, records, found)
    for name, instance_keys in (("padded_keys", list(padded.elements())), ("dropped_keys", sorted(dropped))):
        if name in entry and sorted(entry[name]) != sorted(instance_keys):
            problems.append(error(where, f"{split}: the split's {name} differ from its instances' {name}"))
    if "total_samples" in entry and entry["total_samples"] != len(state.columns):
        problems.append(error(where, f"{split}: total_samples {entry['total_samples']!r}, the split has "
                                     f"{len(state.columns):,} samples"))
    _check_union(where, split, policy, state, reads, padded, dropped, problems)
    _check_counts(where, split, policy, actual_counts, len(state.columns), problems)
    if entry.get(reference_checks.LOADER_REMAINDERS) is not None:
        reference_checks.check_loader_remainders(plan, split, entry[reference_checks.LOADER_REMAINDERS], n, state,
                                                 problems)


def _check_instance_index(label, instance, whole, records, found, state, split, problems):
    """An instance's index against the split's: whole shards complete and only theirs, nothing placed in a
    shard the instance does not read, copied samples equal to their originals. `found`: each instance row's
    split row (-1: not in the split)."""
    index_name, remainder = instance.get("index"), instance.get("remainder")
    listed = ShardGroups(records, by_offset=False)
    home = np.where(found >= 0, state.columns.shard_ids[np.maximum(found, 0)], -1) if len(found) else found
    for name in whole:
        mine, want = listed.rows(name), state.groups.rows(name)
        for row in want[~np.isin(want, found[mine])].tolist():
            problems.append(error(index_name, f"{label} reads {name} whole, but its index leaves out "
                                              f"this sample of it", state.columns.key(row)))
        for row in mine[home[mine] != state.groups.ids.get(name, -2)].tolist():
            problems.append(error(index_name, f"{label}: placed in {name}, where the {split} index does not "
                                              f"have it", records.key(row)))
    for name in records.shard_names:
        if name in whole or name == remainder:
            continue
        for row in listed.rows(name).tolist():
            problems.append(error(index_name, f"{label}: placed in {name!r}, which the instance does not read",
                                  records.key(row)))
    for row in listed.rows(remainder).tolist() if remainder else ():
        record = records.record(row)
        if found[row] < 0:
            problems.append(error(remainder, f"{label}: copied sample is not in the {split} split", record.key))
            continue
        source = state.columns.record(found[row])
        if ((source.payload_crc32c, source.payload_sha256, source.label, source.bbox)
                != (record.payload_crc32c, record.payload_sha256, record.label, record.bbox)):
            problems.append(error(remainder, f"{label}: copied sample differs from the original in "
                                             f"{source.shard} (payload checksum, label or bbox)", record.key))


def _check_shard_list(root, plan, instance, whole, remainder, label, problems):
    name = instance.get("shard_list")
    if name is None:
        return
    if _relative_path_problem(name):
        problems.append(error(f"{plan.folder}/{REPARTITION_MANIFEST}", f"{label}: its shard list "
                                                                       f"{_relative_path_problem(name)}"))
        return
    try:
        lines = (Path(root) / name).read_text().split()
    except OSError as exc:
        problems.append(error(name, f"{label}: cannot read its shard list: {exc.strerror or exc}"))
        return
    expected = whole + ([remainder] if remainder else [])
    if lines != expected:
        problems.append(error(name, f"{label}: the shard list differs from the manifest ({len(lines)} names, "
                                    f"expected {len(expected)})"))


def _check_union(where, split, policy, state, reads, padded, dropped, problems):
    rows, numbers = reads.joined()
    counts = np.bincount(rows, minlength=len(state.columns))
    named = sorted(dropped)
    dropped_rows = {key: int(row) for key, row in zip(named, state.table.rows_of_keys(named)) if row >= 0}
    unread = (state.columns.key(row) for row in np.flatnonzero(counts == 0).tolist())
    for key in sorted(key for key in unread if key not in dropped):
        problems.append(error(where, f"{split}: sample is read by no instance and not named as dropped", key))
    for key in sorted(reads.strays):
        problems.append(error(where, f"{split}: an instance reads a sample that is not in the split", key))
    for key in named:
        row = dropped_rows.get(key)
        if row is not None and counts[row]:
            first = int(numbers[np.flatnonzero(rows == row)[0]])
        elif key in reads.strays:
            first = reads.strays[key][0]
        else:
            continue
        problems.append(error(where, f"{split}: named as dropped but read by instance {first}", key))
    for key in named:
        if key not in dropped_rows:
            problems.append(error(where, f"{split}: named as dropped but not in the split", key))
    for key, numbers_of_key in sorted(_repeated_readers(state, reads, rows, numbers, counts, padded).items()):
        repeats = len(numbers_of_key) - 1 - padded.get(key, 0)
        if repeats > 0:
            problems.append(error(where, f"{split}: read by instances {', '.join(map(str, numbers_of_key))}, but "
                                         f"not named as padding", key))
        elif repeats < 0:
            problems.append(error(where, f"{split}: named as padding {padded[key]} times but read "
                                         f"{len(numbers_of_key)} times", key))
    if policy == "spread" and (padded or dropped):
        problems.append(error(where, f"{split}: policy 'spread' keeps every sample once, but the manifest names "
                                     f"{sum(padded.values())} padded and {len(dropped)} dropped keys"))
    if policy == "pad" and dropped:
        problems.append(error(where, f"{split}: policy 'pad' drops nothing, but {len(dropped)} keys are named as dropped"))
    if policy == "drop" and padded:
        problems.append(error(where, f"{split}: policy 'drop' pads nothing, but {sum(padded.values())} keys are padding"))


def _repeated_readers(state, reads, rows, numbers, counts, padded) -> dict:
    """{key: instance numbers reading it} of the keys whose readers padding must account for: read more
    than once, or named as padding, or not in the split."""
    padded_keys = list(padded)
    padded_rows = [int(row) for row in state.table.rows_of_keys(padded_keys) if row >= 0 and counts[row]]
    wanted = np.union1d(np.flatnonzero(counts > 1), np.array(padded_rows, dtype=np.int64))
    readers = {}
    mask = np.isin(rows, wanted)
    for row, number in zip(rows[mask].tolist(), numbers[mask].tolist()):
        readers.setdefault(row, []).append(number)
    out = {state.columns.key(row): found for row, found in readers.items()}
    out.update(reads.strays)
    return out


def _check_counts(where, split, policy, counts, total, problems):
    counts = [c for c in counts if isinstance(c, int)]
    if not counts:
        return
    if policy == "spread" and max(counts) - min(counts) > 1:
        problems.append(error(where, f"{split}: policy 'spread' but instance counts range from {min(counts)} to {max(counts)}"))
    if policy in ("pad", "drop") and len(set(counts)) > 1:
        problems.append(error(where, f"{split}: policy {policy!r} needs equal counts, got {counts}"))
    if policy == "spread" and sum(counts) != total:
        problems.append(error(where, f"{split}: instances read {sum(counts):,} samples, the split has {total:,}"))


def _check_repartition_folder_files(root, plan, problems):
    folder = Path(root) / plan.folder
    for path in sorted(folder.iterdir()):
        relative = f"{plan.folder}/{path.name}"
        if relative in plan.expected_files or path.is_dir():
            continue
        if path.name.endswith(PARTIAL_SUFFIX):
            problems.append(warning(relative, "partial file left by an interrupted write (safe to delete)"))
        elif path.name.endswith(".plan.json"):
            problems.append(warning(relative, "plan stamp of an interrupted re-run (distributed_webdataset.py completes it)"))
        else:
            problems.append(warning(relative, "extra file not listed in the repartition manifest (loaders ignore it)"))


# ================================================================================ raw folders


def _hash_raw_files(job):
    """Worker: hash (and with deep, decode) a batch of raw files. job = (root, [relative paths], want_sha, deep)."""
    root, paths, want_sha256, deep = job
    out = []
    for relative in paths:
        path = os.path.join(root, relative)
        try:
            md5, sha, size = raw_checksum.md5_sha256_of_file(path, want_sha256)
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


def validate_raw(root, workers=1, deep=False, write_manifest=False, progress=None) -> Report:
    """Check train/ and validation/ folders: the reference checksum, counts, and the manifest if any."""
    root = Path(root)
    started = time.perf_counter()
    report = Report(str(root), "raw")
    problems = report.problems
    manifest_path = root / raw_checksum.MANIFEST_FILE
    recorded = None
    if manifest_path.exists():
        try:
            recorded = raw_checksum.read_manifest(manifest_path)
        except raw_checksum.ManifestError as exc:
            if not write_manifest:
                problems.append(error(raw_checksum.MANIFEST_FILE, str(exc).removeprefix(f"{manifest_path}: ")))
    have_manifest = recorded is not None and not write_manifest
    folders = {split: find_split_folder(root, split) for split in raw_checksum.RAW_SPLITS}

    files = []  # (path relative to root, size)
    split_of = {}
    broken_by_split = defaultdict(list)
    layout = {}
    for split, folder in folders.items():
        if folder is None:
            continue
        listed, broken, unreadable = raw_checksum.list_files(folder)
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

    hashed = {}
    for relative, size, md5, sha, why in _run_raw_jobs(root, files, recorded is not None or write_manifest, deep,
                                                       workers, progress):
        if size is None:
            problems.append(error(relative, why))
            broken_by_split[split_of[relative]].append(relative)
            continue
        hashed[relative] = (size, md5, sha)
        if why:
            problems.append(error(relative, why))

    imagenet_findings = []  # (split folder, text)
    for split, folder in folders.items():
        expected = raw_checksum.IMAGENET[split]
        if folder is None:
            if recorded is None or write_manifest:
                imagenet_findings.append((f"{split}/", f"folder missing: the standard layout has {split}/ with "
                                                       f"{expected.images:,} images"))
            continue
        md5s = [hashed[path][1] for path, _ in files if split_of.get(path) == split and path in hashed]
        # checksumdir hashes a file it cannot read as empty; so does this, to stay comparable
        md5s += [hashlib.md5().hexdigest()] * len(broken_by_split[split])
        checksum = raw_checksum.reference_checksum(md5s)
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

    current = {path: raw_checksum.ManifestEntry(path, size, sha) for path, (size, _, sha) in hashed.items()}
    if write_manifest:
        if recorded is not None:
            for path, kind, text in raw_checksum.compare_with_manifest(recorded, current):
                problems.append(warning(path, f"{text} (the previous manifest is replaced)"))
        try:
            raw_checksum.write_manifest(manifest_path, current.values())
        except (OSError, raw_checksum.ManifestError) as exc:
            raise ValidationUsageError(f"{manifest_path}: cannot write the manifest: {exc}") from None
        report.notes.append(f"manifest written: {manifest_path} ({len(current):,} files, "
                            f"{sum(e.size for e in current.values()):,} bytes)")
    elif have_manifest:
        for path, kind, text in raw_checksum.compare_with_manifest(recorded, current):
            problems.append(error(path, text))
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
            problems.append(error(where, text))
        if imagenet_findings:
            report.notes.append(f"not ImageNet but your own dataset? Record it once with --write-manifest; later runs "
                                f"check every file against {raw_checksum.MANIFEST_FILE} and name what was added, "
                                f"removed or changed")

    report.problems = _sorted_problems(problems)
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
    seconds = time.perf_counter() - started
    total = sum(size for size, _, _ in hashed.values())
    report.stats = {
        "splits": layout,
        "files_checked": len(hashed),
        "bytes_checked": total,
        "manifest": str(manifest_path) if (have_manifest or write_manifest) else None,
        "workers": workers,
        "deep": deep,
        "seconds": round(seconds, 3),
        "mb_per_s": round(total / seconds / 1e6, 1) if seconds > 0 else None,
    }
    return report


# ================================================================================ entry point


def validate_reference(root, deep=False, adopt=False, progress=None) -> Report:
    """A dataset made by the reference harness (datasets.reference.checks.check_dataset): its folder
    checksum, every shard walked; with `adopt`, once intact, this project's indexes and metadata written."""
    started = time.perf_counter()
    report = Report(str(root), "converted")
    problems, report.notes, stats = reference_checks.check_dataset(root, deep, adopt, progress)
    report.problems = _sorted_problems([Problem(*p) for p in problems])
    report.verdicts["Dataset"] = report.ok
    seconds = time.perf_counter() - started
    report.stats = dict(stats, seconds=round(seconds, 3),
                        mb_per_s=round(stats["bytes_checked"] / seconds / 1e6, 1) if seconds > 0 else None)
    return report


def validate(path, workers=1, deep=False, write_manifest=False, progress=None, adopt=False) -> Report:
    """Validate a converted dataset or a raw image folder; ValidationUsageError if it is neither.

    `progress(total_bytes, description)` may return a tqdm-like object (update(n), close()).
    `adopt`: a dataset made by the reference harness is, once found intact, adopted
    (datasets.reference.layout.adopt); for any other dataset it is a usage error.
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
