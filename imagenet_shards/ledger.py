"""Proof, from a run's order ledgers, that an epoch delivered every sample once; and a shuffle figure.

    python -m imagenet_shards.ledger verify LEDGER... [--source DATASET] [--json REPORT]

A ledger is what `ImageLoader.write_ledger(path)` writes for one instance (loader/plan/ledger_writer.py):
the keys (and labels) it delivered in one epoch, in order, per segment of the epoch (a restart onto
another instance or worker count starts a segment; the earlier segments, derived from the loaded
states, are in every later ledger). Give the ledgers of every instance of the run's last segment.

Verdict (exit 0, else 1 naming every problem; 2 for a usage error):
  validation ("spread")  every sample of the epoch delivered exactly once;
  train ("drop"/"pad")   every sample at most once, except repeats the ledgers name as padded, and
                         every sample not delivered named as dropped (policy or partial last batch).
The epoch's samples come from the dataset (the ledgers name it; --source overrides); when it cannot
be read, the sample count and the fingerprint stand in and missing samples are counted, not named.

Shuffle quality: the distribution of distinct labels per batch, against the same batch sizes drawn
from the epoch's labels by a perfect shuffle (a seeded permutation, repeated to 2,000 batches at least),
per rank batch and per global batch (every instance's batch of one step together). Which bound applies:
an instance reads its own 1/N of the shards (today's order: a contiguous share; order="global": its
partitions), so on class-ordered shards a rank's batch sees at most the classes of its own shards; a
global batch under order="global" takes from every partition, so it can match a perfect shuffle.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from imagenet_shards.loader.plan import LEDGER_VERSION, fingerprint
from imagenet_shards.loader.source_kinds import SYNTHETIC_NAMES, SourceError, resolve_source
from imagenet_shards.errors import Error

HEADER = ("dataset", "split", "seed", "policy", "shuffle", "epoch")
ENTRY = ("segment", "instance", "instances", "complete", "batches", "keys", "labels", "padded", "dropped")
NAMED = 10  # keys named per problem; the rest are counted


class LedgerError(Error, ValueError):
    """A ledger that cannot be read: names the file and the problem."""


@dataclass
class Verdict:
    ledgers: int
    segments: list  # instances per segment
    samples: int
    delivered: int
    distinct: int
    padded: int
    dropped: int
    problems: list = field(default_factory=list)
    shuffle: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def read_ledgers(paths) -> list:
    ledgers = []
    for path in paths:
        try:
            with open(path) as handle:
                ledger = json.load(handle)
        except (OSError, ValueError) as error:
            raise LedgerError(f"{path}: cannot read the ledger: {error}") from None
        if not isinstance(ledger, dict) or ledger.get("ledger") != LEDGER_VERSION:
            raise LedgerError(f"{path}: not a ledger of version {LEDGER_VERSION}")
        missing = [name for name in (*HEADER, "entries") if name not in ledger]
        missing += sorted({f"entries[].{name}" for entry in ledger.get("entries", []) for name in ENTRY
                           if not isinstance(entry, dict) or name not in entry})
        if missing:
            raise LedgerError(f"{path}: malformed ledger, missing {', '.join(missing)}")
        ledger["path"] = str(path)
        ledgers.append(ledger)
    return ledgers


def epoch_population(source, split: str, ledger: dict):
    """(keys, labels) of every sample of the dataset `source` (its split), or None when it cannot
    be read; a problem string when it is another dataset than the ledger's."""
    if source is None:
        return None
    if str(source).lower() in SYNTHETIC_NAMES:
        count = ledger["dataset"]["samples"]
        return [f"synthetic-{n:09d}" for n in range(count)], None
    try:
        resolved = resolve_source(source, split, use_repartition=False)
    except (SourceError, OSError) as error:
        return f"{source}: cannot read the dataset to name missing samples: {error}"
    if fingerprint(resolved)["sha256"] != ledger["dataset"]["sha256"]:
        return f"{source}: not the dataset of the ledgers ({ledger['dataset']['description']})"
    columns = resolved.columns
    if columns is not None:
        data, offsets = columns.keys.tobytes(), columns.key_offsets.tolist()
        return [data[offsets[r]:offsets[r + 1]].decode() for r in range(len(columns))], columns.labels.tolist()
    items = [item for group in resolved.groups for item in group]
    return [item.key for item in items], [item.label for item in items]


