"""The remainder policies: how T samples are dealt to N instances when N does not divide T.

One definition for the two places that deal samples: the repartitioner (imagenet_shards.repartition,
written to disk once) and the loader when no repartition exists (imagenet_shards.loader.plan.share_plan, at
run time, every epoch). Both give instance i the same number of samples under the same policy:

    spread  T//N each, the first T%N instances one more: every sample exactly once, counts differ
            by at most 1 (evaluation: the loop must handle the one-sample difference)
    drop    T//N each; the T%N samples left over are named and read by no instance
    pad     ceil(T/N) each; the missing ones are filled by repeating named samples

Defaults (`default_policy`): `train` -> `drop` (every instance must run the same number of steps
or a collective hangs; leaving out at most N-1 samples an epoch is negligible and, unlike
padding, weights no sample twice), every other split -> `spread` (evaluation must see every
sample exactly once).

Which samples are left out or repeated is the caller's business (the repartitioner moves as
little as possible; the loader deals contiguous runs of the epoch's order); this module only
counts. Pure, no imports: every layer may use it.
"""

from __future__ import annotations

from imagenet_shards.errors import Error

SPREAD, PAD, DROP = "spread", "pad", "drop"
POLICIES = (SPREAD, PAD, DROP)
DEFAULT_POLICY = {"train": DROP, "validation": SPREAD}


class UnknownPolicyError(Error, ValueError):
    """A policy name that is not one of POLICIES."""


def default_policy(split: str) -> str:
    return DROP if split == "train" else SPREAD


def check_policy(policy) -> str:
    """`policy` if it is one of POLICIES, else UnknownPolicyError naming it and the choices."""
    if policy not in POLICIES:
        raise UnknownPolicyError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
    return policy


def instance_counts(total: int, count: int, policy: str) -> list:
    """Samples each of `count` instances ends with when `total` are dealt under `policy`.

    sum(...) is `total` for spread, total - total % count for drop (the rest is left out) and
    count * ceil(total / count) for pad (the excess is repeats). `count` >= 1.
    """
    check_policy(policy)
    quotient, rest = divmod(total, count)
    if policy == SPREAD:
        return [quotient + (1 if i < rest else 0) for i in range(count)]
    if policy == DROP:
        return [quotient] * count
    return [quotient + (1 if rest else 0)] * count
