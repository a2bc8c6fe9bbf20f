"""Where a dataset's bytes come from: local paths, http(s) URLs and S3 objects (`s3://BUCKET/KEY`).

Everything above this module (sources, shard reader, validator, uploader) names a location as a
string and asks for its bytes, a byte range of it, whether it exists, or its listing; only this
module knows the transports.

S3 (any S3-compatible store: AWS, MinIO, Ceph, SeaweedFS):
  * endpoint, in order: `configure_s3(endpoint=...)` (the `--s3-endpoint` option of every command),
    then AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (read by botocore itself), then S3_ENDPOINT_URL
    (what Mosaic and litdata users set). Path-style addressing whenever an endpoint is set.
    Credentials, profile and region come from boto3's normal chain.
  * one boto3 client per process, made on first use and never pickled (a forked DataLoader worker
    makes its own); retries in botocore's standard mode (5xx, SlowDown, connection errors),
    `--s3-retries` of them (DATASETS_S3_RETRIES), each read waiting at most `--read-timeout` seconds
    (DATASETS_READ_TIMEOUT, default 60; http(s) reads too); checksums computed and validated only when an operation requires
    them (boto3 >= 1.36's defaults break ranged GETs on some S3-compatible stores).
  * a byte range is one streamed GET. If the body breaks, reading resumes at the next byte with
    `If-Match` on the first response's ETag: an object replaced meanwhile is
    `ShardChangedError` ("shard changed while reading"), never a splice of two versions.
    `Content-Range` is trusted over the status code (some servers answer a range with 200).

Two kinds of failure, kept apart on purpose:
  * data problems (a missing object, a changed object) are OSErrors (`FileNotFoundError`,
    `ShardChangedError`): the loader reports them per sample through its `on_error`;
  * infrastructure problems (endpoint unreachable after the retries, bad credentials, no such
    bucket) are `StorageUnavailable`, which the loader does not catch: the epoch stops with a
    message naming endpoint, bucket and key, and an outage never becomes a silently short epoch.
"""

from __future__ import annotations

import io
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Optional

from braceexpand import braceexpand

from imagenet_shards.errors import DatasetError, Error
from imagenet_shards.safe_names import redact, relative_name
from imagenet_shards.storage_hooks import record_body_bytes, record_request, record_ttfb

log = logging.getLogger(__name__)
DEFAULT_READ_TIMEOUT = 60.0  # seconds a read may wait for bytes (S3 and http(s)) before it counts as failed
S3_DEFAULT_RETRIES = 5
# Settings given on a command line travel to DataLoader workers, spawned processes and subprocesses
# in the environment (a client never travels: each process makes its own).
ENDPOINT_VARIABLE = "DATASETS_S3_ENDPOINT"
RETRIES_VARIABLE = "DATASETS_S3_RETRIES"
READ_TIMEOUT_VARIABLE = "DATASETS_READ_TIMEOUT"  # seconds, S3 and http(s); a stalled store fails (and is retried) sooner
_AUTH_ERRORS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                "InvalidToken", "AuthorizationHeaderMalformed", "InvalidSecurity", "403"}
_CHECKSUM_ERRORS = {"BadDigest", "InvalidDigest", "XAmzContentSHA256Mismatch", "XAmzContentChecksumMismatch",
                    "InvalidChecksum"}
_warned_no_range = set()
# The most bytes read_bytes takes from a file, URL or object (metadata, index, manifest) unless told otherwise:
# a hostile store cannot make a process allocate more than this (env DATASETS_MAX_READ_BYTES).
READ_LIMIT_VARIABLE = "DATASETS_MAX_READ_BYTES"
DEFAULT_READ_LIMIT = 4 << 30
METADATA_READ_LIMIT = 64 << 20  # metadata.json and repartition manifests (ImageNet's: under 1 MB)
_SMALL_FILES = ("metadata.json", "manifest.json")


class ShardReadError(Error):
    """A shard or sample that cannot be read: names the shard (and the key when known)."""


class ShardTruncatedError(ShardReadError, OSError):
    """The object ended before the byte range asked for: it is shorter than its index says."""


class ShardChangedError(Error, OSError):
    """The object was replaced while it was being read (its ETag changed)."""


class ChecksumMismatchError(Error, OSError):
    """The server refused an upload whose bytes do not match the checksum sent with them."""


