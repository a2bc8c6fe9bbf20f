"""The one rule for names that come from data (issue 45), and locations made safe to record or print.

Every name a dataset, an index, a listing or a manifest gives (a split, a shard, an index, a cache entry, an
S3 key under a prefix, a tar member written by tar_tools) becomes a path or URL only through `plain_name` or
`relative_name`:

    plain_name      one path component: no separator (`/`, `\\`), not `.` or `..`, no absolute path, no URL,
                    no control character, not empty;
    relative_name   components joined by `/`, each a plain name (S3 keys and repartition files under a prefix).

A name that breaks the rule is an UnsafeNameError (a DatasetError) naming the file it came from and the name.

`redact(location)` drops the userinfo (`user:pass@`) and the query string (presigned signatures, session
tokens) of a URL: every location that is recorded (metadata.json, ledgers) or printed goes through it.
"""

from __future__ import annotations

import re
import urllib.parse

from imagenet_shards.errors import DatasetError

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnsafeNameError(DatasetError, ValueError):
    """A name from data that would leave its folder or prefix: names the file it came from and the name."""


def _problem(name) -> str:
    if not isinstance(name, str):
        return "not a string"
    if not name:
        return "empty"
    if "://" in name:
        return "a URL, not a plain name"
    if name.startswith(("/", "\\")):
        return "an absolute path, not a plain name"
    if "/" in name or "\\" in name:
        return "holds a path separator"
    if name in (".", ".."):
        return "a relative folder reference"
    if _CONTROL.search(name):
        return "holds a control character"
    return ""


def plain_name(name, source) -> str:
    """`name` when it is a plain name (see the module docstring), else UnsafeNameError naming `source`."""
    problem = _problem(name)
    if problem:
        raise UnsafeNameError(f"{redact(str(source))}: unsafe name {name!r} ({problem})")
    return name


def relative_name(name, source) -> str:
    """`name` when it is plain names joined by `/` (no empty, `.` or `..` component, not absolute, no URL)."""
    if not isinstance(name, str) or not name or "://" in name or name.startswith(("/", "\\")):
        problem = _problem(name) or "an absolute path, not a plain name"
        raise UnsafeNameError(f"{redact(str(source))}: unsafe name {name!r} ({problem})")
    for part in name.split("/"):
        problem = _problem(part)
        if problem:
            raise UnsafeNameError(f"{redact(str(source))}: unsafe name {name!r} ({problem or 'empty component'})")
    return name


def is_plain_name(name) -> bool:
    return not _problem(name)


def is_relative_name(name) -> bool:
    """Whether `name` passes relative_name (plain names joined by `/`)."""
    return isinstance(name, str) and bool(name) and "://" not in name and not name.startswith(("/", "\\")) \
        and all(not _problem(part) for part in name.split("/"))


_URL = re.compile(r"""\b(?:https?|s3)://[^\s'"]*[^\s'":,;.)]""")  # a trailing ':' or '.' is the text's


def redact_text(text: str) -> str:
    """`text` (an error message, a report line) with every URL in it redacted."""
    return _URL.sub(lambda match: redact(match.group()), text) if "://" in text else text


def redact(location) -> str:
    """`location` without a URL's userinfo and query string (fragment too); a local path unchanged."""
    text = str(location)
    if "://" not in text:
        return text
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:
        return text.split("?", 1)[0].split("#", 1)[0]
    if "@" not in parts.netloc and not parts.query and not parts.fragment:
        return text
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = parts.netloc.rpartition("@")[2] if port is None else host + f":{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
