"""Mid-epoch resume of the loader: the state follows from a few integers.

The plan is deterministic (share_plan.py), so what an instance has delivered is known from, per
DataLoader worker, how many batches it handed over and how far it got in its own reading order.
The state (`ImageLoader.state_dict()`) is those integers and what fixes the plan (dataset
fingerprint, split, seed, epoch, policy, batch size, instance and worker counts): no sample list,
a few hundred bytes of JSON, versioned (`STATE_VERSION`).

Segments. An epoch is dealt in segments. Segment 0 deals the epoch's whole sequence (the
uninterrupted run). A restart with the same instance count, worker count (0 and 1 are the same),
batch size and shuffle buffer continues the last segment exactly: the same batches, keys and
order (and augmentations) as if nothing had happened. Any other restart starts a new segment that
deals the positions of the epoch sequence no earlier segment delivered (in sequence order, so
reading stays sequential) among the new instances under the epoch's policy: "spread" every one
exactly once; "drop"/"pad" equal batches, the dropped/padded keys named in the report and ledger.
A new segment needs the state of every instance of the last one (pass the list), since each
instance knows only its own progress. The next epoch is planned as if nothing had happened.

What this cannot know: samples skipped as bad at run time (on_error="skip") and their substitutes;
the ledger lists what the plan delivered, the epoch report names the skipped ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from imagenet_shards.loader.plan.global_mix import MixLayout
from imagenet_shards.loader.plan.global_order import FlatLayout, plan_flat
from imagenet_shards.loader.plan.share_plan import InstancePlan
from imagenet_shards.loader.plan.shuffle_buffer import buffer_order, order_rng, pick
from imagenet_shards.loader.plan.sub_order import SubOrder, plan_items, plan_segment
from imagenet_shards.loader.source_kinds import get_source_kind
from imagenet_shards.errors import Error

STATE_VERSION = 1
STATE_DIGEST = "digest"  # written since 2026-11-28; a state without one (written before) is not checked
# What fixes an epoch's plan and may not change across a resume (the rest may: a new segment).
FIXED = ("split", "seed", "policy", "shuffle", "drop_last", "repartition", "order")


class ResumeError(Error, ValueError):
    """A state that cannot resume this loader: names the difference."""


# ---------------------------------------------------------------------------- segments

@dataclass
class Segment:
    """One deal of (part of) an epoch: its configuration and each instance's progress so far."""

    instances: int
    workers: int  # DataLoader workers, 0 counted as 1 (the same plan)
    batch_size: int
    shuffle_buffer: int  # 0 without shuffle
    progress: dict = field(default_factory=dict)  # instance -> {"next": worker, "done": [[batches, position]...]}

    def config(self) -> tuple:
        return self.instances, self.workers, self.batch_size, self.shuffle_buffer

    def to_json(self) -> dict:
        return {"instances": self.instances, "workers": self.workers, "batch_size": self.batch_size,
                "shuffle_buffer": self.shuffle_buffer,
                "progress": {str(i): p for i, p in sorted(self.progress.items())}}

    @classmethod
    def from_json(cls, data: dict) -> "Segment":
        return cls(int(data["instances"]), int(data["workers"]), int(data["batch_size"]),
                   int(data["shuffle_buffer"]), {int(i): p for i, p in data.get("progress", {}).items()})


@dataclass
class Epoch:
    """What fixes an epoch's plan besides the segments: the planner of delivered positions."""

    total: int
    seed: int
    epoch: int
    policy: str
    drop_last: bool
    layout: Optional[FlatLayout] = None  # order="global": the flat sequence's (its length is `total`)

    def plan(self, positions, segment: Segment, instance: int, sequence=None) -> InstancePlan:
        """Instance `instance`'s plan in a segment dealing `positions` (items of `sequence`, or positions)."""
        if self.layout is not None:
            return plan_items(sequence, plan_flat(positions, self.layout, instance, segment.instances))
        return plan_segment(SubOrder(sequence, positions), instance, segment.instances, self.policy,
                            segment.batch_size, self.drop_last)

    def delivered_batches(self, plan: InstancePlan, number: int, segment: Segment, instance: int,
                          progress: Optional[dict]) -> list:
        """The batches `plan`'s instance delivered in segment `number` given its `progress`, in
        delivery order (round-robin over the workers), as arrays (or lists) of plan items."""
        per_worker = []
        for worker, (batches, position) in enumerate((progress or {"done": []})["done"]):
            items = plan.worker_items(worker, segment.workers)
            rng = order_rng(self.seed, self.epoch, number, instance, worker)
            delivered = pick(items, buffer_order(len(items), segment.shuffle_buffer, rng)[:position])
            size = segment.batch_size
            per_worker.append([delivered[n * size:(n + 1) * size] for n in range(batches)])
        out = []
        for round_ in range(max((len(w) for w in per_worker), default=0)):
            out.extend(w[round_] for w in per_worker if round_ < len(w))
        return out

    def walk(self, chain: list):
        """([(number, segment, instance, plan, delivered batches)] for every instance of every
        segment of `chain`, in positions; the positions no segment delivered, in sequence order)."""
        positions, found = np.arange(self.total, dtype=np.int64), []
        for number, segment in enumerate(chain):
            missing = set(range(segment.instances)) - set(segment.progress)
            if missing:
                raise ResumeError(f"segment {number} lacks the state of instance(s) {sorted(missing)}")
            done = [np.zeros(0, dtype=np.int64)]
            for instance in range(segment.instances):
                plan = self.plan(positions, segment, instance)
                batches = self.delivered_batches(plan, number, segment, instance, segment.progress[instance])
                found.append((number, segment, instance, plan, batches))
                done.extend(batches)
            positions = positions[~np.isin(positions, np.concatenate(done))]
        return found, positions

    def remaining(self, chain: list) -> np.ndarray:
        """The positions of the epoch sequence that no segment of `chain` delivered, in order."""
        return self.walk(chain)[1]


