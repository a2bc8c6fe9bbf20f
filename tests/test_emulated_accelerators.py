"""host_benchmark.py --accelerators (issue 44): the AU arithmetic on a clock the test drives, the search on a
loader of a fixed rate, the profiles, the one-line usage errors, one run's JSON, torchrun, and an s3:// copy.

No assertion on speed: the AU figures asserted come from a simulated clock, never the wall clock.
"""

import json
import os
import subprocess

import pytest

from conftest import PYTHON, REPO, run_main, run_script
from imagenet_shards.hostbench import emulate
from imagenet_shards.hostbench.accelerators import consume


class Clock:
    """A clock that moves only when the loader or the accelerator's sleep moves it."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def slowed_loader(clock, delays, batch=8):
    """Batches that each take the next of `delays` seconds to arrive (the loader slowed on purpose)."""
    for delay in delays:
        clock.now += delay
        yield {"samples": batch, "bytes": batch * 100}


def test_au_of_a_loader_slowed_on_purpose_is_compute_over_compute_plus_wait():
    clock = Clock()
    # a slow first batch (the workers' start-up) is left out; then every batch waits 0.05 s: AU = 0.2 / 0.25
    record = consume(slowed_loader(clock, [30.0] + [0.05] * 20), 0.2, steps=10, clock=clock, sleep=clock.sleep)
    assert len(record["steps"]) == 11 and record["samples"] == 80 and record["bytes"] == 8000
    assert emulate.utilisation(record["computes"], record["steps"]) == pytest.approx(0.8)
    assert record["waits"][1:] == pytest.approx([0.05] * 10)
    # a loader that never makes the accelerator wait: AU 1; seconds instead of steps
    clock = Clock()
    record = consume(slowed_loader(clock, [1.0] + [0.0] * 50), 0.1, seconds=1.0, clock=clock, sleep=clock.sleep)
    assert emulate.utilisation(record["computes"], record["steps"]) == pytest.approx(1.0)
    assert record["seconds"] == pytest.approx(1.0)


def test_au_lost_to_a_late_wake_up_is_told_apart_from_the_wait():
    """A host too busy to wake the accelerator on time (the sleep overruns) lowers AU without any data wait."""
    clock = Clock()
    late = lambda seconds: clock.sleep(seconds + 0.05)  # noqa: E731
    record = consume(slowed_loader(clock, [1.0] + [0.05] * 20), 0.2, steps=10, clock=clock, sleep=late)
    record.update(cpu_s=0.0, epochs=1.0)
    profile = emulate.Profile("p", 8, 0.2, "test")
    summary = emulate.summarise([record], profile, 0.9)
    assert summary["au_mean"] == pytest.approx(0.2 / 0.3) and not summary["passed"]
    assert summary["wait_share"] == pytest.approx(0.05 / 0.3) and summary["late_share"] == pytest.approx(0.05 / 0.3)


def simulate(rate, profile, n, steps=40):
    """N accelerators sharing a loader of `rate` samples/s: accelerator i's k-th batch is ready at
    k x batch x N / rate (a fixed rate, prefetched without limit). Each one's record, on its own clock."""
    records = []
    for _ in range(n):
        clock = Clock()

        def ready(clock=clock):
            k = 0
            while True:
                k += 1
                clock.now = max(clock.now, k * profile.batch_size * n / rate)
                yield {"samples": profile.batch_size, "bytes": 0}

        record = consume(ready(), profile.compute_s, steps=steps, clock=clock, sleep=clock.sleep)
        record.update(cpu_s=0.0, epochs=1.0)
        records.append(record)
    return records


def test_auto_finds_the_largest_n_a_loader_of_a_fixed_rate_feeds():
    profile = emulate.PROFILES["resnet50-h100"]  # 400 samples in 0.224 s: 1,786 samples/s an accelerator
    rate = 10_000.0  # AU = min(1, rate / N / 1786) >= 0.9 for N <= 6.22
    results = {}

    def passes(n):
        results[n] = emulate.summarise(simulate(rate, profile, n), profile, 0.9)
        return results[n]["passed"]

    best, tried = emulate.search_largest(passes, 64)
    assert best == 6 and tried == [1, 2, 4, 8, 6, 7]
    assert results[7]["au_mean"] == pytest.approx(rate / 7 / profile.samples_per_s, rel=0.02)
    answer = emulate.headline(best, results, profile, cores=2)
    assert answer["accelerators_fed"] == 6 and answer["accelerators_fed_per_core"] == 3
    # a loader slower than one accelerator: 0 fed, the fractional figure
    slow = {}
    assert emulate.search_largest(lambda n: slow.setdefault(n, emulate.summarise(
        simulate(893.0, profile, n), profile, 0.9))["passed"], 64) == (0, [1])
    answer = emulate.headline(0, slow, profile, cores=2)
    assert answer["fraction_of_one"] == pytest.approx(0.5, rel=0.02)
    assert answer["au_at_1"] == pytest.approx(0.5, rel=0.02)
    # every N passes up to the cap: the cap is the answer
    assert emulate.search_largest(lambda n: True, 5) == (5, [1, 2, 4, 5])