class StorageUnavailable(Error, RuntimeError):
    """The store cannot be used at all (unreachable, bad credentials, no such bucket): names endpoint,
    bucket and key. Not caught per sample: it stops the epoch."""


# ----------------------------------------------------------------------------------- locations


def is_s3(location) -> bool:
    return str(location).startswith("s3://")


def is_url(location) -> bool:
    """A remote location (http(s):// or s3://), read through this module rather than the file system."""
    return str(location).startswith(("http://", "https://", "s3://"))


def expand_locations(source) -> list:
    """A path, URL or brace pattern (or a list of them) -> the list of shard locations."""
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    locations = []
    for item in items:
        locations.extend(braceexpand(str(item)))
    return locations


def join_location(base: str, name: str) -> str:
    """`name` (plain names joined by `/`: imagenet_shards.safe_names) under the folder, prefix or URL `base`;
    UnsafeNameError for a name that would leave it (`..`, an absolute path, a URL)."""
    relative_name(name, base)
    if is_s3(base):
        return base.rstrip("/") + "/" + name
    if is_url(base):
        return base.split("?", 1)[0].rstrip("/") + "/" + urllib.parse.quote(name)
    return os.path.join(base, name)


def read_limit() -> int:
    text = os.environ.get(READ_LIMIT_VARIABLE)
    return int(text) if text and text.isdigit() else DEFAULT_READ_LIMIT


def read_capped(stream, limit: int, location) -> bytes:
    """All of `stream`, read in chunks; DatasetError naming `location` once it holds more than `limit` bytes."""
    parts, total = [], 0
    while chunk := stream.read(min(1 << 20, limit + 1 - total)):
        parts.append(chunk)
        total += len(chunk)
        if total > limit:
            raise DatasetError(f"{redact(location)}: larger than {limit:,} bytes, the most read for it "
                               f"(a hostile or wrong file; {READ_LIMIT_VARIABLE} raises the cap)")
    return b"".join(parts)


def split_s3(location: str) -> tuple:
    """'s3://bucket/some/key' -> ('bucket', 'some/key')."""
    bucket, _, key = str(location)[len("s3://"):].partition("/")
    if not bucket:
        raise ValueError(f"{redact(location)}: not an s3://BUCKET/KEY location")
    return bucket, key


def read_bytes(location: str, limit: Optional[int] = None) -> bytes:
    """The whole content of a small file, URL or object (metadata, index, manifest), read in chunks and at
    most `limit` bytes (default read_limit(): DatasetError past it). FileNotFoundError when it does not exist."""
    if limit is None:
        small = str(location).split("?", 1)[0].endswith(_SMALL_FILES)
        limit = min(read_limit(), METADATA_READ_LIMIT) if small else read_limit()
    if is_s3(location):
        with open_byte_range(location, 0, None) as stream:
            return read_capped(stream, limit, location)
    if is_url(location):
        try:
            with _urlopen(urllib.request.Request(location)) as response:
                return read_capped(response, limit, location)
        except urllib.error.HTTPError as error:
            raise FileNotFoundError(f"{redact(location)}: HTTP {error.code} {error.reason}") from None
        except urllib.error.URLError as error:
            raise ShardReadError(f"{redact(location)}: cannot connect: {error.reason}") from None
    with open(location, "rb") as handle:
        return read_capped(handle, limit, location)


def exists(location: str) -> bool:
    if is_s3(location):
        return head_object(location) is not None
    if is_url(location):
        request = urllib.request.Request(location, method="HEAD")
        try:
            with _urlopen(request):
                return True
        except urllib.error.HTTPError:
            return False
        except urllib.error.URLError as error:
            raise ShardReadError(f"{redact(location)}: cannot connect: {error.reason}") from None
    return os.path.exists(location)


def _discard(stream, count: int, location: str) -> None:
    chunk = 1 << 20
    while count > 0:
        data = stream.read(min(chunk, count))
        if not data:
            raise ShardTruncatedError(f"{redact(location)}: truncated: the shard ended before the requested byte range")
        count -= len(data)


