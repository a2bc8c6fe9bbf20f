"""Planning a segment: a part of the epoch's sequence (the positions no earlier segment delivered) as a
sequence of its own, and an instance's plan of it (resume.py's segments, epoch_planner.py).
"""

from __future__ import annotations

import numpy as np

from imagenet_shards.loader.plan.share_plan import InstancePlan, plan_instance


class SubOrder:
    """The positions `positions` of `sequence` (a GroupedOrder, a list, or None for the positions
    themselves) as a sequence of their own: a segment's part of the epoch."""

    def __init__(self, sequence, positions):
        self.sequence, self.positions = sequence, np.asarray(positions, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.positions)

    def take(self, indices):
        positions = self.positions[np.asarray(indices, dtype=np.int64)]
        if self.sequence is None:
            return positions
        if hasattr(self.sequence, "take"):
            return self.sequence.take(positions)
        return [self.sequence[p] for p in positions.tolist()]

    def __getitem__(self, index):
        return self.take([index])[0]


def plan_segment(order: SubOrder, instance: int, count: int, policy: str, batch_size: int,
                 drop_last: bool) -> InstancePlan:
    """plan_instance for a segment, which may hold fewer samples than instances (or none)."""
    total = len(order)
    if total and not (policy == "drop" and total < count):
        return plan_instance(order, instance, count, policy, batch_size, drop_last)
    # nothing left, or "drop" with fewer left than instances: every instance gets none, the rest is dropped
    empty = order.take(np.zeros(0, dtype=np.int64))
    return InstancePlan(empty, batch_size, drop_last, policy, [0] * count, policy_dropped=order.take(np.arange(total)))


def plan_items(sequence, plan: InstancePlan) -> InstancePlan:
    """`plan` (in positions) with its items taken from `sequence` (None: the positions themselves)."""
    if sequence is None:
        return plan

    def at(positions):
        return SubOrder(sequence, positions).take(np.arange(len(positions)))
    return InstancePlan(at(plan.items), plan.batch_size, plan.drop_last, plan.policy, plan.instance_counts,
                        at(plan.padded), at(plan.policy_dropped), at(plan.last_batch_dropped), plan.strided,
                        plan.sample_ids)