def test_profiles_from_mlperf_a_dlio_yaml_a_step_log_and_by_hand(tmp_path):
    h100 = emulate.resolve_profile("resnet50-h100")
    assert (h100.batch_size, h100.compute_s) == (400, 0.224) and "resnet50_h100.yaml" in h100.source
    assert emulate.resolve_profile("resnet50-a100").compute_s == 0.435
    dlio = tmp_path / "resnet50_h100.yaml"
    dlio.write_text("model:\n  name: resnet50\ntrain:\n  computation_time: 0.224\nreader:\n  batch_size: 400\n")
    assert (emulate.resolve_profile(str(dlio)).batch_size, emulate.resolve_profile(str(dlio)).compute_s) == (400, 0.224)
    log = tmp_path / "steps.jsonl"
    log.write_text("".join(json.dumps({"epoch": 0, "step": i, "images": 256, "wait_s": w, "step_s": w + 0.055}) + "\n"
                           for i, w in enumerate([5.0, 0.01, 0.02, 0.0])))
    measured = emulate.resolve_profile(str(log))
    assert measured.batch_size == 256 and measured.compute_s == pytest.approx(0.055)
    by_hand = emulate.Profile("by-hand", 32, 0.1, "--batch-size and --compute-time")
    assert emulate.resolve_profile(None, 32, 0.1) == by_hand
    assert emulate.resolve_profile("resnet50-h100", 100, None).batch_size == 100
    with pytest.raises(emulate.ProfileError, match="not one of resnet50-h100"):
        emulate.resolve_profile("resnet51-h100")
    (tmp_path / "bad.yaml").write_text("reader: {}\n")
    with pytest.raises(emulate.ProfileError, match="train.computation_time"):
        emulate.resolve_profile(str(tmp_path / "bad.yaml"))


@pytest.mark.parametrize("extra, message", [
    (("--profile", "resnet51-h100"), "--profile resnet51-h100: not one of resnet50-h100"),
    (("--profile", "resnet50-h100", "--au-threshold", "1.5"), "--au-threshold 1.5: not in (0, 1]"),
    (("--profile", "resnet50-h100", "--data", "generated"), "--data generated reads no stored shards"),
    (("--compute-time", "0.1"), "need --profile NAME|FILE, or --batch-size and --compute-time"),
    (("--profile", "resnet50-h100", "--recommend"), "--compare DIR and --recommend go together"),
])
def test_a_bad_profile_threshold_or_source_is_one_line_and_exit_2(converted, extra, message):
    result = run_script("host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", converted("img"),
                        "--accelerators", "2", *extra)
    errors = [line for line in result.stderr.splitlines() if "warning:" not in line]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(errors) == 1 and message in errors[0], result.stderr


JSON_FIELDS = {"config", "profile", "results", "tried", "headline", "repeats", "notes", "ceiling"}
RESULT_FIELDS = {"accelerators", "au_per_accelerator", "au_mean", "au_std", "au_min", "passed", "samples_per_s",
                 "wait_share", "late_share",
                 "mb_per_s", "cpu_s_per_sample", "wait_ms_p50", "wait_ms_p90", "epochs_read", "workers_per_accelerator"}


