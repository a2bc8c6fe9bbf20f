"""tar_tools.py's work: tar tools over shards (WebDataset's tarshow / tarcat / tarsplit / tar2tsv), aware of this harness's indexes.

    python tar_tools.py show  SHARD|- [--start N] [--count M]          members and sizes per sample
    python tar_tools.py tsv   SHARD... [--fields __key__,cls,jpg.size,json.source]   to stdout
    python tar_tools.py cat     INPUT... --out DIR|- [--split S] [--samples-per-shard N] [--max-shard-bytes B]
    python tar_tools.py split   INPUT... --out DIR (--samples-per-shard N | --max-shard-bytes B)
    python tar_tools.py sort    INPUT... --out DIR [limits]              by key
    python tar_tools.py shuffle INPUT... --out DIR --seed S [limits]     a seeded permutation
    python tar_tools.py reindex DATASET_DIR     re-create a sample index of the earlier version (payload
                                                sha256) with CRC32Cs, in place (imagenet_shards.index.earlier)

INPUT: shard files or URLs (http(s)://, s3://; brace patterns), a converted dataset folder (its `--split`
shards), or `-` (one tar on stdin). Shards of a converted dataset are known from its sample index (no
scan); stock WebDataset tars are scanned once (their tar headers). Samples are copied byte for byte
(`add_raw_record`: a sample's member blocks, headers included), so a payload never changes.

What the writing commands leave in DIR is a dataset that validate_dataset.py passes and get_data loads:
`<split>-NNNNNN.tar` shards (imagenet_shards.formats.webdataset), the sample index (imagenet_shards.index, every
payload's CRC32C), and metadata.json, written last (format, classes and steps taken from the inputs'
metadata where there is one; `derived` names the command and its inputs; the reference `checksum`).
A split already in DIR is refused (another split is added beside it). `--out -` streams one tar to
stdout (no index: a stream has none). `show` and `tsv` read every registered format (through the
format's own reader); the writing commands write tar (img/tensor), and refuse other formats' shards.
Exit codes: 0 done, 1 a data problem (one line naming the file and the problem), 2 usage error.
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import crc32c

from imagenet_shards.fileio import OpenShard
from imagenet_shards.formats import FORMATS, format_for_location, get_format
from imagenet_shards.formats.tar import TarShardWriter, iter_tar_samples
from imagenet_shards.errors import EXIT_OK, DatasetError, Error, UsageError, exit_code
from imagenet_shards.safe_names import plain_name, redact
from imagenet_shards.index import (ShardRecord, parse_metadata, parse_sample_columns, read_metadata, sample_index_name,
                            write_metadata, write_sample_index)
from imagenet_shards.index.earlier import rewrite_earlier_index
from imagenet_shards.dataset_folder import DISTRIBUTED_DIR, METADATA_FILE, REPARTITION_MANIFEST, SPLITS
from imagenet_shards.loader.read import PAYLOAD_PREFERENCE, scan_shard
from imagenet_shards.repartition.plan import remainder_records
from imagenet_shards.repartition.run import repartition
from imagenet_shards.storage import exists, expand_locations, is_url, open_byte_range, read_bytes
from imagenet_shards.reference.checksum import folder_checksum

STDIO = "-"
DEFAULT_FIELDS = "__key__,cls,payload.size"


class ToolError(DatasetError):
    """Bad input data: names the file and the problem (exit 1)."""


# ---------------------------------------------------------------- reading the inputs


@dataclass
class Input:
    """One input shard: where it is, its records (from the index, or scanned), its dataset's metadata."""

    location: str
    records: list
    metadata: Optional[dict] = None
    temporary: Optional[str] = None  # stdin copied here (removed at the end)


@dataclass
class Inputs:
    shards: list = field(default_factory=list)
    split: Optional[str] = None  # the split the indexed inputs belong to

    def records(self):
        return [(shard, record) for shard in self.shards for record in shard.records]

    def cleanup(self):
        for shard in self.shards:
            if shard.temporary:
                os.unlink(shard.temporary)


def _folder_of(location: str) -> str:
    return location.rsplit("/", 1)[0] if "/" in location else "."


