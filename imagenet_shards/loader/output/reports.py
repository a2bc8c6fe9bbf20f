"""What the loader hands over besides pixels: a batch with its keys, and the reports of an epoch.

`WorkerReport`s travel from each DataLoader worker after its last batch; `ImageLoader` folds them
into the instance's `EpochReport` (imagenet_shards/loader/image_loader.py), which names every sample that
was skipped, substituted, padded or dropped.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import NamedTuple, Optional

import torch

from imagenet_shards.shard_cache import cache_summary, merge_events


class Batch(NamedTuple):
    images: torch.Tensor
    labels: torch.Tensor
    keys: list


@dataclass
class Skipped:
    key: str
    shard: str
    reason: str


@dataclass
class WorkerReport:
    """Sent by each worker after its last batch, so skip counts reach the main process."""

    worker: int  # the worker as planned (a resumed epoch rotates them), not the DataLoader worker
    samples: int = 0
    batches: int = 0
    skipped: list = field(default_factory=list)
    substituted: list = field(default_factory=list)  # (skipped key, key repeated in its place)
    partial_dropped: list = field(default_factory=list)  # keys of a final partial batch left out
    cache: dict = field(default_factory=dict)  # the shard cache's events in this worker (shard_cache.new_events)
    sender: int = 0  # the DataLoader worker that sent it
    run: tuple = ()  # (generation, epoch), see imagenet_shards/loader/read/epoch_runs.py


@dataclass
class EpochReport:
    """What one instance did in one epoch; complete once the epoch's iteration finished."""

    epoch: int
    instance: int
    instances: int
    split: str
    source: str
    policy: str
    repartition: Optional[str]
    planned_samples: int
    planned_batches: int
    samples: int = 0
    batches: int = 0
    skipped: list = field(default_factory=list)
    substituted: list = field(default_factory=list)
    padded: list = field(default_factory=list)  # keys this instance reads twice (policy "pad")
    policy_dropped: list = field(default_factory=list)  # keys no instance reads this epoch ("drop")
    last_batch_dropped: list = field(default_factory=list)  # keys of this instance's partial last batch
    workers_reported: int = 0
    complete: bool = False
    cache: dict = field(default_factory=dict)  # the node's shard cache, this instance's events (empty: no cache)
    # jpeg_decode="device": samples the workers decoded on the host instead (JPEGs the device decoder does not take)
    device_host_decoded: int = 0

    def add_worker(self, worker: WorkerReport) -> None:
        self.workers_reported += 1
        self.cache = merge_events(self.cache, worker.cache)
        self.skipped.extend(worker.skipped)
        self.substituted.extend(worker.substituted)
        self.last_batch_dropped.extend(worker.partial_dropped)

    def summary(self) -> str:
        text = (f"epoch {self.epoch}, instance {self.instance} of {self.instances}, {self.split}: "
                f"{self.samples} samples in {self.batches} batches (planned {self.planned_samples} in "
                f"{self.planned_batches}), policy {self.policy}"
                f"{' from ' + self.repartition if self.repartition else ''}; "
                f"skipped {len(self.skipped)}, substituted {len(self.substituted)}, padded {len(self.padded)}, "
                f"dropped by policy {len(self.policy_dropped)}, in the dropped last batch {len(self.last_batch_dropped)}")
        text += cache_summary(self.cache, "\n  ")
        for item in self.skipped[:10]:
            text += f"\n  skipped {item.key} in {item.shard}: {item.reason}"
        if len(self.skipped) > 10:
            text += f"\n  ... and {len(self.skipped) - 10} more skipped"
        return text

    def to_json(self) -> dict:
        return asdict(self)