@dataclass
class Resume:
    """A loaded state, as the loader uses it: the epoch, the earlier segments, this run's segment
    (with this instance's progress when it continues exactly), and the positions it deals."""

    epoch: int
    chain: list  # earlier segments, every instance's progress known
    current: Segment
    positions: Optional[np.ndarray]  # None: segment 0, the whole epoch sequence
    identity: dict

    @property
    def number(self) -> int:
        return len(self.chain)

    def start(self, instance: int, workers: int):
        """(next worker, [[batches, position] per worker]) where this instance resumes."""
        progress = self.current.progress.get(instance)
        if progress is None:
            return 0, [[0, 0] for _ in range(workers)]
        return int(progress["next"]), [list(map(int, d)) for d in progress["done"]]


@dataclass
class EpochProgress:
    """The epoch a loader is iterating (or last iterated): its resume, fixed when the epoch starts, and this
    instance's progress in it, moved by `handed_over` at each batch: the worker whose batch comes next and,
    per worker, [batches handed over, position in its reading order]. `state_dict()` and the ledger read it."""

    epoch: int
    resume: Optional[Resume]  # the loaded state this epoch continues, or None
    next: int  # the worker whose batch comes next
    done: list  # per worker: [batches, position]
    complete: bool = False  # the epoch was iterated to its end

    @classmethod
    def starting(cls, epoch: int, resume: Optional[Resume], instance: int, workers: int) -> "EpochProgress":
        """Where instance `instance` starts `epoch`: where `resume` left it, or at its beginning."""
        rotation, done = resume.start(instance, workers) if resume is not None else (0, [[0, 0]] * workers)
        return cls(epoch, resume, rotation, list(done))

    def handed_over(self, worker: int, batches: int, position: int, workers: int) -> None:
        """A batch of `worker`'s came: it has handed over `batches` and read to `position`."""
        self.done[worker], self.next = (batches, position), (worker + 1) % workers

    def progress(self) -> dict:
        """The state's (and the ledger's) form: {"next": worker, "done": [[batches, position] per worker]}."""
        return {"next": self.next, "done": [list(d) for d in self.done]}


def epoch_of(identity: dict, epoch: int) -> Epoch:
    """The Epoch (planner of delivered positions) of a loader's identity: today's order or the global one."""
    layout, total, order = None, identity["dataset"]["samples"], identity.get("order")
    if order is not None:
        if order.get("sources"):
            layout = MixLayout(tuple(order["sources"]), order["partitions"], order["global_batch_size"],
                               identity["policy"])
        else:
            layout = FlatLayout(total, order["partitions"], order["global_batch_size"], identity["policy"])
        total = len(layout)
    return Epoch(total, identity["seed"], epoch, identity["policy"], identity["drop_last"], layout)


def fingerprint(source) -> dict:
    """What identifies a source's samples: a sha256 over its kind, sample count and keys (the kind's
    `fingerprint`, imagenet_shards/loader/source_kinds/)."""
    digest = get_source_kind(source.kind).fingerprint(source)
    return {"samples": source.total, "sha256": digest.hexdigest()[:32], "description": source.description}


def check_identity(state: dict, identity: dict) -> None:
    """Refuse a state of another dataset, seed, split, policy...: name the difference. A state that
    is not the loader's (not a dict, a key missing) or whose digest does not match is named too."""
    if not isinstance(state, dict):
        raise ResumeError(f"a loader state is a dict (state_dict()), not {type(state).__name__}")
    if state.get("version") != STATE_VERSION:
        raise ResumeError(f"loader state version {state.get('version')!r}; this loader reads version {STATE_VERSION}")
    if STATE_DIGEST in state and state[STATE_DIGEST] != state_digest(state):
        raise ResumeError("the loader state does not match its digest: it was damaged or edited after "
                          "state_dict() made it (resume from another saved state)")
    theirs, ours = state["dataset"], identity["dataset"]
    if theirs["sha256"] != ours["sha256"] or theirs["samples"] != ours["samples"]:
        raise ResumeError(f"the state is from another dataset: {theirs['description']} ({theirs['samples']} samples, "
                          f"fingerprint {theirs['sha256']}); this loader reads {ours['description']} "
                          f"({ours['samples']} samples, fingerprint {ours['sha256']})")
    check_global_batch(state.get("order"), identity["order"])
    for name in FIXED:
        if state.get(name) != identity[name]:
            raise ResumeError(f"the state has {name} {state.get(name)!r}, this loader {name} {identity[name]!r}")


