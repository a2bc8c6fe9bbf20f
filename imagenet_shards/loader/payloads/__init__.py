"""The loader's payload kinds, by name: the one place where a payload's kind becomes decoding code.

    from imagenet_shards.loader.payloads import PAYLOADS, get_payload
    kind = get_payload("npy")                          # the kind that decodes a member "<key>.npy"
    PAYLOADS[kind.name].into(pipeline, payload, slot, rng, bbox, source)

A source kind (imagenet_shards/loader/source_kinds/) names each raw sample's payload kind, from its member
extension (`get_payload(ext).name`) or directly ("encoded" for image files, "array" for arrays);
the loader looks the name up here to write the sample into its batch slot. Adding a payload kind is
a module with one `PayloadKind` (see base.py for the contract) and one entry in `PAYLOADS`; no
loader change.
"""

from __future__ import annotations

from imagenet_shards.loader.payloads.base import PayloadKind
from imagenet_shards.loader.payloads.image import ENCODED
from imagenet_shards.loader.payloads.tensor import ARRAY, NPY, PTH
from imagenet_shards.errors import Error

PAYLOADS = {kind.name: kind for kind in (ENCODED, NPY, PTH, ARRAY)}
DEFAULT_PAYLOAD = ENCODED  # a member extension no kind claims is read as an encoded image


class UnknownPayloadError(Error, ValueError):
    """A payload kind name that no registered kind has."""


def get_payload(ext) -> PayloadKind:
    """The kind that decodes a member with extension `ext`: the one whose `extensions` hold it,
    else the encoded-image kind."""
    for kind in PAYLOADS.values():
        if ext in kind.extensions:
            return kind
    return DEFAULT_PAYLOAD


def payload_kind(name) -> PayloadKind:
    """The kind registered as `name` (a raw sample's `kind`)."""
    try:
        return PAYLOADS[name]
    except (KeyError, TypeError):
        raise UnknownPayloadError(f"unknown payload kind {name!r} (known: {', '.join(PAYLOADS)})") from None


__all__ = ["DEFAULT_PAYLOAD", "PAYLOADS", "PayloadKind", "UnknownPayloadError", "get_payload", "payload_kind"]
