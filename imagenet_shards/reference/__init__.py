"""Graphcore's reference harness (its PyTorch CNN tooling): everything this package does for its
layout, in one place. The rest of the package reaches it through two hooks, registered here on
import, and through the names below; nothing here imports from the loader, the validator or the
repartitioner (tools/layout.py places this package just above the formats).

    harness_metadata.py   its metadata.json: recognised (the hook in imagenet_shards.index.parse_metadata),
                    checked, read
    checksum.py     its folder checksum, checksumdir's md5 dirhash (metadata.json's `checksum`,
                    raw image folders, the published ImageNet values)
    pth.py          `.pth` payloads of its tensor datasets (torch.load weights_only); the hook
                    in imagenet_shards.formats.shard_check's payload checks
    layout.py       its datasets: shard names, the shard walk, the whole check, adopt, and the
                    loader's view of a dataset not adopted
    remainders.py   the remainder files its loader reads of a repartition: what they hold and
                    their writer (imagenet_shards.repartition.write calls it with its reader and write guard)
    checks.py       what the validator checks for it: metadata.json's checksum of our datasets,
                    the remainder files, a repartition it made, and check + adopt of its datasets

Importing any of these modules imports this package first, so a reader that uses it has the
hooks registered.
"""

from imagenet_shards.formats.shard_check import PAYLOAD_CHECKS
from imagenet_shards.index import METADATA_RECOGNISERS
from imagenet_shards.reference.harness_metadata import ReferenceMetadataError, read_reference_metadata, recognise  # noqa: F401
from imagenet_shards.reference.pth import pth_problem

if recognise not in METADATA_RECOGNISERS:
    METADATA_RECOGNISERS.append(recognise)
PAYLOAD_CHECKS.setdefault("pth", pth_problem)