def _entries(ledgers, problems) -> dict:
    """{(segment, instance): entry}, checking the ledgers describe one epoch and agree."""
    first, entries, where = ledgers[0], {}, {}
    for ledger in ledgers[1:]:
        for name in HEADER:
            if ledger.get(name) != first.get(name):
                problems.append(f"{ledger['path']}: {name} {ledger.get(name)!r} differs from {first['path']}'s "
                                f"{first.get(name)!r}")
    for ledger in ledgers:
        for entry in ledger["entries"]:
            at = (entry["segment"], entry["instance"])
            if at in entries and entries[at] != entry:
                problems.append(f"{ledger['path']} and {where[at]} disagree on segment {at[0]}, instance {at[1]}")
            entries.setdefault(at, entry)
            where.setdefault(at, ledger["path"])
    return entries


def _segments(entries, problems) -> list:
    last = max(segment for segment, _ in entries)
    counts = []
    for segment in range(last + 1):
        present = {i: e for (s, i), e in entries.items() if s == segment}
        count = next(iter(present.values()))["instances"] if present else 0
        counts.append(count)
        missing = [i for i in range(count) if i not in present] if present else ["all"]
        if missing:
            problems.append(f"segment {segment}: no ledger holds instance(s) {missing}")
        if segment == last:
            for instance, entry in sorted(present.items()):
                if not entry["complete"]:
                    problems.append(f"segment {segment}, instance {instance}: the epoch had not finished when its "
                                    f"ledger was written")
    return counts


def _name(keys) -> str:
    keys = sorted(keys)
    more = f" and {len(keys) - NAMED} more" if len(keys) > NAMED else ""
    return ", ".join(keys[:NAMED]) + more


def verify(ledgers, source: Optional[str] = None) -> Verdict:
    problems = []
    entries = _entries(ledgers, problems)
    segments = _segments(entries, problems)
    first = ledgers[0]
    last = len(segments) - 1
    delivered, padded, dropped = Counter(), Counter(), set()
    for (segment, _), entry in entries.items():
        delivered.update(entry["keys"])
        padded.update(entry["padded"])
        if segment == last:
            dropped.update(entry["dropped"])
    train = first["policy"] != "spread"
    repeated = {k: n for k, n in delivered.items() if n > 1 + (padded[k] if train else 0)}
    if repeated:
        problems.append(f"{len(repeated)} sample(s) delivered more than once{'' if train else ''} "
                        f"(not named as padded): {_name(f'{k} x{n}' for k, n in repeated.items())}")
    if not train and dropped:
        problems.append(f"validation ledgers name {len(dropped)} dropped sample(s): {_name(dropped)}")
    population = epoch_population(source or first.get("source"), first["split"], first)
    samples = first["dataset"]["samples"]
    if isinstance(population, str):
        problems.append(population)
        population = None
    if population is not None:
        keys = population[0]
        unknown = set(delivered) - set(keys)
        if unknown:
            problems.append(f"{len(unknown)} delivered key(s) are not in the dataset: {_name(unknown)}")
        missing = set(keys) - set(delivered) - (dropped if train else set())
        if missing:
            problems.append(f"{len(missing)} sample(s) of the epoch {'neither delivered nor named dropped' if train else 'not delivered'}: "
                            f"{_name(missing)}")
    else:
        accounted = len(delivered) + len(dropped - set(delivered))
        if accounted != samples:
            problems.append(f"{samples - accounted} of the epoch's {samples} samples neither delivered nor named "
                            f"dropped (give --source to name them)")
    verdict = Verdict(len(ledgers), segments, samples, sum(delivered.values()), len(delivered),
                      sum(padded.values()), len(dropped), problems)
    verdict.shuffle = shuffle_quality(entries.values(), population[1] if population and population[1] else None)
    return verdict


def rank_batches(entry) -> list:
    """One ledger entry's batches, as lists of labels, in delivery order."""
    out, start = [], 0
    for size in entry["batches"]:
        out.append(entry["labels"][start:start + size])
        start += size
    return out


