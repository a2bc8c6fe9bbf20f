"""The order ledger of an instance: every key its plan delivered in an epoch, per segment of a resume
(`ImageLoader.write_ledger`; `python -m imagenet_shards.ledger verify` reads it).

What it cannot know: samples skipped as bad at run time (on_error="skip") and their substitutes; the
epoch report names those.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from imagenet_shards.fileio import open_new
from imagenet_shards.safe_names import redact
from imagenet_shards.loader.plan.resume import FIXED, EpochProgress, Segment, epoch_of
from imagenet_shards.loader.plan.sub_order import SubOrder, plan_items
from imagenet_shards.loader.source_kinds import get_source_kind, keys_of

LEDGER_VERSION = 1


def _entry(context, number, instance, segment, batches, plan, complete) -> dict:
    labels_of = get_source_kind(context.source.kind).labels
    keys, labels = [], []
    for batch in batches:
        keys.extend(keys_of(context, batch))
        labels.extend(labels_of(context, batch))
    dropped = []
    if complete:
        dropped = keys_of(context, plan.policy_dropped) + keys_of(context, plan.last_batch_dropped)
    return {"segment": number, "instance": instance, "instances": segment.instances, "workers": segment.workers,
            "batch_size": segment.batch_size, "complete": complete, "batches": [len(b) for b in batches],
            "keys": keys, "labels": labels, "padded": keys_of(context, plan.padded), "dropped": dropped}


def write_ledger(path, planner, context, live: Optional[EpochProgress], source_argument, identity_: dict,
                 segment: Segment) -> dict:
    """The ledger of the current (or last) epoch of `planner`'s instance: every earlier segment of
    a resume (every instance's, derived from the states) and this instance's current segment.
    `live`: the epoch being or last iterated (ImageLoader's), None before the first; `context`: the
    source kind's ReadContext (keys and labels of plan items)."""
    import json
    import os

    own = planner.instance  # this instance
    if live is None:  # where a loaded state starts this epoch, or nothing delivered yet
        resume = planner.resume_for(planner.epoch)
        live = (EpochProgress.starting(planner.epoch, resume, own.index, segment.workers) if resume
                else EpochProgress(planner.epoch, None, 0, []))
    epoch, resume, complete, progress = live.epoch, live.resume, live.complete, live.progress()
    sequence = planner.epoch_sequence(epoch)
    walker = epoch_of(identity_, epoch)
    entries, number = [], 0
    if resume is not None and resume.chain:
        found, _ = walker.walk(resume.chain)
        for number, old, instance, plan, batches in found:
            batches = [SubOrder(sequence, b).take(np.arange(len(b))) for b in batches]
            entries.append(_entry(context, number, instance, old, batches, plan_items(sequence, plan), False))
        number += 1
    if resume is not None and resume.positions is not None:
        plan = planner.with_flat_dropped(plan_items(sequence, walker.plan(resume.positions, segment, own.index)), epoch)
    else:  # segment 0: the epoch's own plan
        plan = planner.plan(epoch)
    batches = walker.delivered_batches(plan, number, segment, own.index, progress)
    entries.append(_entry(context, number, own.index, segment, batches, plan, complete))
    ledger = {"ledger": LEDGER_VERSION, "dataset": identity_["dataset"],
              "source": source_argument and redact(source_argument),
              **{name: identity_[name] for name in FIXED}, "epoch": epoch, "instance": own.index,
              "instances": own.count, "entries": entries}
    temporary = f"{path}.tmp{os.getpid()}"
    with open_new(temporary, "w") as handle:
        json.dump(ledger, handle)
    os.replace(temporary, path)
    return ledger
