"""The soak's checker (benchmarks/soak.py), run on a finished soak: Jepsen's order, run, injure, then
verify the history.

  * every epoch's order ledgers verify (`imagenet_shards.ledger.verify`): train samples at most once, and each
    one not delivered named as dropped; the last epoch, cut by --max-steps, only "at most once";
  * same-count schedules: the final parameters' digest equals the uninterrupted run's, and every step
    trained on the reference's batches (keys and pixel sums, per rank);
  * every injected cache corruption was detected (a warning naming the shard) or its bytes were never
    read again (the entry is still as corrupted, or gone);
  * no process started by the soak is alive; nothing outside the named folders, and TMPDIR empty.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from pathlib import Path

from imagenet_shards.ledger import read_ledgers, verify

LEDGER_NAME = re.compile(r"epoch(\d+)-rank(\d+)\.json$")
UNFINISHED = ("had not finished", "neither delivered nor named dropped", "no ledger holds")


def last_segment_ledgers(paths: list) -> list:
    """The ledgers of an epoch's last segment: a rank of an earlier, longer job (before a restart on fewer
    ranks) may have left its file."""
    ledgers = read_ledgers(paths)
    last = max(max(entry["segment"] for entry in ledger["entries"]) for ledger in ledgers)
    return [ledger for ledger in ledgers if max(entry["segment"] for entry in ledger["entries"]) == last]


def check_ledgers(ledger_dir: Path, source: Path) -> dict:
    """Per epoch: the verdict; and the totals (delivered, lost, repeated) over the complete epochs."""
    by_epoch = defaultdict(list)
    for path in sorted(ledger_dir.glob("epoch*-rank*.json")):
        match = LEDGER_NAME.search(path.name)
        if match:
            by_epoch[int(match.group(1))].append(path)
    epochs, problems = [], []
    totals = {"delivered": 0, "lost": 0, "repeated": 0}
    for epoch in sorted(by_epoch):
        ledgers = last_segment_ledgers(by_epoch[epoch])
        verdict = verify(ledgers, source=str(source))
        complete = all(entry["complete"] for ledger in ledgers for entry in ledger["entries"]
                       if entry["segment"] == max(e["segment"] for e in ledger["entries"]))
        final = epoch == max(by_epoch)
        wrong = [p for p in verdict.problems if not (final and not complete and any(u in p for u in UNFINISHED))]
        repeated = verdict.delivered - verdict.distinct - verdict.padded
        lost = verdict.samples - verdict.distinct - verdict.dropped if complete else 0
        totals["delivered"] += verdict.delivered
        totals["repeated"] += repeated
        totals["lost"] += lost
        epochs.append({"epoch": epoch, "ledgers": len(ledgers), "segments": verdict.segments, "complete": complete,
                       "delivered": verdict.delivered, "dropped": verdict.dropped, "repeated": repeated, "lost": lost,
                       "problems": wrong})
        problems += [f"epoch {epoch}: {p}" for p in wrong]
    if not epochs:
        problems.append(f"{ledger_dir}: no ledger")
    return {"epochs": epochs, **totals, "problems": problems}


def steps_of(keys_dir: Path) -> dict:
    """(rank, step) -> (epoch, keys, pixel sum): the last record of each (a replayed step overwrites)."""
    return {(rank, record["step"]): (record["epoch"], record["keys"], record["pixels"])
            for rank, record in key_records(keys_dir)}


def key_records(keys_dir: Path):
    """(rank, record) for each whole line of the ranks' keys logs, in file order."""
    for path in sorted(keys_dir.glob("rank*.jsonl")):
        rank = int(path.stem[4:])
        for line in path.read_text().splitlines():
            try:
                yield rank, json.loads(line)
            except ValueError:
                continue  # a line cut by a kill


