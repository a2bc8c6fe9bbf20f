"""Which samples this instance reads in each epoch, and in which order: `EpochPlanner`.

It holds what fixes the plans (source, instance, policy, seed, shuffle, batch size, this instance's
repartition share), the epoch the main process iterates next, and a loaded resume state. The rules
it applies are in imagenet_shards/loader/plan/share_plan.py (dealing an epoch's sequence among instances),
imagenet_shards/loader/plan/global_order.py (order="global": one flat sequence whatever the instance and worker
counts) and imagenet_shards/loader/plan/resume.py (what a later segment of a resumed epoch deals); the workers read what
it plans (imagenet_shards/loader/read/read_loop.py).
"""

from __future__ import annotations

import logging
import warnings
from typing import Optional

import numpy as np

from imagenet_shards.launcher import Instance
from imagenet_shards.loader.output.batch_ring import SharedFlags
from imagenet_shards.loader.plan.global_order import FlatLayout, GlobalOrder, check_layout, default_partitions, plan_flat
from imagenet_shards.loader.plan.global_mix import MixLayout
from imagenet_shards.loader.plan.sub_order import SubOrder, plan_items, plan_segment
from imagenet_shards.loader.plan.share_plan import epoch_order, plan_instance, plan_own_share
from imagenet_shards.loader.source_kinds import get_source_kind
from imagenet_shards.loader.source_kinds.mix import mix_parts, source_runs
from imagenet_shards.loader.source_kinds import Source, load_own_share

log = logging.getLogger(__name__)


def flat_layout(source: Source, order: GlobalOrder, policy: str):
    """The global order's layout: global_order.FlatLayout, or global_mix.MixLayout for a Mix."""
    mix = mix_parts(source)
    if mix is not None:
        return MixLayout(tuple(int(c) for c in mix.counts), order.partitions, order.global_batch_size, policy)
    return FlatLayout(source.total, order.partitions, order.global_batch_size, policy)


def resolved_order(order: GlobalOrder, total: int, batch_size: int, instances: int) -> GlobalOrder:
    """`order` with G (default: the per-rank batch x the instance count) and P (default_partitions) filled in."""
    g = int(order.global_batch_size or batch_size * instances)
    partitions = int(order.partitions or default_partitions(total, g))
    return GlobalOrder(partitions=partitions, block=int(order.block), global_batch_size=g)


