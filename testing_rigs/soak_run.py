"""The soak's run (benchmarks/soak.py): the store, the jobs, and the schedule's faults injected into them.

A Soak owns one output folder. Its named parts are the only places anything is written:
  dataset/  the sample dataset, converted to img (built once, reused)
  store/    SeaweedFS's files            cache/        the shard cache (cache_dir)
  checkpoints/  the example's checkpoint ledgers/   its order ledgers, one per epoch and rank
  logs/     each job's output, the step log and the keys log (also the jobs' working folder)
  tmp/      TMPDIR of the jobs: nothing but torch's and multiprocessing's own may be left there. When
            the folder's path is too long for a Unix socket under it (get_data refuses it), a short
            folder /tmp/soak-tmp-* stands in, is checked the same way, and is removed at the end
  reference/    the uninterrupted run (the same parts inside), reused while its settings match
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from testing_rigs.fault_proxy import FaultProxy
from testing_rigs.s3_server import SeaweedServer
from testing_rigs.soak_job import Memory, TrainingJob, kill, leaked, torchrun_command
from testing_rigs.soak_schedule import ENDS_THE_JOB, RANKS, Fault, Schedule, checkpoint_kill_to_arm

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "train_imagenet.py"
BUCKET = "soak"
SHORT_TMP = 60  # characters: the socket paths multiprocessing makes under TMPDIR fit 108 bytes
NAMED = ("dataset", "store", "cache", "checkpoints", "ledgers", "logs", "tmp", "reference", "soak.json")


@dataclass
class Settings:
    steps: int
    seed: int
    arch: str = "resnet18"
    workers: int = 2
    batch_size: int = 4
    image_size: int = 16
    checkpoint_every: int = 4
    classes: int = 4
    train_per_class: int = 16
    samples_per_shard: int = 8
    cache_limit: int = 1_500_000  # bytes: about 40% of the train shards, so every epoch reads the store
    read_timeout: float = 2.0
    retries: int = 3
    job_timeout_s: float = 600.0

    def training_args(self) -> list:
        return ["--data", f"s3://{BUCKET}/img", "--arch", self.arch, "--image-size", self.image_size,
                "--global-batch-size", self.batch_size * RANKS, "--workers", self.workers, "--max-steps", self.steps,
                "--epochs", 10_000, "--seed", self.seed, "--no-val", "--checkpoint-every", self.checkpoint_every,
                "--print-every", 10_000, "--cache-limit", self.cache_limit]

    def reference_key(self) -> str:
        fields = {k: v for k, v in vars(self).items() if k not in ("job_timeout_s", "read_timeout", "retries")}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def python_env(extra: dict) -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def prepare_dataset(out: Path, settings: Settings) -> Path:
    """The sample dataset converted to img under out/dataset (reused when present)."""
    from imagenet_shards.sample import build_sample_dataset

    target = out / "dataset" / "img"
    if (target / "metadata.json").exists():
        return target
    source = out / "dataset" / "source"
    shutil.rmtree(out / "dataset", ignore_errors=True)
    build_sample_dataset(source, classes=settings.classes, train_per_class=settings.train_per_class,
                         val_per_class=2, seed=0)
    result = subprocess.run([sys.executable, str(REPO / "create_webdataset.py"), "--source", str(source),
                             "--target", str(target), "--format", "img", "--samples-per-shard",
                             str(settings.samples_per_shard), "--seed", "0", "--no-progress"],
                            capture_output=True, text=True, env=python_env({}))
    if result.returncode != 0:
        raise RuntimeError(f"converting the soak's dataset failed: {result.stderr[-2000:]}")
    return target


class Store:
    """SeaweedFS under out/store with the dataset uploaded, behind a FaultProxy."""

    def __init__(self, out: Path, dataset: Path):
        shutil.rmtree(out / "store", ignore_errors=True)
        self.server = SeaweedServer(out / "store").start()
        self.server.create_bucket(BUCKET)
        upload = subprocess.run([sys.executable, str(REPO / "upload_dataset.py"), str(dataset), f"s3://{BUCKET}/img",
                                 "--s3-endpoint", self.server.endpoint, "--no-progress"], capture_output=True,
                                text=True, env=python_env(self.server.env()))
        if upload.returncode != 0:
            self.server.stop()
            raise RuntimeError(f"uploading the soak's dataset failed: {upload.stderr[-2000:]}")
        self.proxy = FaultProxy(self.server.endpoint)

    def close(self) -> None:
        self.proxy.close()
        self.server.stop()


class Run:
    """One run (the reference or the soak) in `root`: its jobs, restarts, processes and memory."""

    def __init__(self, root: Path, settings: Settings, store: Store):
        self.root, self.settings, self.store = root, settings, store
        for name in ("cache", "checkpoints", "ledgers", "logs", "tmp"):
            shutil.rmtree(root / name, ignore_errors=True)
            (root / name).mkdir(parents=True)
        self.tmp = root / "tmp"
        if len(str(self.tmp)) > SHORT_TMP:  # DataLoader workers need a short TMPDIR (a socket's path under it)
            self.tmp = Path(tempfile.mkdtemp(prefix="soak-tmp-"))
        self.memory, self.pids, self.jobs, self.current = Memory(), set(), [], None
        self.env = python_env({**store.server.env(), "DATASETS_S3_ENDPOINT": store.proxy.endpoint,
                               "DATASETS_S3_RETRIES": str(settings.retries),
                               "DATASETS_READ_TIMEOUT": str(settings.read_timeout), "TMPDIR": str(self.tmp)})

    def start(self, ranks: int, resume: bool, kill_in_checkpoint_write=None) -> TrainingJob:
        root = self.root
        args = [*self.settings.training_args(), "--checkpoint", root / "checkpoints" / "checkpoint.pt",
                "--step-log", root / "logs" / "steps.jsonl", "--keys-log", root / "logs" / "keys",
                "--ledger", root / "ledgers", "--cache-dir", root / "cache"]
        if resume:
            args.append("--resume")
        if kill_in_checkpoint_write is not None:
            args += ["--kill-in-checkpoint-write", kill_in_checkpoint_write]
        log = root / "logs" / f"job{len(self.jobs)}.log"
        job = TrainingJob(torchrun_command(ranks, SCRIPT, args), self.env, root / "logs", log,
                          root / "logs" / "steps.jsonl", self.memory, self.pids)
        self.jobs.append({"job": len(self.jobs), "ranks": ranks, "resume": resume, "log": str(log)})
        self.current = job
        return job

    def finish(self, job: TrainingJob) -> int:
        code = job.wait(self.settings.job_timeout_s)
        self.jobs[-1]["exit"] = code
        self.jobs[-1]["last_step"] = job.step()
        # the next job starts only once none of this one's processes is left (a rank or worker that
        # outlived its launcher would train on beside it); one that is left after 30 s is a finding
        lingering = leaked(job.own, grace_s=30.0)
        if lingering:
            self.jobs[-1]["outlived_the_job"] = lingering
            for pid in lingering:
                kill(pid)
        return code


def run_reference(out: Path, settings: Settings, store: Store) -> dict:
    """The uninterrupted run (no faults, 2 ranks), reused while out/reference/reference.json matches."""
    root = out / "reference"
    saved = root / "reference.json"
    if saved.exists():
        found = json.loads(saved.read_text())
        if found.get("key") == settings.reference_key() and found.get("digest"):
            return found
    run = Run(root, settings, store)
    started = time.monotonic()
    job = run.start(RANKS, resume=False)
    try:
        code = run.finish(job)
    finally:
        job.kill_all()  # a hung reference (finish timed out) leaves nothing running
        if run.tmp != root / "tmp":
            shutil.rmtree(run.tmp, ignore_errors=True)
    digest = final_digest(Path(run.jobs[-1]["log"]))
    if code != 0 or not digest:
        raise RuntimeError(f"the reference run failed (exit {code}); log: {run.jobs[-1]['log']}")
    found = {"key": settings.reference_key(), "digest": digest, "minutes": (time.monotonic() - started) / 60,
             "root": str(root), "memory": run.memory.as_dict()}
    saved.write_text(json.dumps(found, indent=1))
    return found


def final_digest(log: Path):
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith("final parameters sha256 "):
            return line.split()[-1]
    return None


class Injector:
    """Injects one fault into the running job, the store or the cache; records what it did."""

    def __init__(self, run: Run, schedule: Schedule):
        self.run, self.schedule = run, schedule
        self.proxy = run.store.proxy
        self.outage_armed = None  # the outage within the retries whose dropped requests are not all met yet

    def rng(self, fault: Fault) -> random.Random:
        return random.Random(f"{self.schedule.seed}-{fault.step}-{fault.kind}")

    def inject(self, fault: Fault, job: TrainingJob) -> None:
        self.settle()
        getattr(self, fault.kind)(fault, job)

    def settle(self) -> None:
        """Mark the armed outage met once the proxy dropped all its requests (before another outage or
        a restore() resets the count)."""
        if self.outage_armed is not None:
            self.outage_armed.detail["met"] = self.proxy.down_requests == 0
            if self.outage_armed.detail["met"]:
                self.outage_armed = None

    def slowdown(self, fault, job):
        if self.proxy.slowdown:  # the last burst not met yet: a second on top would pass the retries (seed 5,
            fault.detail["skipped"] = "the previous 503 burst is not met yet"  # 640 steps: steps 497, 498)
            return
        self.proxy.slowdown = self.run.settings.retries  # a burst the retries absorb (retries + 1 attempts)

    def reset(self, fault, job):
        self.proxy.cut_path, self.proxy.cut_fraction, self.proxy.cut_body = ".tar", 0.5, 2

    def stall(self, fault, job):
        self.proxy.stall_path, self.proxy.stall_seconds = ".tar", self.run.settings.read_timeout + 1.5
        self.proxy.stall_mid_body = self.rng(fault).random() < 0.5
        fault.detail["mid_body"] = self.proxy.stall_mid_body
        self.proxy.stall = 1

    def outage(self, fault, job):
        self.proxy.outage(requests=2)
        self.outage_armed = fault

    def outage_past_retries(self, fault, job):
        self.outage_armed = None  # an earlier one not met by now: its count is replaced
        self.proxy.outage(seconds=10 ** 6)  # until the job stopped: restore() then

    def _cached_shard(self, fault):
        entries = sorted(p for p in (self.run.root / "cache").glob("*/*") if p.suffix == ".tar")
        return self.rng(fault).choice(entries) if entries else None

    def cache_bit_flip(self, fault, job):
        entry = self._cached_shard(fault)
        if entry is None:
            fault.detail["skipped"] = "nothing cached yet"
            return
        try:  # in place (r+b): an entry evicted meanwhile is not made again (seed 2, 640 steps)
            with open(entry, "r+b") as handle:
                stat = os.fstat(handle.fileno())
                data = bytearray(handle.read())
                offset = self.rng(fault).randrange(len(data) // 2, len(data))  # in the payloads, past the first header
                data[offset] ^= 1 << self.rng(fault).randrange(8)
                handle.seek(offset)
                handle.write(data[offset:offset + 1])
                handle.flush()
                os.utime(handle.fileno(), ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only the samples' CRC32C can tell
                self._record(fault, entry, data, offset=offset, inode=stat.st_ino)
        except (FileNotFoundError, ValueError):  # evicted between the choice and the write; or empty
            fault.detail["skipped"] = "the entry was evicted as it was chosen"

    def cache_truncate(self, fault, job):
        entry = self._cached_shard(fault)
        if entry is None:
            fault.detail["skipped"] = "nothing cached yet"
            return
        try:
            with open(entry, "r+b") as handle:
                inode = os.fstat(handle.fileno()).st_ino
                handle.truncate(os.fstat(handle.fileno()).st_size // 2)
                handle.seek(0)
                self._record(fault, entry, handle.read(), inode=inode)
        except FileNotFoundError:
            fault.detail["skipped"] = "the entry was evicted as it was chosen"

    def _record(self, fault, entry, data, **more):
        log = Path(self.run.jobs[-1]["log"])
        fault.detail.update(entry=str(entry), shard=entry.name, sha256=hashlib.sha256(bytes(data)).hexdigest(),
                            job=len(self.run.jobs) - 1, log_offset=log.stat().st_size, **more)

    def kill_rank(self, fault, job):
        ranks = job.ranks()
        index = self.rng(fault).choice(sorted(ranks))
        fault.detail["rank"] = index
        kill(ranks[index])

    def kill_worker(self, fault, job):
        ranks = job.ranks()
        index = self.rng(fault).choice(sorted(ranks))
        workers = job.workers(ranks[index])
        if not workers:
            fault.detail["skipped"] = f"rank {index} had no worker"
            return
        fault.detail["rank"] = index
        kill(self.rng(fault).choice(workers))

    def kill_job(self, fault, job):
        job.kill_all()

    def kill_in_checkpoint_write(self, fault, job):
        pass  # the job was started with --kill-in-checkpoint-write STEP: rank 0 kills itself there


def run_schedule(out: Path, settings: Settings, schedule: Schedule, store: Store, deadline: float) -> dict:
    """The soak: start, inject each fault once its step is reached, restart after each one that ends the
    job, until the steps are done (or the time budget, checked between restarts, is spent). A job that
    fails with no fault to end it, or hangs, stops the soak: the error is the first problem reported."""
    run = Run(out, settings, store)
    soaked = {"run": run, "restarts": 0, "stopped_early": False, "error": None}
    injector = Injector(run, schedule)
    try:
        _drive(run, injector, list(schedule.faults), soaked, deadline)
    except (RuntimeError, TimeoutError) as error:
        soaked["error"] = str(error)
    finally:
        if run.current is not None and run.current.running():
            run.current.kill_all()
        injector.settle()
    soaked["store_faults"] = list(store.proxy.faults)
    return soaked


def _drive(run: Run, injector: Injector, pending: list, soaked: dict, deadline: float) -> None:
    ranks, resume, proxy = RANKS, False, run.store.proxy
    while True:
        job = run.start(ranks, resume, checkpoint_kill_to_arm(pending))
        ended = done = False
        while pending and not ended:
            fault = pending[0]
            if not job.wait_for_step(fault.step, run.settings.job_timeout_s) \
                    and fault.kind != "kill_in_checkpoint_write":
                break  # the job ended before the step (it failed): handled below
            pending.pop(0)
            fault.injected_at = job.step()
            injector.inject(fault, job)
            if fault.kind in ENDS_THE_JOB:
                code = run.finish(job)
                fault.detail.update(exit=code, job=len(run.jobs) - 1)
                if fault.kind == "outage_past_retries":
                    proxy.restore()
                    fault.detail["store_line"] = store_line(Path(run.jobs[-1]["log"]), proxy.endpoint)
                ranks, ended, done = fault.ranks_after, True, code == 0  # 0: it finished all the same
        if done:
            return
        if not ended:
            code = run.finish(job)
            if code == 0:
                return
            raise RuntimeError(f"job {len(run.jobs) - 1} failed (exit {code}) with no fault that ends it; "
                               f"log: {run.jobs[-1]['log']}")
        resume = True
        soaked["restarts"] += 1
        if time.monotonic() > deadline:
            soaked["stopped_early"] = True
            return


def store_line(log: Path, endpoint: str):
    """The one line the example printed naming the store (StorageUnavailable), or None."""
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("train_imagenet.py:") and endpoint in line:
            return line
    return None