def check_global_batch(theirs, ours) -> None:
    """A state of the global order saved with another global batch size G is refused in one line."""
    if not (isinstance(theirs, dict) and isinstance(ours, dict)):
        return
    before, now = theirs.get("global_batch_size"), ours.get("global_batch_size")
    if before is None:
        raise ResumeError("the state was saved by the earlier global order (keyed by the per-rank batch, before "
                          "issue 43): this loader's order is keyed by the global batch size; start the epoch afresh")
    if before != now:
        raise ResumeError(f"the state was saved with global batch size {before}, this loader's is {now}: the global "
                          f"order resumes with the same G only (keep GlobalOrder(global_batch_size={before}) and "
                          f"change the instance count or the per-rank batch)")


def load(states, identity: dict, instance: int, current: Segment) -> Optional[Resume]:
    """The Resume for this loader (instance `instance`, configuration `current`) from one state or
    the states of every instance of the saved run; None when the state starts an epoch afresh. A
    malformed state (a key missing, a value of the wrong type) is a ResumeError, never a traceback."""
    try:
        return _load(states, identity, instance, current)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as error:
        if isinstance(error, ResumeError):
            raise
        raise ResumeError(f"a malformed loader state ({type(error).__name__}: {error}): not what state_dict() "
                          f"made, or damaged since") from None


def _load(states, identity: dict, instance: int, current: Segment) -> Optional[Resume]:
    states = [states] if isinstance(states, dict) else list(states)
    if not states:
        raise ResumeError("no loader state given")
    for state in states:
        check_identity(state, identity)
    first = states[0]
    for state in states[1:]:
        for name in ("epoch", "chain", "segment_config"):
            if state.get(name) != first.get(name):
                raise ResumeError(f"the states disagree on {name}: {first.get(name)!r} vs {state.get(name)!r} "
                                  f"(states of one save of one run are needed)")
    if first.get("segment_config") is None:
        return None
    progress = {}
    for state in states:
        progress[int(state["instance"])] = state["progress"]
    saved = Segment.from_json({**first["segment_config"], "progress": progress})
    chain = [Segment.from_json(s) for s in first["chain"]]
    epoch = epoch_of(identity, int(first["epoch"]))
    if saved.config() == current.config() and instance in progress:
        current.progress = {instance: progress[instance]}
    elif saved.config() == current.config():
        raise ResumeError(f"the state(s) given are of instance(s) {sorted(progress)} of {saved.instances}; instance "
                          f"{instance} needs its own, or the list of every instance's (e.g. gathered with "
                          f"torch.distributed.all_gather_object)")
    else:
        missing = sorted(set(range(saved.instances)) - set(progress))
        if missing:
            raise ResumeError(
                f"the state was saved by {saved.instances} instance(s) x {saved.workers} worker(s), batch "
                f"{saved.batch_size}; resuming on {current.instances} x {current.workers}, batch "
                f"{current.batch_size} deals what is left anew and needs every instance's state: "
                f"missing instance(s) {missing}")
        if identity["repartition"]:
            raise ResumeError(f"this loader reads the repartition {identity['repartition']}; a resume onto another "
                              f"instance or worker count needs use_repartition=False when saving and resuming")
        chain = chain + [saved]
    positions = epoch.remaining(chain) if chain else None
    return Resume(int(first["epoch"]), chain, current, positions, identity)


def state(identity: dict, epoch: int, resume: Optional[Resume], current: Optional[Segment], instance: int,
          progress: Optional[dict]) -> dict:
    """The JSON state of one instance; `current`/`progress` None: the epoch has not started."""
    data = {"version": STATE_VERSION, "dataset": identity["dataset"],
            **{name: identity[name] for name in FIXED}, "epoch": int(epoch), "instance": int(instance),
            "chain": [s.to_json() for s in resume.chain] if resume is not None else [],
            "segment_config": None, "progress": None}
    if current is not None:
        config = current.to_json()
        del config["progress"]
        data["segment_config"], data["progress"] = config, progress
    data[STATE_DIGEST] = state_digest(data)
    return data


def state_digest(data: dict) -> str:
    """sha256 of a state's content but the digest itself, as it reads back from JSON (int dict keys
    become text, tuples lists), in sorted key order: a state saved to a file and damaged there (a
    flipped digit in `next` resumed at another batch, with no word) is refused when loaded."""
    import hashlib
    import json

    content = json.loads(json.dumps({name: value for name, value in data.items() if name != STATE_DIGEST}))
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


# ---------------------------------------------------------------------------- the loader's side

def identity(planner) -> dict:
    """What a state must match to resume `planner`'s plans (an EpochPlanner): dataset, split, seed, policy..."""
    return {"dataset": fingerprint(planner.source), "split": planner.split, "seed": planner.seed,
            "policy": planner.policy, "shuffle": planner.shuffle, "drop_last": planner.drop_last,
            "repartition": planner.manifest, "order": planner.order_identity()}