class EpochPlanner:
    """One instance's plan of each epoch of a split (share_plan.InstancePlan), its resume state and epoch."""

    def __init__(self, source: Source, split: str, instance: Instance, batch_size: int, *, policy: str, seed: int,
                 epoch: int, shuffle: bool, drop_last: bool, use_repartition: bool = True, order=None):
        self.source, self.split, self.instance, self.batch_size = source, split, instance, batch_size
        self.policy, self.seed, self.shuffle, self.drop_last = policy, seed, shuffle, drop_last
        # The epoch the main process iterates next; workers take theirs from run_flags (epoch_runs.py).
        self._epoch = int(epoch)
        # order="global" (a global_order.GlobalOrder; None: today's order): the epoch's flat sequence
        self.order, self.layout, self._flat = order, None, {}
        if order is not None:
            self.order = order = resolved_order(order, source.total, batch_size, instance.count)
            self.layout = flat_layout(source, order, policy)
            check_layout(self.layout, instance.count)
            self._padded_mask = self.layout.padded_mask()
        self.own_share, self._padded_rows = None, {}
        if source.repartition is not None and use_repartition and order is None:
            self.own_share = self._choose_repartition(source.repartition)
        elif source.repartition is not None and use_repartition:
            # A repartition fixes each of N instances' shards once (today's contiguous deal, remainders
            # byte-copied); the global order cuts its partitions from every epoch's shard permutation, so
            # that a global batch does not depend on N: it reads the dataset's own shards instead.
            log.info("%s: not used by order='global' (its partitions follow each epoch's shard order, not one "
                     "instance count's fixed shares); reading the dataset's shards", source.repartition["location"])
        self._plans = {}
        # A loaded state (imagenet_shards/loader/plan/resume.py) applies to its epoch while this flag (shared
        # with persistent workers) is 1; it is cleared once that epoch's iteration finished.
        self.resume = None
        self._resume_on = SharedFlags(1, 0)

    def _choose_repartition(self, repartition):
        manifest, their_policy, counts = repartition["location"], repartition["policy"], repartition["counts"]
        if their_policy != self.policy:
            warnings.warn(f"{manifest}: made with policy {their_policy}, this loader uses {self.policy}; dealing "
                          f"samples at run time", stacklevel=3)
            return None
        if self.policy != "spread" and len(set(counts)) != 1:
            warnings.warn(f"{manifest}: instance counts {counts} differ; dealing samples at run time", stacklevel=3)
            return None
        share = load_own_share(repartition, self.instance.index)
        log.info("%s: instance %d reads its %d samples from the repartition", manifest, self.instance.index,
                 len(share.columns))
        # Rows holding a padded key (a few: one per padded slot), found once, not per epoch.
        self._padded_rows = share.columns.rows_with_keys(share.padded_keys)
        return share

    @property
    def columns(self):
        """The columnar index the plan's rows refer to (this instance's repartition share, or the source's)."""
        return self.own_share.columns if self.own_share is not None else self.source.columns

    @property
    def manifest(self) -> Optional[str]:
        """The repartition manifest this instance's samples come from, or None."""
        return self.own_share.manifest if self.own_share is not None else None

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        self._epoch = int(epoch)

    # -- resume state
    def load_resume(self, resume) -> None:
        """Apply a loaded resume.Resume (or None: the epoch starts afresh) to its epoch."""
        self.resume, self._plans = resume, {}
        self._resume_on.values[0] = int(resume is not None)

    def end_resume(self) -> None:
        """The resumed epoch was iterated to its end: a loaded state applies to its epoch only."""
        self._resume_on.values[0] = 0

    def resume_for(self, epoch: int):
        """The loaded resume.Resume if it applies to `epoch`, else None."""
        resume = self.resume
        return resume if resume is not None and self._resume_on.values[0] and resume.epoch == epoch else None

    # -- plans
    def plan(self, epoch: Optional[int] = None):
        epoch = self.epoch if epoch is None else epoch
        resumed = self.resume_for(epoch) is not None
        # Unshuffled (validation), every epoch has the same plan: made once, not once an epoch in the
        # main process and in each worker (~40 us each on a 200-sample split, more on larger ones).
        key = (epoch if self.shuffle or resumed else None, resumed)
        if key not in self._plans:
            self._plans = {key: self._make_plan(epoch)}  # keep one: plans of 1.28M items are large
        return self._plans[key]

    def order_identity(self):
        """What a resume state records of the order (None: today's)."""
        if self.order is None:
            return None
        order = self.order
        identity = {"name": "global", "partitions": order.partitions, "block": int(order.block),
                    "global_batch_size": order.global_batch_size}
        if isinstance(self.layout, MixLayout):
            identity["sources"] = list(self.layout.counts)
        return identity

    def shard_sequence(self, epoch: int):
        """The source kind's epoch sequence: shards permuted by (seed, epoch), samples in shard order; a Mix's
        under the global order: its sources' runs one source after the other (global_mix.py)."""
        if self.order is not None and mix_parts(self.source) is not None:
            return source_runs(self.source, self.seed, epoch, self.shuffle)
        return get_source_kind(self.source.kind).epoch_sequence(self.source, self.seed, epoch, self.shuffle)

    def flat(self, epoch: int):
        """order="global": the epoch's global_order.FlatSequence (one kept: 1.28M positions are 10 MB)."""
        if epoch not in self._flat:
            self._flat = {epoch: self.layout.flat(self.seed, epoch, self.order.block if self.shuffle else None)}
        return self._flat[epoch]

    def epoch_sequence(self, epoch: int):
        """The epoch's global sequence (what the instances' plans deal), or None for a repartition."""
        if self.own_share is not None:
            return None
        if self.order is not None:
            return SubOrder(self.shard_sequence(epoch), self.flat(epoch).positions)
        return self.shard_sequence(epoch)

    def with_flat_dropped(self, plan, epoch: int):
        """`plan` (in items) with the samples the global order's partition tails leave out this epoch added
        to its policy_dropped ("drop"); unchanged for today's order."""
        if self.order is None:
            return plan
        dropped = SubOrder(self.shard_sequence(epoch), self.flat(epoch).dropped)
        tail = dropped.take(np.arange(len(dropped)))
        policy_dropped = plan.policy_dropped
        if isinstance(tail, np.ndarray) and isinstance(policy_dropped, np.ndarray):
            plan.policy_dropped = np.concatenate([policy_dropped, tail])
        else:
            plan.policy_dropped = list(policy_dropped) + list(tail)
        return plan

    def _make_plan(self, epoch):
        if self.own_share is not None:
            return self._own_share_plan(epoch)
        sequence = self.epoch_sequence(epoch)
        resume = self.resume_for(epoch)
        if self.order is not None:
            positions = resume.positions if resume is not None and resume.positions is not None else \
                np.arange(len(sequence), dtype=np.int64)
            plan = plan_flat(positions, self.layout, self.instance.index, self.instance.count, self._padded_mask)
            return self.with_flat_dropped(plan_items(sequence, plan), epoch)
        if resume is not None and resume.positions is not None:  # a later segment: what is left, dealt anew
            return plan_segment(SubOrder(sequence, resume.positions), self.instance.index, self.instance.count,
                                self.policy, self.batch_size, self.drop_last)
        return plan_instance(sequence, self.instance.index, self.instance.count, self.policy, self.batch_size,
                             self.drop_last)

    def _own_share_plan(self, epoch):
        share = self.own_share
        order = epoch_order(*share.columns.group_ranges(), self.seed, epoch, self.shuffle)
        items = order.take(np.arange(len(order), dtype=np.int64))
        # A padded key appears twice in this instance's share; name the copies read after the first.
        padded = []
        if self._padded_rows:
            position = np.empty(len(items), dtype=np.int64)
            position[items] = np.arange(len(items), dtype=np.int64)
            repeats = []
            for key, rows in self._padded_rows.items():
                repeats.extend((p, key) for p in sorted(int(position[row]) for row in rows)[1:])
            padded = [key for _, key in sorted(repeats)]
        if len(padded) < len(share.padded_keys):  # the original lives with another instance
            padded = list(share.padded_keys)
        plan = plan_own_share(items, share.counts, self.batch_size, self.drop_last, share.policy, padded)
        plan.policy_dropped = list(share.dropped_keys)
        return plan