def open_byte_range(location: str, start: int, stop: Optional[int]):
    """A readable binary stream positioned at byte `start` of a remote `location`, ending at `stop`
    (None: the end). S3: see the module docstring (resumed, checked against changes)."""
    if is_s3(location):
        return io.BufferedReader(S3RangeReader(location, start, stop), buffer_size=1 << 20)
    headers = {}
    if start or stop is not None:
        headers["Range"] = f"bytes={start}-{'' if stop is None else stop - 1}"
    try:
        response = _urlopen(urllib.request.Request(location, headers=headers))
    except urllib.error.HTTPError as error:
        raise ShardReadError(f"{redact(location)}: HTTP {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        raise ShardReadError(f"{redact(location)}: cannot connect: {error.reason}") from None
    content_range = response.headers.get("Content-Range", "")
    if response.status == 206 or content_range:  # Content-Range over the status code
        if not content_range.startswith(f"bytes {start}-"):
            response.close()
            raise ShardReadError(f"{redact(location)}: asked for bytes {start}-, the server sent {content_range!r}")
        return response
    _note_no_range(location, start)
    _discard(response, start, location)
    return response


def _urlopen(request: urllib.request.Request):
    """One http(s) request, recorded (imagenet_shards.storage_hooks) as it is sent, and a GET's time to the
    response headers once they arrive."""
    record_request(f"http_{request.get_method().lower()}")
    began = time.perf_counter()
    response = urllib.request.urlopen(request, timeout=read_timeout())
    if request.get_method() == "GET":
        record_ttfb(time.perf_counter() - began)
        record_body_bytes(response.headers.get("Content-Length"))
    return response


def _note_no_range(location: str, start: int) -> None:
    if start and location not in _warned_no_range:
        _warned_no_range.add(location)
        log.info("%s: the server ignores Range requests; reading from the start and skipping %d bytes",
                 redact(location), start)


# ----------------------------------------------------------------------------------- S3


def configure_s3(endpoint: Optional[str] = None, retries: Optional[int] = None,
                 read_timeout: Optional[float] = None) -> None:
    """Settings from a command line (`--s3-endpoint`, `--s3-retries`, `--read-timeout`) for this process
    and every process it starts. Clients made before are dropped."""
    if endpoint:
        os.environ[ENDPOINT_VARIABLE] = endpoint
    if retries is not None:
        if retries < 0:
            raise ValueError(f"--s3-retries must be >= 0, got {retries}")
        os.environ[RETRIES_VARIABLE] = str(retries)
    if read_timeout is not None:
        if not read_timeout > 0:
            raise ValueError(f"--read-timeout must be > 0 seconds, got {read_timeout}")
        os.environ[READ_TIMEOUT_VARIABLE] = str(read_timeout)
    _clients.clear()


def read_timeout() -> float:
    """Seconds a read waits for bytes before it fails (and is retried): READ_TIMEOUT_VARIABLE, else 60."""
    text = os.environ.get(READ_TIMEOUT_VARIABLE)
    if not text:
        return DEFAULT_READ_TIMEOUT
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{READ_TIMEOUT_VARIABLE}={text!r}: not a number of seconds > 0")
    return seconds


@dataclass
class S3Client:
    client: object
    endpoint: str
    credentials: str  # where the credentials came from (boto3's provider name), for messages


_clients = {}
_clients_lock = threading.Lock()


def forget_clients() -> None:
    """Drop this process's S3 clients: the next request makes one with the settings then in force."""
    _clients.clear()


def s3_client() -> S3Client:
    """This process's client (made lazily; a forked child makes its own on first use)."""
    key = (os.getpid(), os.environ.get(ENDPOINT_VARIABLE), os.environ.get(RETRIES_VARIABLE),
           os.environ.get(READ_TIMEOUT_VARIABLE))
    client = _clients.get(key)
    if client is None:
        with _clients_lock:
            client = _clients.get(key) or _make_client()
            _clients[key] = client
    return client


_service_models = None  # botocore's data loader, its parsed JSON cached: shared by the clients of a process tree


def _botocore_session():
    """A new botocore session that shares this process's data loader: the S3 service model's JSON is parsed
    once (~0.2 CPU-s), not again for each client, and a forked DataLoader worker, which makes its own client
    every epoch, inherits it parsed. A loader only caches files; credentials stay each session's own."""
    global _service_models
    import botocore.session

    session = botocore.session.get_session()
    if _service_models is None:
        _service_models = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _service_models)
    return session