def _dataset_index(folder: str, cache: dict):
    """(metadata, {shard name: (split, [records])}) of the converted dataset in `folder`, or (None, {})."""
    if folder in cache:
        return cache[folder]
    found = (None, {})
    metadata_location = f"{folder.rstrip('/')}/{METADATA_FILE}"
    if exists(metadata_location):
        try:
            metadata = parse_metadata(read_bytes(metadata_location), metadata_location)
        except DatasetError:  # the reference harness's metadata or damaged metadata: scan the shards instead
            metadata = None
        if metadata is not None:
            by_shard = {}
            for split, entry in metadata["splits"].items():
                name = (entry.get("index") or {}).get("name", sample_index_name(split))
                location = f"{folder.rstrip('/')}/{name}"
                for record in parse_sample_columns(io.BytesIO(read_bytes(location)), location).iter_records():
                    by_shard.setdefault(record.shard, (split, []))[1].append(record)
            found = (metadata, by_shard)
    cache[folder] = found
    return found


def _expand(items, split: str) -> list:
    """Shard locations of INPUT arguments (a dataset folder gives its split's shards, in metadata order)."""
    locations = []
    for item in items:
        if item != STDIO and not is_url(item) and Path(item).is_dir():
            path = Path(item)
            if not (path / METADATA_FILE).is_file():
                locations += sorted(str(p) for p in path.glob("*.tar"))
                continue
            metadata = parse_metadata((path / METADATA_FILE).read_bytes(), path / METADATA_FILE)
            if split not in metadata["splits"]:
                raise UsageError(f"{path}: no split {split!r} (it has {', '.join(metadata['splits'])})")
            locations += [str(path / s["name"]) for s in metadata["splits"][split]["shards"]]
        else:
            locations += [STDIO] if item == STDIO else expand_locations(item)
    if not locations:
        raise UsageError("no input shards")
    return locations


def load_inputs(items, split: str = "train") -> Inputs:
    """Every input shard with its records, in the order given."""
    inputs, cache = Inputs(), {}
    for location in _expand(items, split):
        if location == STDIO:
            handle, temporary = tempfile.mkstemp(suffix=".tar", prefix="tar_tools-stdin-")
            with os.fdopen(handle, "wb") as out:
                out.write(sys.stdin.buffer.read())
            inputs.shards.append(Input(temporary, scan_shard(temporary, name=temporary), temporary=temporary))
            continue
        if not is_url(location) and not Path(location).is_file():
            raise UsageError(f"{location}: no such file")
        fmt = format_for_location(location)
        metadata, by_shard = _dataset_index(_folder_of(location), cache)
        name = location.rsplit("/", 1)[-1]
        if metadata is not None and name in by_shard:
            fmt = get_format(metadata["format"])
            shard_split, records = by_shard[name]
            inputs.split = inputs.split or shard_split
            shard = Input(location, sorted(records, key=lambda r: r.record_offset), metadata)
        else:
            shard = Input(location, scan_shard(location, name=location))
        if fmt.name not in ("img", "tensor"):
            raise UsageError(f"{location}: a {fmt.name} shard; the writing tar tools copy tar shards "
                             f"(img, tensor, stock WebDataset tars)")
        inputs.shards.append(shard)
    return inputs


class RecordReader:
    """A sample's whole byte range from its shard (pread locally, a ranged GET remotely)."""

    def __init__(self):
        self.local = OpenShard()

    def read(self, shard: Input, record) -> bytes:
        stop = record.record_offset + record.record_size
        try:
            if is_url(shard.location):
                with open_byte_range(shard.location, record.record_offset, stop) as stream:
                    raw = stream.read(record.record_size)
            else:
                raw = self.local.pread(shard.location, record.record_size, record.record_offset)
        except OSError as error:
            raise ToolError(f"{shard.location}: cannot read sample {record.key!r}: {error.strerror or error}") from None
        if len(raw) != record.record_size:
            raise ToolError(f"{shard.location}: truncated: sample {record.key!r} needs bytes "
                            f"{record.record_offset}-{stop}")
        payload = raw[record.payload_offset - record.record_offset:][:record.payload_size]
        if record.payload_crc32c is not None and crc32c.crc32c(payload) != record.payload_crc32c:
            raise ToolError(f"{shard.location}: sample {record.key!r}: payload CRC32C differs from the sample index")
        return raw

    def close(self):
        self.local.close()


