"""One training job of the soak (benchmarks/soak.py): examples/train_imagenet.py under torchrun, in its own
session, watched from outside.

The job's step is read from the step log rank 0 appends after each step. Its processes (torchrun, the
ranks, their DataLoader workers) are found in /proc as descendants of the launcher; every PID ever seen
is kept, so the soak can prove at the end that none outlived it. Each process's memory is sampled from
/proc/PID/status: anonymous (RssAnon: heap, tensors) and file-backed (RssFile: mapped shards, libraries)
resident pages, which `top` shows summed as RES.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL = 0.02  # seconds between looks at the step log while a fault waits for its step


def children(pid: int) -> list:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(child) for child in handle.read().split()]
    except OSError:
        pass
    return found


def _stat(pid: int):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int, started=None) -> bool:
    """Running, not a zombie (and, given `started`, the process that started then: PIDs are reused)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z" and (started is None or int(fields[19]) == started)


def identity(pid: int):
    """(pid, start time in clock ticks): names one process even after its PID is reused; None if gone."""
    fields = _stat(pid)
    return (pid, int(fields[19])) if fields else None


def memory_kb(pid: int) -> tuple:
    """(RssAnon, RssFile) in kB, or None when the process is gone."""
    values = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                name, _, rest = line.partition(":")
                if name in ("RssAnon", "RssFile"):
                    values[name] = int(rest.split()[0])
    except OSError:
        return None
    return (values.get("RssAnon", 0), values.get("RssFile", 0)) if values else None


class Memory:
    """Peaks per role (launcher, rank, worker) of anonymous and file-backed RSS, and each rank's anonymous
    RSS from its first sample once its job trained WARMUP_STEPS steps to its last (flat after the
    warm-up: no leak). The growth over the second half of a rank's steps tells a leak (it keeps growing)
    from a settling heap (it does not): the uninterrupted reference run shows it over all its steps."""

    WARMUP_STEPS = 4

    def __init__(self):
        self.peaks = {}  # role -> [anon kB, file kB]
        self.ranks = {}  # pid -> [(steps done, anon kB)] after warm-up, a sample per step reached

    def sample(self, role: str, pid: int, steps_done: int) -> None:
        found = memory_kb(pid)
        if found is None:
            return
        peak = self.peaks.setdefault(role, [0, 0])
        peak[0], peak[1] = max(peak[0], found[0]), max(peak[1], found[1])
        if role == "rank" and steps_done >= self.WARMUP_STEPS:
            samples = self.ranks.setdefault(pid, [])
            if samples and samples[-1][0] == steps_done:
                samples[-1] = (steps_done, found[0])
            else:
                samples.append((steps_done, found[0]))

    def as_dict(self) -> dict:
        growth, second_half = [], []
        for samples in self.ranks.values():
            growth.append(samples[-1][1] - samples[0][1])
            middle = (samples[0][0] + samples[-1][0]) / 2
            second_half.append(samples[-1][1] - next(anon for done, anon in samples if done >= middle))
        return {"peak_mb": {role: {"anon": anon / 1024, "file": file / 1024} for role, (anon, file) in self.peaks.items()},
                "rank_anon_growth_after_warmup_mb": max(growth) / 1024 if growth else None,
                "rank_anon_growth_second_half_mb": max(second_half) / 1024 if second_half else None}


class TrainingJob:
    """torchrun + the example, started in a new session (killpg reaches all of it)."""

    def __init__(self, command: list, env: dict, cwd: Path, log: Path, step_log: Path, memory: Memory,
                 pids: set):
        self.step_log, self.memory, self.pids = step_log, memory, pids
        self.log_path = log
        self.log = open(log, "ab")
        self.process = subprocess.Popen(command, env=env, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
        self.started = time.monotonic()
        self.own = {identity(self.process.pid)}  # this job's processes, as (pid, start)
        self.pids.add(identity(self.process.pid))
        self.roles = {self.process.pid: "launcher"}
        self.last_step, self.first_step = 0, None
        # the log holds the earlier jobs' steps: this job's start where it ends now
        self._offset = step_log.stat().st_size if step_log.exists() else 0

    def step(self) -> int:
        """The last step rank 0 logged (the step log is appended to, across restarts)."""
        try:
            with open(self.step_log, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return self.last_step
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            try:
                self.last_step = json.loads(line)["step"]
            except (ValueError, KeyError):
                continue
            if self.first_step is None:
                self.first_step = self.last_step
        return self.last_step

    def survey(self) -> None:
        """Find the job's processes (and keep their PIDs), and sample their memory."""
        step = self.step()  # first: it sets first_step (the conditional below is evaluated before its left side)
        done = step - self.first_step if self.first_step is not None else 0
        for rank in children(self.process.pid):
            self.roles.setdefault(rank, "rank")
            for worker in children(rank):
                self.roles.setdefault(worker, "worker")
        for pid, role in list(self.roles.items()):
            if alive(pid):
                self.pids.add(identity(pid))
                self.own.add(identity(pid))
                self.memory.sample(role, pid, done)

    def ranks(self) -> dict:
        """{rank index: pid} of the live ranks (RANK from each one's environment)."""
        found = {}
        for pid in children(self.process.pid):
            try:
                with open(f"/proc/{pid}/environ", "rb") as handle:
                    env = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
                found[int(env[b"RANK"])] = pid
            except (OSError, KeyError, ValueError):
                pass
        return found

    def workers(self, rank_pid: int) -> list:
        return [pid for pid in children(rank_pid) if alive(pid)]

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_for_step(self, step: int, timeout_s: float) -> bool:
        """Until the run reached `step` (True) or the job ended (False); surveys meanwhile."""
        deadline = time.monotonic() + timeout_s
        surveyed = 0.0
        while time.monotonic() < deadline:
            if self.step() >= step:
                return True
            if not self.running():
                return self.step() >= step
            if time.monotonic() - surveyed > 0.5:
                self.survey()
                surveyed = time.monotonic()
            time.sleep(POLL)
        raise TimeoutError(f"the job did not reach step {step} in {timeout_s:.0f} s (last step {self.step()}); "
                           f"log: {self.log_path}")

    def wait(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while self.running():
            if time.monotonic() > deadline:
                self.kill_all()
                raise TimeoutError(f"the job did not end in {timeout_s:.0f} s; killed; log: {self.log_path}")
            self.survey()
            time.sleep(0.2)
        self.log.close()
        return self.process.returncode

    def kill_all(self) -> None:
        """SIGKILL every process of the job (launcher, ranks, workers), as a scheduler ending it does. Not
        only the launcher's session: torchrun starts each rank in a session of its own, and ranks whose
        launcher was killed alone train on as orphans."""
        tree, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo += children(pid)
        for pid in tree:
            kill(pid)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def leaked(pids: set, grace_s: float = 10.0) -> list:
    """The PIDs of `pids` ((pid, start) pairs) still alive after up to `grace_s` (a worker notices its
    parent's death in a moment)."""
    pids = {found for found in pids if found}
    left = []
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left = [pid for pid, started in sorted(pids) if alive(pid, started)]
        if not left:
            return []
        time.sleep(0.2)
    return left


def torchrun_command(ranks: int, script: Path, args: list) -> list:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
            str(script), *map(str, args)]