def _make_client() -> S3Client:
    import boto3
    from botocore.config import Config

    endpoint = os.environ.get(ENDPOINT_VARIABLE) or None
    if endpoint is None and not (os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")):
        endpoint = os.environ.get("S3_ENDPOINT_URL") or None
    native_endpoint = bool(os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    retries = int(os.environ.get(RETRIES_VARIABLE, S3_DEFAULT_RETRIES))
    config = Config(
        retries={"mode": "standard", "total_max_attempts": retries + 1},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        connect_timeout=min(10.0, read_timeout()),
        read_timeout=read_timeout(),
        max_pool_connections=16,
        s3={"addressing_style": "path"} if endpoint or native_endpoint else {},
    )
    session = boto3.session.Session(botocore_session=_botocore_session())
    paths = _service_models.search_paths  # boto3 adds its data folder to the shared loader again for each session
    paths[:] = dict.fromkeys(paths)
    credentials = session.get_credentials()
    source = credentials.method if credentials is not None else "none found"
    client = session.client("s3", endpoint_url=endpoint, config=config)
    return S3Client(client, client.meta.endpoint_url, source)


def _where(s3: S3Client, bucket: str, key: Optional[str]) -> str:
    return f"s3://{bucket}/{key or ''} (endpoint {redact(s3.endpoint)})"


def _classify(error, s3: S3Client, bucket: str, key: Optional[str], operation: str):
    """A botocore exception -> the exception to raise (see the module docstring)."""
    from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

    where = _where(s3, bucket, key)
    if isinstance(error, (NoCredentialsError, PartialCredentialsError)):
        return StorageUnavailable(f"{where}: no usable credentials ({error}); set AWS_ACCESS_KEY_ID/"
                                  f"AWS_SECRET_ACCESS_KEY, a profile or an instance role")
    if isinstance(error, ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code == "NoSuchBucket":
            return StorageUnavailable(f"{where}: no such bucket {bucket!r}")
        if code in ("NoSuchKey", "404", "NotFound"):
            return FileNotFoundError(f"{where}: no such object")
        if code in ("PreconditionFailed", "412"):
            return ShardChangedError(f"{where}: shard changed while reading (its ETag no longer matches)")
        if code in _CHECKSUM_ERRORS:
            return ChecksumMismatchError(f"{where}: the server refused the bytes: {code} (corrupted in transit?)")
        if code in _AUTH_ERRORS or status == 403:
            return StorageUnavailable(f"{where}: {operation} refused: {code} (credentials from "
                                      f"{s3.credentials}); check the access key and secret")
        return StorageUnavailable(f"{where}: {operation} failed: {code or status}: {error}")
    return StorageUnavailable(f"{where}: {operation} failed after the retries: {type(error).__name__}: {error}")


def _call(operation: str, bucket: str, key: Optional[str], **kwargs):
    from botocore.exceptions import BotoCoreError, ClientError

    s3 = s3_client()
    record_request(operation)  # as it is sent (botocore's retries of it are not counted)
    try:
        return getattr(s3.client, operation)(Bucket=bucket, **({"Key": key} if key is not None else {}), **kwargs)
    except (ClientError, BotoCoreError) as error:
        raise _classify(error, s3, bucket, key, operation) from None


def head_object(location: str) -> Optional[dict]:
    """The object's HEAD answer (with stored checksums, where the server keeps them), or None when
    there is no such object. StorageUnavailable when the bucket itself is missing."""
    bucket, key = split_s3(location)
    try:
        return _call("head_object", bucket, key, ChecksumMode="ENABLED")
    except FileNotFoundError:
        # HEAD has no error body: a missing bucket looks like a missing key until asked.
        _call("head_bucket", bucket, None)
        return None


def list_objects(prefix_location: str) -> dict:
    """{name relative to the prefix: (size, ETag)} of every object under `s3://bucket/prefix/`."""
    bucket, prefix = split_s3(prefix_location)
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    objects = {}
    token = None
    while True:
        extra = {"ContinuationToken": token} if token else {}
        answer = _call("list_objects_v2", bucket, None, Prefix=prefix, **extra)
        for item in answer.get("Contents", []):
            objects[item["Key"][len(prefix):]] = (item["Size"], item.get("ETag", "").strip('"'))
        if not answer.get("IsTruncated"):
            return objects
        token = answer["NextContinuationToken"]


def sha256_base64(hex_digest: str) -> str:
    """S3's ChecksumSHA256 form of a hex sha256: base64 of the raw digest."""
    import base64

    return base64.b64encode(bytes.fromhex(hex_digest)).decode()


def put_object(location: str, body, **kwargs) -> dict:
    bucket, key = split_s3(location)
    return _call("put_object", bucket, key, Body=body, **kwargs)


def delete_object(location: str) -> None:
    bucket, key = split_s3(location)
    _call("delete_object", bucket, key)


_BROKEN_BODY = None


def _broken_body_errors() -> tuple:
    """Exceptions that mean 'the response body broke off' (resume), from botocore and urllib3."""
    global _BROKEN_BODY
    if _BROKEN_BODY is None:
        import http.client

        import urllib3.exceptions
        from botocore.exceptions import IncompleteReadError, ReadTimeoutError, ResponseStreamingError

        _BROKEN_BODY = (urllib3.exceptions.HTTPError, http.client.HTTPException, IncompleteReadError,
                        ReadTimeoutError, ResponseStreamingError, ConnectionError, TimeoutError)
    return _BROKEN_BODY


class S3RangeReader(io.RawIOBase):
    """Bytes [start, stop) of one S3 object as a raw stream: one streamed GET, resumed where it
    broke off (If-Match on the first ETag) up to the retry count without progress."""

    def __init__(self, location: str, start: int, stop: Optional[int]):
        super().__init__()
        self.location = location
        self.bucket, self.key = split_s3(location)
        self.position = start
        self.stop = stop
        self.etag = None
        self.body = None
        self.failures = 0
        self.max_failures = int(os.environ.get(RETRIES_VARIABLE, S3_DEFAULT_RETRIES)) + 1
        self._open()

    def _open(self) -> None:
        if self.stop is not None and self.position >= self.stop:
            self.body = None
            return
        wanted = f"bytes={self.position}-{'' if self.stop is None else self.stop - 1}"
        extra = {"IfMatch": self.etag} if self.etag else {}
        if self.position or self.stop is not None:  # no Range for a whole object: `bytes=0-` of an empty one is 416
            extra["Range"] = wanted
        began = time.perf_counter()
        answer = _call("get_object", self.bucket, self.key, **extra)
        record_ttfb(time.perf_counter() - began)
        record_body_bytes(answer.get("ContentLength"))
        if self.etag is None:
            self.etag = answer.get("ETag")
        elif answer.get("ETag") and answer["ETag"] != self.etag:
            answer["Body"].close()
            raise ShardChangedError(f"{_where(s3_client(), self.bucket, self.key)}: shard changed while reading")
        body = answer["Body"]._raw_stream  # the urllib3 response: readinto the caller's buffer (urllib3 2.x copies once inside)
        content_range = answer.get("ContentRange") or ""
        if content_range:  # trusted over the status code
            sent_start = int(content_range.split()[1].split("-")[0])
            if sent_start != self.position:
                body.close()
                raise ShardReadError(f"{redact(self.location)}: asked for {wanted}, the server sent {content_range!r}")
            total = int(content_range.rsplit("/", 1)[1]) if not content_range.endswith("/*") else None
        else:  # the whole object (a server that ignores Range)
            _note_no_range(self.location, self.position)
            total = answer.get("ContentLength")
            _discard(body, self.position, self.location)
        if self.stop is None:
            self.stop = total
        self.body = body

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.stop is not None and self.position >= self.stop:
            return 0
        view = memoryview(buffer)
        if self.stop is not None:
            view = view[:self.stop - self.position]
        while True:
            if self.body is None:
                self._open()
                if self.body is None:
                    return 0
            try:
                count = self.body.readinto(view)
            except _broken_body_errors() as error:
                count, reason = 0, f"{type(error).__name__}: {error}"
            else:
                reason = "the body ended early"
            if count:
                self.position += count
                self.failures = 0
                return count
            if self.stop is None:  # unknown length and a clean end
                return 0
            self._resume(reason)

    def _resume(self, reason: str) -> None:
        self.failures += 1
        self._close_body()
        if self.failures > self.max_failures:
            raise StorageUnavailable(f"{_where(s3_client(), self.bucket, self.key)}: the response broke off at byte "
                                     f"{self.position} {self.failures} times ({reason})")
        log.info("%s: the response broke off at byte %d (%s); resuming", self.location, self.position, reason)

    def _close_body(self) -> None:
        if self.body is not None:
            self.body.close()
            self.body = None

    def close(self) -> None:
        self._close_body()
        super().close()