# ---------------------------------------------------------------- writing shards


def ordered(pairs, command: str, seed: Optional[int]):
    """The (shard, record) pairs in the command's order: as given (cat, split), by key (sort), or a
    permutation drawn from `seed` (shuffle: the same seed, the same order, whatever the platform)."""
    if command == "sort":
        return sorted(pairs, key=lambda pair: pair[1].key)
    if command == "shuffle":
        pairs = list(pairs)
        random.Random(seed).shuffle(pairs)
    return list(pairs)


def plan_shards(pairs, samples_per_shard: Optional[int], max_shard_bytes: Optional[int]) -> list:
    """Consecutive runs of `pairs`, at most N samples and (once written, trailer included) B bytes
    each; a sample larger than B gets a shard of its own."""
    shards, current, size = [], [], 0
    for pair in pairs:
        record_size = pair[1].record_size
        full = samples_per_shard is not None and len(current) >= samples_per_shard
        too_big = max_shard_bytes is not None and TarShardWriter.finished_size(size + record_size) > max_shard_bytes
        if current and (full or too_big):
            shards.append(current)
            current, size = [], 0
        current.append(pair)
        size += record_size
    if current:
        shards.append(current)
    return shards


def _output_format(inputs: Inputs) -> dict:
    """metadata.json fields from the inputs: the indexed inputs' own, else what the payloads say."""
    metadata = next((shard.metadata for shard in inputs.shards if shard.metadata), None)
    if metadata is not None:
        kept = {k: v for k, v in metadata.items() if k not in ("splits", "checksum", "plan_fingerprint", "classes")
                and not k.endswith("_length")}
        return kept | {"classes": metadata["classes"]}
    payloads = {m.split(":")[0] for shard in inputs.shards for r in shard.records[:1] for m in r.members.split(";")}
    ext = next((e for e in PAYLOAD_PREFERENCE if e in payloads), "jpg")
    fields = {"format": "tensor" if ext in ("npy", "pth") else "img", "format_version": 1}
    if ext == "pth":
        fields |= {"payload_extension": "pth", "tensor_layout": "CHW"}
    elif ext == "npy":
        fields["tensor_layout"] = "HWC"
    labels = [r.label for shard in inputs.shards for r in shard.records]
    return fields | {"classes": [str(i) for i in range(max(labels, default=-1) + 1)]}


def write_dataset(inputs: Inputs, pairs, out: Path, split: str, derived: dict, limits) -> dict:
    """Copy `pairs` into shards of `out`, then write the split's index and metadata.json (last)."""
    fields = _output_format(inputs)
    fmt = get_format(fields["format"])
    metadata_path = out / METADATA_FILE
    existing = parse_metadata(metadata_path.read_bytes(), metadata_path) if metadata_path.is_file() else None
    if existing is not None and (split in existing["splits"] or existing["format"] != fmt.name):
        raise UsageError(f"{out}: already holds {'split ' + repr(split) if split in existing['splits'] else existing['format'] + ' shards'}; "
                         f"choose another --out or --split")
    if existing is None and out.exists() and any(out.iterdir()):
        raise UsageError(f"{out}: not empty and not a dataset; choose an empty or new folder")
    out.mkdir(parents=True, exist_ok=True)
    groups = plan_shards(pairs, *limits)
    records_out, shard_records, reader = [], [], RecordReader()
    bbox_known = all(record.bbox is not None for _, record in pairs)
    try:
        for number, group in enumerate(groups):
            name = fmt.shard_name(split, number, len(groups))
            copied = []
            with fmt.open_writer(out / name) as writer:
                for shard, record in group:
                    raw = reader.read(shard, record)
                    start = record.payload_offset - record.record_offset
                    crc = crc32c.crc32c(raw[start:start + record.payload_size])
                    copied.append(record._replace(payload_crc32c=crc, bbox=record.bbox if bbox_known else None))
                    writer.add_raw_record(raw)
            records_out += remainder_records(copied, name)
            shard_records.append(ShardRecord(name, len(copied), writer.bytes_written, writer.sha256, writer.md5))
    finally:
        reader.close()
    index_entry = write_sample_index(out / sample_index_name(split), records_out)
    metadata = existing or {**fields, "splits": {}}
    metadata["splits"][split] = {"length": len(records_out), "source_samples": len(records_out), "skipped": [],
                                 "shards": [s.to_json() for s in shard_records], "index": index_entry}
    metadata[f"{split}_length"] = len(records_out)
    metadata.setdefault("derived", {})[split] = derived
    known = {s.name: s.md5 for entry in metadata["splits"].values() for s in map(ShardRecord.from_json, entry["shards"])}
    known |= {entry["index"]["name"]: entry["index"]["md5"] for entry in metadata["splits"].values()}
    metadata["checksum"] = folder_checksum(out, known)
    write_metadata(out, metadata)
    return {"split": split, "samples": len(records_out), "shards": len(shard_records),
            "bytes": sum(s.bytes for s in shard_records), "out": str(out)}