def check_batches(keys_dir: Path, reference_dir: Path) -> list:
    """Every (rank, step) trained on the reference's batch: the same keys and the same pixel sum."""
    got, expected = steps_of(keys_dir), steps_of(reference_dir)
    problems = []
    if sorted(got) != sorted(expected):
        problems.append(f"steps logged differ from the reference's: {len(got)} against {len(expected)}")
    differ = [key for key in sorted(expected) if key in got and got[key] != expected[key]]
    if differ:
        rank, step = differ[0]
        problems.append(f"{len(differ)} batch(es) differ from the reference's, first rank {rank} step {step}")
    return problems


def global_batches(keys_dir: Path) -> dict:
    """step -> [the set of keys of every rank's batch, per rank count that logged the step on all its ranks]
    (the last record of each (rank count, rank, step): a replayed step overwrites)."""
    found = {(record["step"], record.get("ranks", 0), rank): record["keys"] for rank, record in key_records(keys_dir)}
    out = {}
    for step, ranks in sorted({(step, ranks) for step, ranks, _ in found}):
        if all((step, ranks, rank) in found for rank in range(ranks)):
            out.setdefault(step, []).append(set().union(*(found[(step, ranks, r)] for r in range(ranks))))
    return out


def check_global_batches(keys_dir: Path, reference_dir: Path) -> list:
    """A rank-change run under the global order: every step's global batch (every rank's keys of that step,
    on whatever rank count ran it) is the reference's."""
    got, expected = global_batches(keys_dir), global_batches(reference_dir)
    differ = [step for step, batches in sorted(got.items())
              if step in expected and any(batch != expected[step][0] for batch in batches)]
    problems = [] if sorted(got) == sorted(expected) else \
        [f"steps logged on every rank differ from the reference's: {len(got)} against {len(expected)}"]
    if differ:
        problems.append(f"{len(differ)} global batch(es) differ from the reference's, first at step {differ[0]}")
    return problems


def check_cache_faults(faults: list, jobs: list) -> list:
    """Each corrupted cache entry: named in a job's log after the corruption, or never read again."""
    problems = []
    for fault in faults:
        detail = fault["detail"]
        if not fault["kind"].startswith("cache_") or "entry" not in detail:
            continue
        named = f"cached shard {detail['shard']} dropped and fetched again"
        logs = [Path(job["log"]) for job in jobs[detail["job"]:]]
        text = "".join(log.read_text(errors="replace")[detail["log_offset"] if n == 0 else 0:]
                       for n, log in enumerate(logs))
        detail["detected"] = named in text
        entry = Path(detail["entry"])
        untouched = entry.exists() and hashlib.sha256(entry.read_bytes()).hexdigest() == detail["sha256"]
        # gone, or another file now (evicted unread, then fetched again: a read of the corrupted bytes
        # would have failed a sample's CRC32C and been named; same-count runs also match every batch)
        replaced = not entry.exists() or entry.stat().st_ino != detail["inode"]
        detail["never_read_again"] = untouched or replaced
        if not detail["detected"] and not detail["never_read_again"]:
            problems.append(f"{fault['kind']} of {entry} at step {fault['injected_at']}: the entry changed with "
                            f"no report naming it")
    return problems


# Left in TMPDIR by torch and multiprocessing, not by the library: torchrun keeps its torchelastic_*
# folder and inductor its cache even after a clean run (the reference leaves both), and a SIGKILLed
# process cannot remove its pymp-* folder.
THIRD_PARTY_TMP = re.compile(r"^(torchelastic_|torchinductor_|pymp-)")


def check_files(out: Path, named: tuple, tmp: Path) -> tuple:
    """(problems, what torch and multiprocessing left in the jobs' TMPDIR `tmp`)."""
    problems = [f"{p}: outside the soak's named folders" for p in sorted(out.iterdir()) if p.name not in named]
    if tmp != out / "tmp" and any((out / "tmp").iterdir()):
        problems.append(f"{out / 'tmp'}: not empty (the jobs' TMPDIR was {tmp})")
    left = sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []
    problems += [f"{tmp / name}: left in the jobs' TMPDIR" for name in left if not THIRD_PARTY_TMP.match(name)]
    return problems, [name for name in left if THIRD_PARTY_TMP.match(name)]
