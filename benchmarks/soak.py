#!/usr/bin/env python
"""A soak (issue 35): train through storage faults, cache corruption and repeated kills, then check the
history against an uninterrupted run.

    python benchmarks/soak.py --steps S --seed X [--minutes M] [--out DIR]

examples/train_imagenet.py (resnet18 unless --arch, small images, CPU, gloo) runs under torchrun, 2 ranks x 2 workers,
reading the sample dataset from s3:// on a local SeaweedFS through the fault proxy, with the shard cache
on. The seed draws a schedule keyed by step (testing_rigs/soak_schedule.py): 503 bursts, resets
mid-body, stalls past the read timeout, an outage within the retries and one past them (the job must
stop with one line naming the store; the restart carries on once it is back), a bit flipped in a cached
shard, a cached shard truncated, and SIGKILL of a rank, of a DataLoader worker, of the whole job and of
rank 0 in the middle of a checkpoint's write. After each fault that ends the job the soak restarts it
from the last checkpoint (--resume), on 2 ranks or, in a rank-change schedule, on 1, 2 or 4, the
global batch kept (train_imagenet.py --global-batch-size: order="global", per-rank batch G/N), so a
rank-change run is checked to train on the reference's global batch at every step.

Then the checker (testing_rigs/soak_check.py). Writes DIR/soak.json and prints a table; exit 0 when
every check passed, 1 otherwise. The reference run (same steps and seed, no faults) is kept in
DIR/reference and reused while its settings match. --minutes is a budget: the soak stops restarting
once it is spent (the checks that need the whole run are then skipped and named).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testing_rigs import soak_check  # noqa: E402
from testing_rigs.soak_job import identity, leaked  # noqa: E402
from testing_rigs.soak_run import NAMED, Settings, Store, final_digest, prepare_dataset, run_reference, \
    run_schedule  # noqa: E402
from testing_rigs.soak_schedule import FAULT_KINDS, draw_schedule  # noqa: E402

STORE_FAULT_NAMES = {"slowdown": "slowdown", "cut_body": "reset", "stall": "stall", "stall_mid_body": "stall",
                     "outage": "outage"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, required=True, help="training steps of the run (global)")
    p.add_argument("--seed", type=int, required=True, help="draws the schedule; also the training seed")
    p.add_argument("--minutes", type=float, default=None, help="time budget: no restart after it")
    p.add_argument("--out", default="benchmark-output/soak", help="the soak's folder (its named parts only)")
    p.add_argument("--read-timeout", type=float, default=2.0, help="DATASETS_READ_TIMEOUT of the jobs, seconds")
    p.add_argument("--s3-retries", type=int, default=3, help="DATASETS_S3_RETRIES of the jobs")
    p.add_argument("--checkpoint-every", type=int, default=4)
    p.add_argument("--job-timeout", type=float, default=600.0,
                   help="seconds a job may go without reaching its next fault's step (or its end): then it is "
                        "killed and the soak fails naming it (a hang)")
    p.add_argument("--train-per-class", type=int, default=16, help="the sample dataset's size (4 classes)")
    p.add_argument("--arch", default="resnet18",
                   help="the example's torchvision model (a smaller one, e.g. shufflenet_v2_x0_5, trains the same "
                        "schedule for less CPU: what the soak checks does not depend on the model)")
    args = p.parse_args(argv)
    if args.steps < 20:
        p.error("--steps must be >= 20 (one of each fault kind, each at its own step)")
    return args


def injected_counts(schedule, store_faults) -> dict:
    """Faults injected, by kind: 503s, resets and stalls as the proxy met them; an outage when the proxy
    dropped all its requests; the rest as the soak did them (an outage past the retries: the job stopped)."""
    counts = {kind: 0 for kind in FAULT_KINDS}
    for name, _ in store_faults:
        if name != "outage":
            counts[STORE_FAULT_NAMES[name]] += 1
    for fault in schedule.faults:
        if fault.injected_at is None or "skipped" in fault.detail:
            continue
        if fault.kind == "outage":
            counts["outage"] += bool(fault.detail.get("met"))
        elif fault.kind == "outage_past_retries":
            counts["outage_past_retries"] += bool(fault.detail.get("exit"))
        elif fault.kind not in ("slowdown", "reset", "stall"):
            counts[fault.kind] += 1
    return counts


def check(out: Path, settings, schedule, soaked, reference, dataset, started) -> dict:
    run = soaked["run"]
    problems = []
    ledgers = soak_check.check_ledgers(out / "ledgers", dataset)
    problems += ledgers["problems"]
    digest = final_digest(Path(run.jobs[-1]["log"]))
    same_count = not schedule.rank_change
    equal = digest == reference["digest"] if digest else False
    if soaked["stopped_early"]:
        problems.append("stopped by --minutes before the last step: the final digest is not compared")
    elif same_count:
        if not equal:
            problems.append(f"final parameters {digest} differ from the reference's {reference['digest']}")
        problems += soak_check.check_batches(out / "logs" / "keys", Path(reference["root"]) / "logs" / "keys")
    else:  # the global order, G kept: the same global batch at each step on any rank count
        problems += soak_check.check_global_batches(out / "logs" / "keys", Path(reference["root"]) / "logs" / "keys")
    faults = [fault.as_dict() for fault in schedule.faults]
    problems += soak_check.check_cache_faults(faults, run.jobs)
    for fault in faults:
        if fault["kind"] == "outage_past_retries" and fault["detail"].get("exit") and not fault["detail"].get("store_line"):
            problems.append(f"the outage past the retries at step {fault['injected_at']}: the job stopped with no "
                            f"line naming the store")
    if soaked.get("error"):
        problems.append(soaked["error"])
    problems += [f"job {job['job']}: processes {job['outlived_the_job']} outlived it by 30 s" for job in run.jobs
                 if job.get("outlived_the_job")]
    left = leaked(run.pids | soaked["own_pids"])
    problems += [f"process {pid} still alive" for pid in left]
    found, third_party_tmp = soak_check.check_files(out, NAMED, run.tmp)
    problems += found
    if run.tmp != out / "tmp":
        shutil.rmtree(run.tmp, ignore_errors=True)
    counts = injected_counts(schedule, soaked["store_faults"])
    missing = [kind for kind, count in counts.items() if count == 0]
    if missing:  # drawn (every schedule holds each kind) but not met: that part of the soak tested nothing
        problems.append(f"fault kinds drawn but never injected: {', '.join(missing)}")
    return {"minutes": (time.monotonic() - started) / 60, "steps": settings.steps, "seed": settings.seed,
            "arch": settings.arch,
            "schedule": {**schedule.as_dict(), "faults": faults}, "injected": counts, "kinds_not_injected": missing,
            "restarts": soaked["restarts"], "jobs": run.jobs, "ledgers": ledgers, "digest": digest,
            "reference_digest": reference["digest"], "equal_to_reference": equal, "same_count": same_count,
            "memory": run.memory.as_dict(), "reference_memory": reference.get("memory"), "leaked": left, "third_party_tmp": third_party_tmp,
            "problems": problems, "ok": not problems}


def growth_of(memory) -> str:
    if not memory or memory.get("rank_anon_growth_second_half_mb") is None:
        return "not sampled"
    return f"{memory['rank_anon_growth_after_warmup_mb']:.1f} / {memory['rank_anon_growth_second_half_mb']:.1f}"


def table(result: dict) -> str:
    memory = result["memory"]["peak_mb"]
    rows = [("minutes", f"{result['minutes']:.1f}"), ("steps", result["steps"]), ("seed", result["seed"]),
            ("model", result["arch"]),
            ("schedule", "rank-change" if result["schedule"]["rank_change"] else "same-count"),
            *[(f"faults: {kind}", n) for kind, n in result["injected"].items()],
            ("restarts", result["restarts"]), ("samples delivered", result["ledgers"]["delivered"]),
            ("samples lost / repeated", f"{result['ledgers']['lost']} / {result['ledgers']['repeated']}"),
            ("final digest", (result["digest"] or "none")[:16]),
            ("equal to reference", result["equal_to_reference"] if result["same_count"] else "n/a (rank change)"),
            *[(f"peak RSS {role} (anon / file MB)", f"{m['anon']:.0f} / {m['file']:.0f}") for role, m in memory.items()],
            ("rank anon growth after warm-up (MB)", f"{result['memory']['rank_anon_growth_after_warmup_mb'] or 0:.1f}"),
            ("reference run, rank anon growth (MB): after warm-up / second half", growth_of(result.get("reference_memory"))),
            ("processes leaked", len(result["leaked"])), ("verdict", "PASS" if result["ok"] else "FAIL")]
    width = max(len(str(name)) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines += [f"  problem: {p}" for p in result["problems"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.minutes * 60 if args.minutes else float("inf")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings(steps=args.steps, seed=args.seed, arch=args.arch, read_timeout=args.read_timeout,
                        retries=args.s3_retries, checkpoint_every=args.checkpoint_every,
                        train_per_class=args.train_per_class, job_timeout_s=args.job_timeout)
    schedule = draw_schedule(args.seed, args.steps, args.checkpoint_every)
    dataset = prepare_dataset(out, settings)
    store = Store(out, dataset)
    own = {identity(store.server.pid)}
    try:
        reference = run_reference(out, settings, store)
        store.proxy.faults.clear()
        soaked = run_schedule(out, settings, schedule, store, deadline)
    finally:
        store.close()
    soaked["own_pids"] = own
    result = check(out, settings, schedule, soaked, reference, dataset, started)
    (out / "soak.json").write_text(json.dumps(result, indent=1, default=str))
    print(table(result))
    print(f"(JSON: {out / 'soak.json'})")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