def stream_tar(inputs: Inputs, pairs, stream) -> dict:
    """One tar of `pairs` to `stream` (no index: a stream has none), end-of-archive as TarShardWriter writes it."""
    reader, written = RecordReader(), 0
    try:
        for shard, record in pairs:
            raw = reader.read(shard, record)
            stream.write(raw)
            written += len(raw)
    finally:
        reader.close()
    stream.write(bytes(TarShardWriter.finished_size(written) - written))
    stream.flush()
    return {"samples": len(pairs), "shards": 1, "bytes": TarShardWriter.finished_size(written), "out": STDIO}


# ---------------------------------------------------------------- reading commands


def iter_shard_samples(location: str):
    """Sample dicts of a shard of any registered format, or of a tar on stdin."""
    if location == STDIO:
        return iter_tar_samples("<stdin>", stream=sys.stdin.buffer)
    fmt = format_for_location(location)
    metadata, _ = _dataset_index(_folder_of(location), {})
    if metadata is not None:
        fmt = FORMATS.get(metadata.get("format"), fmt)
    label_offset = (metadata or {}).get("label_offset", 0)
    stream = open_byte_range(location, 0, None) if is_url(location) else None
    if not is_url(location) and not Path(location).is_file():
        raise UsageError(f"{location}: no such file")
    return fmt.iter_samples(location, 0, None, stream, label_offset)


def show(location: str, start: int, count: Optional[int], out) -> int:
    """Per sample: its number, offset, key and members with their sizes."""
    shown = 0
    for number, sample in enumerate(iter_shard_samples(location)):
        if number < start:
            continue
        if count is not None and shown >= count:
            break
        members = "  ".join(f"{ext}:{len(value):,}" for ext, value in sample.items() if not ext.startswith("__"))
        out.write(f"{number:>6}  @{sample['__offset__']:<10}  {sample['__key__']}  {members}\n")
        shown += 1
    return shown


def field_value(sample: dict, name: str) -> str:
    """One tsv cell: `__key__`/`__offset__`, `EXT` (a member's text), `EXT.size`, `payload.size` (the
    image's), `json.a.b` (a field of the json member). Missing: empty. Tabs and newlines escaped."""
    if name.startswith("__"):
        value = sample.get(name, "")
    elif name == "payload.size":
        ext = next((e for e in PAYLOAD_PREFERENCE if e in sample), None)
        value = len(sample[ext]) if ext else ""
    elif name.endswith(".size") and name[:-5] in sample:
        value = len(sample[name[:-5]])
    elif name.startswith("json.") and "json" in sample:
        value = json.loads(bytes(sample["json"]))
        for part in name[5:].split("."):
            value = value.get(part, "") if isinstance(value, dict) else ""
        value = json.dumps(value) if isinstance(value, (dict, list)) else ("" if value is None else value)
    elif name in sample:
        value = bytes(sample[name]).decode("utf-8", "replace")
    else:
        value = ""
    return str(value).replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def tsv(locations, fields, out) -> int:
    out.write("\t".join(fields) + "\n")
    rows = 0
    for location in locations:
        for sample in iter_shard_samples(location):
            out.write("\t".join(field_value(sample, name) for name in fields) + "\n")
            rows += 1
    return rows


# ---------------------------------------------------------------- the command line


