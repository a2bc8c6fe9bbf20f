"""The soak's fault schedule (benchmarks/soak.py): drawn from a seed and keyed by training step, never by
time, so that a seed names its run.

Every schedule holds each fault kind at least once (a short CI schedule covers them all); a longer run
draws more, one fault every SPACING steps or so. A schedule is "same-count" (every restart on 2 ranks:
the final weights must equal the uninterrupted run's) or, for one seed in three, "rank-change" (each
restart after a process fault on 1, 2 or 4 ranks, as the seed says: the loader's N->M resume under the
global order with the global batch kept, proved by the ledgers and by every step's global batch).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

STORE_FAULTS = ("slowdown", "reset", "stall", "outage", "outage_past_retries")
CACHE_FAULTS = ("cache_bit_flip", "cache_truncate")
PROCESS_FAULTS = ("kill_rank", "kill_worker", "kill_job", "kill_in_checkpoint_write")
FAULT_KINDS = STORE_FAULTS + CACHE_FAULTS + PROCESS_FAULTS
# Faults that end the job: the soak restarts it from the last checkpoint (--resume).
ENDS_THE_JOB = PROCESS_FAULTS + ("outage_past_retries",)
SPACING = 6  # steps between faults, on average, beyond one of each kind
STORE_LEAD = 6  # a store fault comes this many steps before the end at least: a later one may meet no request
RANKS = 2
RESTART_RANKS = (1, 2, 4)  # a rank-change schedule's restarts: each divides the global batch and P (issue 43)


@dataclass
class Fault:
    step: int  # injected once the run has reached this step (the first time: a resumed run goes back)
    kind: str
    ranks_after: int = RANKS  # for a fault that ends the job: the rank count of the restart
    injected_at: int = None  # the step the run had reached when it was injected (the soak fills it)
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class Schedule:
    seed: int
    steps: int
    rank_change: bool
    faults: list

    def as_dict(self) -> dict:
        return {"seed": self.seed, "steps": self.steps, "rank_change": self.rank_change,
                "faults": [fault.as_dict() for fault in self.faults]}


def draw_schedule(seed: int, steps: int, checkpoint_every: int) -> Schedule:
    """Each kind once, then more kinds drawn uniformly, at distinct steps in [2, steps - 2]. A fault
    that ends the job lands on a step after the first checkpoint (so a restart resumes, never starts
    over), a kill during a checkpoint's write on a checkpoint step, and a store fault STORE_LEAD steps
    before the end at least (the workers read ahead: the last steps' data may be in hand already)."""
    rng = random.Random(seed)
    kinds = list(FAULT_KINDS)
    extra = max(0, steps // SPACING - len(kinds))
    kinds += [rng.choice(FAULT_KINDS) for _ in range(extra)]
    rng.shuffle(kinds)
    first, last = 2, steps - 2
    checkpoints = [s for s in range(checkpoint_every, last + 1, checkpoint_every)]
    free = [s for s in range(first, last + 1) if s not in checkpoints]
    after_first = [s for s in free if s > checkpoint_every]
    if len(free) < len(kinds) or not checkpoints:
        raise ValueError(f"{steps} steps hold too few distinct steps for {len(kinds)} faults; give more --steps")
    rank_change = rng.random() < 1 / 3
    faults, taken = [], set()
    for kind in kinds:
        if kind == "kill_in_checkpoint_write":
            pool = [s for s in checkpoints if s > checkpoint_every] or checkpoints
        elif kind in STORE_FAULTS:
            pool = [s for s in (after_first if kind in ENDS_THE_JOB else free) if s <= steps - STORE_LEAD]
        elif kind in ENDS_THE_JOB:
            pool = after_first
        else:
            pool = free
        pool = [s for s in pool if s not in taken] or [s for s in range(first, last + 1) if s not in taken]
        step = rng.choice(pool)
        taken.add(step)
        ranks = rng.choice(RESTART_RANKS) if rank_change and kind in PROCESS_FAULTS else RANKS
        faults.append(Fault(step, kind, ranks))
    faults.sort(key=lambda fault: fault.step)
    return Schedule(seed, steps, any(fault.ranks_after != RANKS for fault in faults), faults)


def checkpoint_kill_to_arm(pending: list):
    """The step of the next kill during a checkpoint's write, which the job must be started with (rank 0
    kills itself there), or None. None while an outage past the retries comes before it: the job reads
    ahead, so it may reach the write before the outage stops it, and the store's one line would be lost
    (seed 2 at 200 steps: outage at 126, write killed at 128). The restart after the outage arms it."""
    for fault in pending:
        if fault.kind == "outage_past_retries":
            return None
        if fault.kind == "kill_in_checkpoint_write":
            return fault.step
    return None
