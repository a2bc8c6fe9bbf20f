"""The soak in CI (issue 35): benchmarks/soak.py on a short schedule that draws every fault kind once
(503 burst, reset mid-body, stall past the read timeout, an outage within the retries and one past them,
a bit flip and a truncation in the shard cache, SIGKILL of a rank, of a DataLoader worker, of the whole
job and during a checkpoint's write), 2 ranks x 2 workers, short timeouts. Seed 1 draws a same-count
schedule, so its final weights must be bit-identical to the uninterrupted run's. The model is
shufflenet_v2_x0_5, not the soak's default resnet18: the same schedule, faults and checks, and its 7 jobs'
14 ranks train 1.4M parameters, not 11.7M (DDP's all-reduce, each checkpoint's write and the steps: a
24-step 2-rank job took 19.8 CPU-s, not 30.5)."""

import json

import pytest

from conftest import run_script
from testing_rigs.soak_schedule import FAULT_KINDS, draw_schedule

SEED, STEPS = 1, 24


def test_every_schedule_draws_each_fault_kind_and_a_seed_names_its_schedule():
    for seed in range(20):
        schedule = draw_schedule(seed, STEPS, 4)
        assert sorted({fault.kind for fault in schedule.faults}) == sorted(FAULT_KINDS), seed
        assert len({fault.step for fault in schedule.faults}) == len(schedule.faults)
        assert schedule.as_dict() == draw_schedule(seed, STEPS, 4).as_dict()
        writes = [fault.step for fault in schedule.faults if fault.kind == "kill_in_checkpoint_write"]
        assert all(step % 4 == 0 for step in writes)
    assert not draw_schedule(SEED, STEPS, 4).rank_change  # the CI run below compares the weights
    assert any(draw_schedule(seed, STEPS, 4).rank_change for seed in range(20))


@pytest.mark.timeout(600)
def test_a_short_soak_passes_its_checker_with_every_fault_kind_injected(tmp_path):
    out = tmp_path / "soak"
    result = run_script("benchmarks/soak.py", "--steps", STEPS, "--seed", SEED, "--out", out, "--read-timeout", 1.5,
                        "--s3-retries", 2, "--arch", "shufflenet_v2_x0_5", timeout=580)
    report = json.loads((out / "soak.json").read_text()) if (out / "soak.json").exists() else {}
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert report["ok"] and not report["problems"]
    assert report["arch"] == "shufflenet_v2_x0_5"
    assert report["kinds_not_injected"] == [], report["injected"]
    assert report["same_count"] and report["equal_to_reference"] and report["digest"]
    assert report["restarts"] >= 5  # 4 process faults and the outage past the retries
    assert report["ledgers"]["lost"] == report["ledgers"]["repeated"] == 0
    assert report["ledgers"]["delivered"] >= STEPS * 2 * 4  # every step's batches, replays not counted
    past = next(f for f in report["schedule"]["faults"] if f["kind"] == "outage_past_retries")
    assert past["detail"]["store_line"].startswith("train_imagenet.py: StorageUnavailable: ")
    assert report["leaked"] == []
    assert "verdict" in result.stdout and "PASS" in result.stdout


def test_a_kill_in_a_checkpoint_write_is_not_armed_behind_an_outage_past_the_retries():
    # seed 2 at 200 steps: the job read ahead past the outage at 126 and its armed write kill at 128
    # fired first, so the store's one line never came
    from testing_rigs.soak_schedule import Fault, checkpoint_kill_to_arm
    assert checkpoint_kill_to_arm([Fault(126, "outage_past_retries"), Fault(128, "kill_in_checkpoint_write")]) is None
    assert checkpoint_kill_to_arm([Fault(125, "stall"), Fault(128, "kill_in_checkpoint_write"),
                                   Fault(130, "outage_past_retries")]) == 128
    assert checkpoint_kill_to_arm([Fault(125, "kill_job")]) is None


def test_memory_growth_is_measured_over_a_job_that_is_only_waited_for(tmp_path):
    # the reference run is only waited for (no wait_for_step): its growth was never sampled (None), as the
    # first step was read only after the warm-up test. A stand-in rank that keeps 1 MiB a step: it grows.
    import sys

    from testing_rigs.soak_job import Memory, TrainingJob

    steps = tmp_path / "steps.jsonl"
    rank = ("import json, time\nkept = []\nwith open(%r, 'a') as log:\n    for step in range(1, 41):\n"
            "        kept.append(bytearray(1 << 20)); log.write(json.dumps({'step': step}) + '\\n'); log.flush()\n"
            "        time.sleep(0.1)\n" % str(steps))
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {rank!r}])"
    memory = Memory()
    job = TrainingJob([sys.executable, "-c", launcher], None, tmp_path, tmp_path / "job.log", steps, memory, set())
    assert job.wait(120) == 0
    found = memory.as_dict()
    assert 20 < found["rank_anon_growth_after_warmup_mb"] < 40, found
    assert 8 < found["rank_anon_growth_second_half_mb"] < 22, found


def test_a_503_burst_is_not_laid_on_one_not_met_yet():
    # seed 5 at 640 steps: bursts at steps 497 and 498 gave one request more 503s than the retries absorb
    from pathlib import Path
    from types import SimpleNamespace

    from testing_rigs.soak_run import Injector
    from testing_rigs.soak_schedule import Fault, Schedule

    proxy = SimpleNamespace(slowdown=0)
    run = SimpleNamespace(root=Path("."), jobs=[], settings=SimpleNamespace(retries=3), store=SimpleNamespace(proxy=proxy))
    injector = Injector(run, Schedule(5, 640, False, []))
    first, second = Fault(497, "slowdown"), Fault(498, "slowdown")
    injector.slowdown(first, None)
    proxy.slowdown -= 1  # one 503 of the burst met
    injector.slowdown(second, None)
    assert proxy.slowdown == 2 and "skipped" in second.detail and "skipped" not in first.detail