def run_writer(args) -> dict:
    inputs = load_inputs(args.inputs, args.split or "train")
    try:
        split = plain_name(args.split or inputs.split or "train",
                           "--split" if args.split else "the input's metadata.json")
        if split not in SPLITS:
            print(f"note: split {split!r} is neither train nor validation; get_data reads it by name", file=sys.stderr)
        pairs = ordered(inputs.records(), args.command, args.seed)
        if args.out == STDIO:
            return stream_tar(inputs, pairs, sys.stdout.buffer)
        derived = {"tool": f"tar_tools {args.command}", "inputs": [redact(item) for item in args.inputs],
                   "seed": args.seed,
                   "samples_per_shard": args.samples_per_shard, "max_shard_bytes": args.max_shard_bytes}
        return write_dataset(inputs, pairs, Path(args.out), split, derived,
                             (args.samples_per_shard, args.max_shard_bytes))
    finally:
        inputs.cleanup()


def reindex(folder) -> tuple:
    """Re-create a dataset's sample indexes of the earlier version (payload sha256) in place, with CRC32Cs
    (imagenet_shards.index.earlier checks every payload against its sha256 first), then metadata.json's checksum,
    then its repartitions; ({split: samples re-indexed} ({} when every index is already current), [the
    repartition folders written again])."""
    folder = Path(folder)
    metadata = read_metadata(folder)
    done = {}
    for split, entry in metadata["splits"].items():
        count = rewrite_earlier_index(folder, entry)
        if count is not None:
            done[split] = count
    if done:
        known = {e["index"]["name"]: e["index"]["md5"] for e in metadata["splits"].values() if e["index"].get("md5")}
        metadata["checksum"] = folder_checksum(folder, known)
        write_metadata(folder, metadata)
    return done, _rebuild_repartitions(folder)


def _rebuild_repartitions(folder: Path) -> list:
    """Each repartition (distributed/<N>-instances/) with its manifest's policies, through the repartitioner:
    one made before re-indexing names the metadata.json that re-indexing resealed, and its instance indexes
    are of the earlier version, so it is written again from the new indexes; a current one is kept as it is
    (an interrupted reindex run again finishes them). The folders written again."""
    rebuilt = []
    for path in sorted((folder / DISTRIBUTED_DIR).glob(f"*-instances/{REPARTITION_MANIFEST}")):
        where = path.parent.relative_to(folder).as_posix()
        try:
            manifest = json.loads(path.read_bytes())
            policies = {split: entry["policy"] for split, entry in manifest["splits"].items()}
            count = int(manifest["num_instances"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise DatasetError(f"{where}/{REPARTITION_MANIFEST}: cannot read it to rebuild the repartition "
                               f"({type(error).__name__}: {error}); re-run distributed_webdataset.py "
                               f"--num-instances N --overwrite") from None
        result = repartition(folder, count, splits=list(policies), policies=policies,
                             verify=manifest.get("verified_shards") or "copied")
        if result.plans:
            rebuilt.append(where)
    return rebuilt


def run(args) -> int:
    """Carry out a parsed command line (tar_tools.py's options); the exit code."""
    try:
        if args.command == "show":
            show(args.shard, args.start, args.count, sys.stdout)
        elif args.command == "tsv":
            tsv([loc for item in args.shards for loc in ([STDIO] if item == STDIO else expand_locations(item))],
                [name.strip() for name in args.fields.split(",") if name.strip()], sys.stdout)
        elif args.command == "reindex":
            done, rebuilt = reindex(args.dataset)
            print("reindex: " + (", ".join(f"{split} {count:,} samples" for split, count in done.items())
                                 or f"every index of {args.dataset} is current")
                  + "".join(f"; {where} written again" for where in rebuilt))
        else:
            result = run_writer(args)
            where = "stdout" if result["out"] == STDIO else result["out"]
            print(f"{args.command}: {result['samples']:,} samples in {result['shards']:,} shard(s), "
                  f"{result['bytes']:,} bytes -> {where}", file=sys.stderr if result["out"] == STDIO else sys.stdout)
    except BrokenPipeError:  # `... | head`: the reader has what it wanted
        sys.stderr.close()
        return EXIT_OK
    except (Error, OSError) as error:  # UsageError (exit 2), bad data (exit 1)
        print(str(error), file=sys.stderr)
        return exit_code(error)
    return EXIT_OK
