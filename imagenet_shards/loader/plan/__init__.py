"""Planning: which samples each instance and worker reads in an epoch, in which order, and where a resume
continues (share_plan, global_order, global_mix, epoch_planner; resume by job: shuffle_buffer, sub_order,
resume, ledger_writer).

Pure functions of the dataset's index, seed, epoch and instance layout: no reading, no torch.
"""

from imagenet_shards.loader.faces import lazy_exports

_EXPORTS = {
    "EpochPlanner": "epoch_planner",
    "GlobalOrder": "global_order",
    **{name: "share_plan" for name in ("GroupedOrder", "PlanError", "epoch_order", "epoch_sequence")},
    **{name: "resume" for name in ("EpochProgress", "ResumeError", "fingerprint")},
    **{name: "ledger_writer" for name in ("LEDGER_VERSION", "write_ledger")},
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
