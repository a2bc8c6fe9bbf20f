"""benchmarks/train_data_wait.py: the rows it runs (decode location x workers, the model's own rate) and its figures.

On CPU and tiny images: what is checked is that every row ran the training script as asked and that
the figures are those of its step log, not their values (so the model is a small one, shufflenet_v2_x0_5).
"""

import importlib.util
import json

from conftest import REPO, run_main, run_script


def benchmark_main():
    """benchmarks/train_data_wait.py's main(argv), for a run in this process (torch is imported already); each
    row's training still runs in a process of its own, as the benchmark starts it."""
    script = REPO / "benchmarks" / "train_data_wait.py"
    spec = importlib.util.spec_from_file_location("train_data_wait_benchmark", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_rows_per_decode_location_and_the_own_rate_row(converted, tmp_path):
    logs, out = tmp_path / "logs", tmp_path / "wait.json"
    result = run_main(benchmark_main(), "--data", converted("img"), "--arch", "shufflenet_v2_x0_5",
                      "--batch-size", 4, "--image-size", 32, "--steps", 4, "--warmup", 2, "--workers", 1,
                      "--decode", "host,device", "--own-rate", "--keep-logs", logs, "--json", out)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["decode"] for row in rows] == ["none (one batch on the device)", "host", "device"]
    for row in rows:
        assert row["steps"] == 2 and row["images"] == 8
        assert row["cpu_s_per_image"] > 0
    own = [json.loads(line) for line in (logs / "steps-shufflenet_v2_x0_5-own-rate-w1.jsonl").read_text().splitlines()]
    assert all(step["wait_s"] < 0.05 for step in own[1:])  # no loader after the first batch
    steps = [json.loads(line) for line in (logs / "steps-shufflenet_v2_x0_5-device-w1.jsonl").read_text().splitlines()]
    assert rows[2]["cpu_s_per_image"] == (steps[-1]["cpu_s"] - steps[1]["cpu_s"]) / 8


def test_a_decode_location_that_does_not_exist_is_a_usage_error(converted):
    result = run_script("benchmarks/train_data_wait.py", "--data", converted("img"), "--decode", "gpu")
    assert result.returncode == 2 and "--decode" in result.stderr