def global_batches(entries) -> list:
    """Step k's global batch of each segment: the labels of every instance's batch k, together."""
    by_segment = {}
    for entry in entries:
        by_segment.setdefault(entry["segment"], []).append(rank_batches(entry))
    out = []
    for _, ranks in sorted(by_segment.items()):
        for step in range(max(len(batches) for batches in ranks)):
            out.append([label for batches in ranks if step < len(batches) for label in batches[step]])
    return out


def shuffle_quality(entries, labels=None, seed: int = 0) -> dict:
    """Distinct labels per batch in the ledgers, per rank batch ("run") and per global batch (every
    instance's batch of one step: "global"), each against the same batch sizes under a perfect shuffle
    of `labels` (default: the delivered labels): mean and 5/50/95th percentiles."""
    entries = list(entries)
    batches = [batch for entry in entries for batch in rank_batches(entry)]
    if not batches:
        return {}
    population = np.asarray(labels if labels is not None else [label for batch in batches for label in batch])
    out = quality(batches, population, seed)
    out["global"] = quality(global_batches(entries), population, seed)
    return out


def quality(batches, population, seed: int) -> dict:
    """{"run", "perfect_shuffle"}: distinct labels per batch of `batches` and of the same sizes drawn
    from `population` by a perfect shuffle (a seeded permutation, repeated to 2,000 batches at least)."""
    sizes = [len(batch) for batch in batches]
    observed = [len(set(batch)) for batch in batches]
    rng = np.random.default_rng(seed)
    perfect = []
    while len(perfect) < max(2000, len(sizes)):
        shuffled = rng.permutation(population)
        start = 0
        for size in sizes:
            if start + size > len(shuffled):
                break
            perfect.append(len(np.unique(shuffled[start:start + size])))
            start += size

    def figures(values):
        values = np.asarray(values)
        return {"batches": len(values), "mean": round(float(values.mean()), 2),
                **{f"p{q}": float(np.percentile(values, q)) for q in (5, 50, 95)}}

    return {"run": figures(observed), "perfect_shuffle": figures(perfect)}


def summary(verdict: Verdict, ledgers) -> str:
    first = ledgers[0]
    lines = [f"{verdict.ledgers} ledger(s): epoch {first['epoch']}, {first['split']}, policy {first['policy']}, "
             f"seed {first['seed']}; segments (instances each): {verdict.segments}",
             f"delivered {verdict.delivered} ({verdict.distinct} distinct) of {verdict.samples} samples; "
             f"padded repeats named {verdict.padded}; dropped named {verdict.dropped}"]
    for what, figures in (("batch", verdict.shuffle), ("global batch", verdict.shuffle.get("global"))):
        if not figures:
            continue
        run, perfect = figures["run"], figures["perfect_shuffle"]
        lines.append(f"distinct labels per {what}: this run mean {run['mean']} (p5 {run['p5']:g}, p50 {run['p50']:g}, "
                     f"p95 {run['p95']:g}); a perfect shuffle mean {perfect['mean']} (p5 {perfect['p5']:g}, "
                     f"p50 {perfect['p50']:g}, p95 {perfect['p95']:g})")
    lines += [f"PROBLEM: {problem}" for problem in verdict.problems]
    what = "at most once (dropped/padded named)" if first["policy"] != "spread" else "exactly once"
    lines.append(f"OK: every sample of the epoch delivered {what}" if verdict.ok else
                 f"FAILED: {len(verdict.problems)} problem(s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m imagenet_shards.ledger", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="prove an epoch's deliveries from the ledgers of a run")
    check.add_argument("ledgers", nargs="+", help="ledger files (ImageLoader.write_ledger), one per instance")
    check.add_argument("--source", help="the dataset (default: the one the ledgers name)")
    check.add_argument("--json", help="also write the verdict as JSON here")
    args = parser.parse_args(argv)
    try:
        ledgers = read_ledgers(args.ledgers)
    except LedgerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    verdict = verify(ledgers, args.source)
    print(summary(verdict, ledgers))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(verdict.__dict__, handle, indent=1)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