def test_auto_on_the_sample_dataset_writes_the_json_and_the_plot(converted, tmp_path):
    from imagenet_shards.cli.host_benchmark import main

    out = tmp_path / "emu.json"
    result = run_main(main, "--data", "imagenet", "--imagenet-data-path", converted("img"), "--accelerators", "auto",
                      "--batch-size", 4, "--compute-time", 0.001, "--batches", 2, "--max-accelerators", 2,
                      "--dataloader-worker", 0, "--runs", 2, "--json", out, "--plot", tmp_path / "emu.png")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert JSON_FIELDS <= set(report) and report["profile"]["name"] == "by-hand"
    assert report["tried"][0] == 1 and all(RESULT_FIELDS <= set(r) for r in report["results"])
    assert all(r["samples_per_s"] > 0 and r["mb_per_s"] > 0 for r in report["results"])
    assert report["ceiling"]["samples_per_s"] > 0 and "accelerators_fed" in report["headline"]
    assert list(report["repeats"].values())[0]["runs"] == 2
    assert "accelerators fed:" in result.stdout and (tmp_path / "emu.png").stat().st_size > 0


def test_pipeline_depth_runs_the_train_pipeline(converted, tmp_path):
    from imagenet_shards.cli.host_benchmark import main

    out = tmp_path / "emu.json"
    result = run_main(main, "--data", "imagenet", "--imagenet-data-path", converted("tfrecord"), "--accelerators", 1,
                      "--depth", "pipeline", "--batch-size", 4, "--compute-time", 0.001, "--batches", 2,
                      "--dataloader-worker", 0, "--image-size", 64, "--json", out)
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["accelerators"] == 1 and row["samples"] == 8 and row["au_mean"] is not None


def test_torchrun_two_ranks_are_two_accelerators(converted, tmp_path):
    out = tmp_path / "emu.json"
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(REPO / "host_benchmark.py"), "--data", "imagenet", "--imagenet-data-path", str(converted("img")),
               "--accelerators", "2", "--batch-size", "4", "--compute-time", "0.001", "--batches", "3",
               "--dataloader-worker", "0", "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["accelerators"] == 2 and len(row["au_per_accelerator"]) == 2 and row["samples"] == 2 * 3 * 4
    assert result.stdout.count("accelerators fed:") == 1 and "instance 0 of 2 (torchrun" in result.stdout


def test_the_recommendation_takes_the_cheapest_combination_that_feeds_them_else_the_closest():
    from imagenet_shards.hostbench.emulate_recommend import choose

    def row(name, au_min, cpu_ms, workers=1):
        return {"id": name, "au_min": au_min, "passed": au_min >= 0.9, "cpu_s_per_sample": cpu_ms / 1e3,
                "workers": workers}

    rows = [row("img/host/2w", 0.95, 2.0, 2), row("tensor/host/1w", 0.92, 0.5), row("tfrecord/host/1w", 0.5, 0.4)]
    assert choose(rows, 0.9)["chosen"] == "tensor/host/1w" and choose(rows, 0.9)["fed"]
    decision = choose([row("img/host/1w", 0.3, 1.0), row("tensor/host/1w", 0.6, 0.5)], 0.9)
    assert decision == {"chosen": "tensor/host/1w", "fed": False, "why": decision["why"]} and "0.600" in decision["why"]


def test_storage_depth_reads_an_s3_copy(converted, s3_server, s3_bucket, tmp_path):
    """The storage depth over s3:// (ranged GETs, each payload's CRC32C checked): the same samples as local."""
    target = f"s3://{s3_bucket}/img"
    upload = run_script("upload_dataset.py", converted("img"), target, "--s3-endpoint", s3_server.endpoint,
                        "--no-progress", env=s3_server.env())
    assert upload.returncode == 0, upload.stdout + upload.stderr
    out = tmp_path / "emu.json"
    result = run_script("host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", target,
                        "--s3-endpoint", s3_server.endpoint, "--accelerators", 2, "--batch-size", 4,
                        "--compute-time", 0.001, "--batches", 3, "--dataloader-worker", 1, "--json", out,
                        env=s3_server.env())
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    (row,) = report["results"]
    assert row["samples"] == 2 * 3 * 4 and row["mb_per_s"] > 0 and report["ceiling"] is None


def test_storage_depth_reads_lmdb_by_key(converted, tmp_path):
    """LMDB's records are values looked up by key, not byte ranges: read through the format's cursor walk."""
    from imagenet_shards.cli.host_benchmark import main

    out = tmp_path / "emu.json"
    result = run_main(main, "--data", "imagenet", "--imagenet-data-path", converted("lmdb"), "--accelerators", 1,
                      "--batch-size", 4, "--compute-time", 0.001, "--batches", 2, "--dataloader-worker", 0,
                      "--json", out)
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["samples"] == 8 and row["mb_per_s"] > 0
