"""metadata.json protects itself: a digest of its own canonical content, recorded inside it.

metadata.json is the root of every other check (each shard's sha256, each index's sha256, the
labels' class table, the preprocessing a loader must not repeat), so an edit to it would otherwise
go unnoticed: deleting `format_version` or setting a preprocessing field validated as "Dataset OK.".

    "metadata_digest": "sha256:<64 hex>"

is the sha256 of the canonical JSON of every other key (`canonical_bytes`: keys sorted, no
whitespace, UTF-8; the same content gives the same digest however the file is indented). The
reference harness reads only its own keys and its `checksum` leaves metadata.json out, so neither
sees this key. Every writer of a metadata.json goes through `imagenet_shards.index.write_metadata`, which
seals it (`sealed`).

`digest_status` is the one reading: OK, ABSENT (a dataset written before this key existed: valid,
with a note), or EDITED/MALFORMED (exit 1 in the validator, one warning in the loader). It never
raises on any JSON object.
"""

from __future__ import annotations

import hashlib
import json

DIGEST_KEY = "metadata_digest"
_PREFIX = "sha256:"

OK, ABSENT, EDITED, MALFORMED = "ok", "absent", "edited", "malformed"

ABSENT_NOTE = (f"metadata.json has no {DIGEST_KEY} (written before metadata.json recorded one): an edit to it "
               f"cannot be detected (a conversion with this version records one)")


def canonical_bytes(metadata: dict) -> bytes:
    """The bytes the digest covers: every key but DIGEST_KEY, as sorted, compact JSON in UTF-8."""
    content = {key: value for key, value in metadata.items() if key != DIGEST_KEY}
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=True).encode("utf-8", "surrogatepass")


def digest_of(metadata: dict) -> str:
    return _PREFIX + hashlib.sha256(canonical_bytes(metadata)).hexdigest()


def sealed(metadata: dict) -> dict:
    """A copy of `metadata` with DIGEST_KEY set to the digest of the rest (placed last)."""
    content = {key: value for key, value in metadata.items() if key != DIGEST_KEY}
    return {**content, DIGEST_KEY: digest_of(content)}


def digest_status(metadata) -> tuple:
    """(status, message) of a parsed metadata.json: (OK, ""), (ABSENT, ABSENT_NOTE), or (EDITED|MALFORMED,
    one line saying what is wrong). Never raises for a dict of JSON values."""
    if not isinstance(metadata, dict):
        return MALFORMED, "not a JSON object"
    if DIGEST_KEY not in metadata:
        return ABSENT, ABSENT_NOTE
    recorded = metadata[DIGEST_KEY]
    if not isinstance(recorded, str) or not recorded.startswith(_PREFIX) or len(recorded) != len(_PREFIX) + 64:
        return MALFORMED, f"{DIGEST_KEY} {str(recorded)[:80]!r} is not 'sha256:<64 hex digits>'"
    try:
        actual = digest_of(metadata)
    except (TypeError, ValueError) as error:  # not JSON-serialisable: cannot come from json.loads
        return MALFORMED, f"content cannot be digested: {error}"
    if actual != recorded:
        return EDITED, (f"edited since it was written: its content's sha256 is {actual[len(_PREFIX):][:16]}..., "
                        f"its {DIGEST_KEY} records {recorded[len(_PREFIX):][:16]}... (every check below trusts "
                        f"this file: restore it, or convert again)")
    return OK, ""
