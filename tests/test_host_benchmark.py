"""host_benchmark.py: options, the measurement core, the format comparison's JSON/PNG, and torchrun.

Functional only: no assertion on speed (that is what the benchmark itself reports).
"""

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import PYTHON, REPO, run_script

EXPECTED_ROWS = [  # the -pil rows: the loader on the whole-image decode, beside the default crop decode;
    # the -noverify rows: the device row without the per-sample CRC32C check (converted formats);
    # the floor rows: the loader's image_into alone, per decode path
    "bare_decode_augment", "floor", "floor-pil",
    "baseline_imagefolder", "folder/host", "folder/device", "folder/device-pil",
    "baseline_webdataset_pil", "img/host", "img/device", "img/device-pil", "img/device-noverify", "img/device-order-global",
    "img/device-tv-rrc-flip", "img/device-strong", "img/device-strong-mix",  # user transforms (issue 21)
    "baseline_webdataset_npy", "tensor/host", "tensor/device", "tensor/device-noverify",
    "tensor/device-tv-rrc-flip", "tensor/device-strong", "tensor/device-strong-mix",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_cli():
    spec = importlib.util.spec_from_file_location("host_benchmark_cli", REPO / "host_benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cli():
    return load_cli()


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory, sample_source, converted):
    """The layout --compare expects: the source folder and its converted forms side by side."""
    directory = tmp_path_factory.mktemp("compare")
    (directory / "source").symlink_to(sample_source, target_is_directory=True)
    (directory / "img").symlink_to(converted("img"), target_is_directory=True)
    (directory / "tensor").symlink_to(converted("tensor"), target_is_directory=True)
    return directory


# ---------------------------------------------------------------- options


def parse_error(cli, capsys, argv):
    with pytest.raises(SystemExit) as raised:
        cli.parse_args(argv)
    assert raised.value.code == 2
    return capsys.readouterr().err


def test_reference_options_parse(cli, tmp_path):
    (tmp_path / "train" / "n01440764").mkdir(parents=True)
    args = cli.parse_args(["--data", "imagenet", "--imagenet-data-path", str(tmp_path), "--batch-size", "8",
                           "--dataloader-worker", "3", "--normalization-location", "ipu", "--iterations", "4"])
    assert (args.data, args.batch_size, args.dataloader_worker, args.iterations) == ("imagenet", 8, 3, 4)
    assert args.normalization_location == "device"  # ipu is an alias
    assert args.warmup_batches == 6  # default: two per worker


def test_eight_bit_io_means_device_normalisation(cli, capsys):
    assert cli.parse_args(["--data", "generated", "--eight-bit-io"]).normalization_location == "device"
    assert cli.parse_args(["--data", "generated"]).normalization_location == "host"
    error = parse_error(cli, capsys, ["--data", "generated", "--eight-bit-io", "--normalization-location", "host"])
    assert "--eight-bit-io" in error


def test_disable_async_loading_means_no_workers(cli, capsys):
    args = cli.parse_args(["--data", "generated", "--disable-async-loading"])
    assert args.dataloader_worker == 0 and args.warmup_batches == 2
    error = parse_error(cli, capsys, ["--data", "generated", "--disable-async-loading", "--dataloader-worker", "2"])
    assert "--disable-async-loading" in error and "--dataloader-worker 2" in error


@pytest.mark.parametrize("argv, expected", [
    (["--data", "real"], "--imagenet-data-path"),
    (["--data", "imagenet", "--imagenet-data-path", "/no/such/dir"], "/no/such/dir"),
    (["--compare", "/no/such/dir"], "/no/such/dir"),
    (["--data", "generated", "--batches", "3", "--seconds", "2"], "not allowed with"),
    (["--data", "generated", "--batch-size", "0"], "--batch-size: 0 must be at least 1"),
    (["--data", "generated", "--seconds", "-1"], "must be > 0"),
    (["--data", "generated", "--normalization-location", "gpu"], "invalid choice"),
    (["--data", "generated", "--rounds", "3"], "--compare only"),
    (["--data", "generated", "--json", "/no/such/dir/out.json"], "/no/such/dir"),
])
def test_bad_options_are_clear_errors(cli, capsys, argv, expected):
    assert expected in parse_error(cli, capsys, argv)


def test_data_kind_must_match_the_path(cli, capsys, sample_source, converted):
    # --data imagenet detects what the path holds, as the reference harness does; --data real is shards only
    assert cli.parse_args(["--data", "imagenet", "--imagenet-data-path", str(converted("img"))]).data == "imagenet"
    error = parse_error(cli, capsys, ["--data", "real", "--imagenet-data-path", str(sample_source)])
    assert "use --data imagenet" in error
    assert cli.parse_args(["--data", "imagenet", "--imagenet-data-path", str(sample_source)]).data == "imagenet"


def test_compare_defaults_to_seconds(cli, tmp_path):
    args = cli.parse_args(["--compare", str(tmp_path)])
    assert args.seconds == 5.0 and args.batches is None


# ---------------------------------------------------------------- the measurement core


def test_measure_excludes_warmup_and_stops_at_the_batch_limit():
    from imagenet_shards.hostbench.timing import measure_batches

    pulled = []

    def batches():
        for number in range(100):
            pulled.append(number)
            yield list(range(number + 1)), None  # batch n holds n+1 images

    figures = measure_batches(batches(), warmup_batches=3, max_batches=4, bytes_per_image=1000.0)
    assert pulled == list(range(7))
    assert figures["batches"] == 4 and figures["images"] == 4 + 5 + 6 + 7
    assert figures["images_per_s"] == pytest.approx(figures["images"] / figures["seconds"])
    assert figures["mb_per_s"] == pytest.approx(figures["images_per_s"] * 1000.0 / 1e6)
    assert len(figures["waits_s"]) == 4
    assert figures["latency_ms_p50"] <= figures["latency_ms_p99"]


def test_measure_runs_to_the_end_of_the_data_without_a_limit():
    from imagenet_shards.hostbench.timing import measure_batches

    figures = measure_batches((([0, 0], None) for _ in range(5)), warmup_batches=1)
    assert figures["batches"] == 4 and figures["images"] == 8


def test_too_little_data_for_the_warmup_is_a_clear_error():
    from imagenet_shards.hostbench.timing import BenchmarkError, measure_batches

    with pytest.raises(BenchmarkError, match="warm-up"):
        measure_batches((([0], None) for _ in range(2)), warmup_batches=3)
    with pytest.raises(BenchmarkError, match="no batch left"):
        measure_batches((([0], None) for _ in range(3)), warmup_batches=3)


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_cpu_meter_counts_a_live_child_process():
    """A child that burns CPU and is still alive: RUSAGE_CHILDREN would count nothing."""
    import resource

    from imagenet_shards.hostbench.timing import CpuMeter

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\ntime.sleep(30)\n"
    meter = CpuMeter()
    meter.start()
    before_children = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = subprocess.Popen([PYTHON, "-c", burn])
    try:
        meter.discover()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(0.1)
            meter.sample()
            if meter.used()[1] >= 0.5:  # /proc counts in clock ticks: allow for rounding
                break
        own, children, processes = meter.used()
        assert processes == 1
        assert children >= 0.5
        assert own < 0.5  # this process only waited
        after_children = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert after_children.ru_utime == before_children.ru_utime  # the live child is invisible there
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_cpu_meter_does_not_count_its_own_reads_of_proc():
    """The scans of /proc are the measurement's cost: this process's figure leaves them out."""
    from imagenet_shards.hostbench.timing import CpuMeter

    meter = CpuMeter()
    meter.start()
    began = time.process_time()
    for _ in range(20):
        meter.discover()  # a scan of every process's stat file each
        meter.sample()
    own, _, _ = meter.used()
    spent = time.process_time() - began
    assert meter.metering_seconds > 0
    assert own == pytest.approx(spent - meter.metering_seconds, abs=0.005)
    assert own < spent


def test_combined_instances_use_the_slowest_time():
    from imagenet_shards.hostbench.timing import combine_instances, measurement_figures

    fast = measurement_figures(images=100, batches=10, seconds=1.0, cpu_seconds=1.0, waits=[0.1] * 10,
                               bytes_per_image=10.0, workers=2)
    slow = measurement_figures(images=100, batches=10, seconds=2.0, cpu_seconds=1.0, waits=[0.2] * 10,
                               bytes_per_image=10.0, workers=2)
    combined = combine_instances([fast, slow])
    assert combined["images"] == 200 and combined["seconds"] == 2.0
    assert combined["images_per_s"] == pytest.approx(100.0)
    assert combined["images_per_s_per_worker"] == pytest.approx(25.0)  # 2 instances x 2 workers
    assert combined["images_per_cpu_s"] == pytest.approx(100.0)


def test_goals_met_not_met_and_not_measured():
    from imagenet_shards.hostbench.comparison import evaluate_goals

    def row(id, **figures):
        return {"id": id, **figures}

    results = [
        row("bare_decode_augment", images_per_cpu_s=1000.0, images_per_s=1000.0, images_per_s_per_worker=1000.0),
        row("baseline_imagefolder", images_per_s=500.0, images_per_cpu_s=400.0),
        row("img/device", images_per_cpu_s=950.0, images_per_s=650.0, images_per_s_per_worker=325.0),
        row("baseline_webdataset_npy", images_per_cpu_s=1000.0, images_per_s=1000.0),
        row("tensor/device", error="broken"),
    ]
    goals = {g["goal"]: g for g in evaluate_goals(results, "train")}
    assert goals["jpeg_vs_bare"]["status"] == "met" and goals["jpeg_vs_bare"]["ratio"] == pytest.approx(0.95)
    assert goals["jpeg_crop_decode_vs_bare"]["status"] == "not met"  # needs 1.3x
    assert goals["jpeg_vs_bare"]["also_ratio"] == pytest.approx(0.325)  # wall-clock per worker, for context
    assert goals["jpeg_vs_imagefolder"]["status"] == "not met"
    assert goals["jpeg_vs_imagefolder"]["ratio"] == pytest.approx(1.3)
    assert goals["tensor_vs_stock_npy"]["status"] == "not measured"
    assert "tensor/device" in goals["tensor_vs_stock_npy"]["why"]
    # Without img shards, the folder read by the loader stands for the JPEG pipeline.
    results[2]["id"] = "folder/device"
    goals = {g["goal"]: g for g in evaluate_goals(results, "train")}
    assert goals["jpeg_vs_bare"]["row"] == "folder/device" and goals["jpeg_vs_bare"]["status"] == "met"
    assert {g["status"] for g in evaluate_goals(results, "validation")[:2]} == {"not measured"}
    # Issue 23: the loader against its floor (any split), validation's fused decode against its -pil row.
    results += [row("floor", images_per_cpu_s=1000.0, images_per_s=1000.0),
                row("folder/device-pil", images_per_cpu_s=600.0, images_per_s=600.0)]
    for split in ("train", "validation"):
        goals = {g["goal"]: g for g in evaluate_goals(results, split)}
        floor_goal = goals["jpeg_loader_vs_floor"]
        assert floor_goal["status"] == "met" and floor_goal["ratio"] == pytest.approx(0.95)
    assert goals["jpeg_validation_fused_vs_pil"]["reference"] == "folder/device-pil"
    assert goals["jpeg_validation_fused_vs_pil"]["status"] == "met"  # 950 / 600 >= 1.4
    results[-1]["images_per_cpu_s"] = 700.0
    assert {g["goal"]: g for g in evaluate_goals(results, "validation")}["jpeg_validation_fused_vs_pil"][
        "status"] == "not met"
    assert {g["goal"]: g for g in evaluate_goals(results, "train")}["jpeg_validation_fused_vs_pil"][
        "status"] == "not measured"


def test_a_goal_pairs_each_round_with_its_reference_rows_round():
    """Each row's median round can come from a fast round for one row and a slow one for the other:
    the goal's ratio is the median of the rounds' own ratios, and falls back to the medians' ratio
    where the rounds do not line up."""
    from imagenet_shards.hostbench.comparison import evaluate_goals
    from imagenet_shards.hostbench.report import format_goals

    loader = {"id": "img/device", "images_per_cpu_s": 1000.0, "images_per_s": 1000.0,
              "by_round": {"images_per_cpu_s": [900.0, 1000.0, None, 1100.0]}}
    floor = {"id": "floor", "images_per_cpu_s": 1000.0, "images_per_s": 1000.0,
             "by_round": {"images_per_cpu_s": [1000.0, 1100.0, 1000.0, 1200.0]}}
    goal = {g["goal"]: g for g in evaluate_goals([loader, floor], "train")}["jpeg_loader_vs_floor"]
    assert goal["ratio"] == pytest.approx(1000 / 1100) and goal["status"] == "not met"
    assert goal["rounds_paired"] == 3 and goal["ratio_of_medians"] == pytest.approx(1.0)
    assert "the median of 3 rounds' ratios" in format_goals([goal])
    floor["by_round"]["images_per_cpu_s"].pop()
    goal = {g["goal"]: g for g in evaluate_goals([loader, floor], "train")}["jpeg_loader_vs_floor"]
    assert goal["ratio"] == pytest.approx(1.0) and "rounds_paired" not in goal


def test_compare_of_a_folder_without_a_dataset_exits_2_in_one_line(tmp_path):
    """A folder holding no dataset is a wrong path, as a missing one: exit 2, one line (issue 32)."""
    (tmp_path / "notes.txt").write_text("no dataset here\n")
    result = run_script("host_benchmark.py", "--compare", tmp_path, "--batches", 1)
    errors = [line for line in result.stderr.splitlines() if "warning:" not in line]
    assert result.returncode == 2, result.stderr
    assert len(errors) == 1 and "found no image folder" in errors[0] and str(tmp_path) in errors[0], result.stderr


def test_discovery_refuses_an_empty_directory_and_names_a_second_source_of_a_format(tmp_path, sample_source):
    from imagenet_shards.hostbench.timing import BenchmarkError
    from imagenet_shards.hostbench.comparison import plan_rows
    from imagenet_shards.hostbench.discovery import discover_sources
    from imagenet_shards.launcher import Instance

    with pytest.raises(BenchmarkError, match="found no image folder"):
        discover_sources(tmp_path)
    (tmp_path / "a").symlink_to(sample_source, target_is_directory=True)
    (tmp_path / "b").symlink_to(sample_source, target_is_directory=True)
    (tmp_path / "notes").mkdir()  # neither a folder of classes nor a converted dataset: ignored
    sources = discover_sources(tmp_path)
    assert [(s.format, s.name, s.path.name) for s in sources] == [("folder", "folder", "a"), ("folder", "folder@b", "b")]
    rows = plan_rows(sources, "train", 4, 0, Instance(0, 1, "single"))
    assert [row.id for row in rows] == ["bare_decode_augment", "floor", "floor-pil", "baseline_imagefolder",
                                        "folder/host", "folder/device", "folder/device-pil", "folder@b/host",
                                        "folder@b/device", "folder@b/device-pil"]
    assert rows[-2].label == "folder (b), device normalisation, crop decode"
    assert [row.decode for row in rows[-3:]] == ["crop", "crop", "pil"]
    assert [(row.kind, row.decode) for row in rows[1:3]] == [("floor", "crop"), ("floor", "pil")]
    # Validation decodes the center crop's region too: the same rows.
    assert [row.id for row in plan_rows(sources[:1], "validation", 4, 0, Instance(0, 1, "single"))] == [
        "bare_decode_augment", "floor", "floor-pil", "baseline_imagefolder", "folder/host", "folder/device",
        "folder/device-pil"]
    pil_only = plan_rows(sources[:1], "validation", 4, 0, Instance(0, 1, "single"),
                         loader_options={"jpeg_decode": "pil"})
    assert [row.id for row in pil_only][:3] == ["bare_decode_augment", "floor", "baseline_imagefolder"]


# ---------------------------------------------------------------- the CLI, end to end


def test_compare_writes_every_row_to_json_and_a_png(compare_run):
    """The shared run (conftest.compare_run) also has --recommend, which adds only the local read ceilings."""
    result, out_json, out_png, _ = compare_run
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out_json.read_text())
    assert [row["id"] for row in report["rows"]] == EXPECTED_ROWS + [
        f"transport_ceiling/{fmt}@local" for fmt in ("folder", "img", "tensor")]
    report["rows"] = [row for row in report["rows"] if row["kind"] != "transport_ceiling"]
    for row in report["rows"]:
        assert "error" not in row, row
        assert row["batches"] == 2 and row["images"] == 8, row["id"]
        assert row["images_per_s"] > 0 and row["cpu_seconds"] > 0 and row["latency_ms_p99"] >= row["latency_ms_p50"]
        if row["kind"] not in ("ceiling", "floor"):
            assert row["processes_counted"] >= 2, f"{row['id']}: the DataLoader worker was not counted"
            # (its CPU share may round to 0 here: 2 tiny batches, possibly prefetched during the warm-up)
            assert row["worker_cpu_ms_per_image"] >= 0, row["id"]
    by_id = {row["id"]: row for row in report["rows"]}
    assert by_id["img/device"]["batch_dtype"] == "uint8" and by_id["img/device"]["batch_shape"] == "4x3x224x224"
    assert by_id["img/host"]["batch_dtype"] == "float32"
    assert (by_id["img/device"]["decode"], by_id["img/device-pil"]["decode"]) == ("crop", "pil")
    assert report["config"]["jpeg_train_decode"] == "crop" and report["config"]["image_size"] == 224
    assert by_id["baseline_imagefolder"]["batch_dtype"] == "float32"
    # MB/s counts the stored bytes per image: the tensor shards hold more per image than the JPEGs.
    assert by_id["tensor/device"]["bytes_per_image"] > by_id["img/device"]["bytes_per_image"] > 0
    assert [goal["goal"] for goal in report["goals"]] == [
        "jpeg_vs_bare", "jpeg_crop_decode_vs_bare", "jpeg_vs_imagefolder", "tensor_vs_stock_npy", "img_verify_cost",
        "tensor_verify_cost", "jpeg_user_transform_fused", "jpeg_loader_vs_floor", "img_global_order_cost",
        "jpeg_validation_fused_vs_pil"]
    assert by_id["img/device-strong-mix"]["batch_dtype"] == "uint8" and by_id["img/device-strong"]["decode"] == "crop"
    assert by_id["img/device-noverify"]["label"].endswith("verify off") and by_id["img/device-noverify"]["decode"] == "crop"
    assert all(goal["status"] in ("met", "not met") for goal in report["goals"][:-1])
    assert report["goals"][-1]["status"] == "not measured"  # validation only
    assert by_id["floor"]["batch_shape"] == "4x3x224x224" and by_id["floor"]["batch_dtype"] == "uint8"
    assert report["config"]["formats"] == ["folder", "img", "tensor"]
    data = out_png.read_bytes()
    assert data.startswith(PNG_MAGIC)
    from PIL import Image

    with Image.open(out_png) as image:
        image.verify()
    with Image.open(out_png) as image:
        assert image.width >= 800 and image.height >= 400
    for label in ("bare decode+augment", "ImageFolder + DataLoader (baseline)", "tensor, device normalisation",
                  "Goals", f"wrote {out_json}", f"wrote {out_png}"):
        assert label in result.stdout


def test_compare_with_a_format_filter(filtered_compare_run, compare_dir):
    """--formats img,tfrecord,lmdb of a folder that also holds the source folder and tensor (the run is shared
    with the tfrecord and lmdb row tests)."""
    result, out_json = filtered_compare_run
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out_json.read_text())
    assert [row["id"] for row in report["rows"] if row["format"] not in ("tfrecord", "lmdb")] == [
        "baseline_webdataset_pil", "img/host", "img/device", "img/device-pil", "img/device-noverify",
        "img/device-order-global", "img/device-tv-rrc-flip", "img/device-strong", "img/device-strong-mix"]
    assert report["config"]["formats"] == ["img", "tfrecord", "lmdb"]
    measured = ("img_verify_cost", "jpeg_user_transform_fused", "img_global_order_cost")
    assert {goal["status"] for goal in report["goals"] if goal["goal"] not in measured} == {"not measured"}
    assert all(goal["status"] in ("met", "not met") for goal in report["goals"] if goal["goal"] in measured)
    bad = run_script("host_benchmark.py", "--compare", compare_dir, "--formats", "tfrecord", "--batches", 1)
    assert bad.returncode == 2 and "tfrecord not found" in bad.stderr  # a wrong argument, as a wrong path


def test_generated_data_prints_the_reference_line_per_iteration(tmp_path):
    out_json = tmp_path / "generated.json"
    result = run_script("host_benchmark.py", "--data", "generated", "--iterations", 2, "--batches", 3,
                        "--warmup-batches", 1, "--batch-size", 4, "--disable-async-loading",
                        "--normalization-location", "device", "--json", out_json)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("Throughput of the iteration:")]
    assert len(lines) == 2
    for line in lines:
        assert line.endswith(" img/sec") and float(line.split(":")[1].split()[0]) > 0
    report = json.loads(out_json.read_text())
    assert [row["images"] for row in report["rows"]] == [12, 12]
    assert report["rows"][0]["batch_dtype"] == "uint8"


def test_a_source_that_is_not_a_dataset_is_a_clear_error(tmp_path):
    (tmp_path / "stray.txt").write_text("not a dataset")
    result = run_script("host_benchmark.py", "--data", "real", "--imagenet-data-path", tmp_path, "--batches", 1)
    assert result.returncode != 0
    assert str(tmp_path) in result.stderr
    assert "Traceback" not in result.stderr


def test_torchrun_two_instances_report_each_and_the_aggregate():
    command = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(REPO / "host_benchmark.py"), "--data", "generated", "--iterations", "1", "--batches", "3",
               "--warmup-batches", "1", "--batch-size", "4", "--dataloader-worker", "0"]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "iteration 1 instance 0: 12 images" in out
    assert "iteration 1 instance 1: 12 images" in out
    assert "iteration 1 aggregate over 2 instance(s): 24 images" in out
    # Only rank 0 reports: one reference line, carrying the aggregate.
    assert out.count("Throughput of the iteration:") == 1
    assert "instance 0 of 2 (torchrun" in out


def test_the_table_keeps_figures_in_line_under_long_labels():
    """A label longer than the row column (e.g. "..., crop decode, verify off") widens it: every
    line's img/s figure ends at the same column as the header's."""
    from imagenet_shards.hostbench.report import format_table

    def row(label, rate):
        return {"label": label, "images_per_s": rate, "images_per_s_per_worker": rate, "images_per_cpu_s": rate,
                "cpu_ms_per_image": 1.0, "main_cpu_ms_per_image": 0.1, "mb_per_s": 9.0, "latency_ms_p50": 1.0,
                "latency_ms_p99": 2.0, "batch_dtype": "uint8", "batch_shape": "4x3x8x8", "seconds": 100}

    rows = [row("short", 1), row("tfrecord, device normalisation, crop decode, verify off", 22_222)]
    header, _, *lines = format_table(rows).splitlines()
    end = header.index("img/s") + len("img/s")
    assert [line[:end].rstrip()[-1:] for line in lines] == ["1", "2"], format_table(rows)
    assert all(line[end] == " " for line in lines)


def test_stored_at_output_size_reads_the_stored_steps_with_the_step_type():
    from types import SimpleNamespace

    from imagenet_shards.hostbench.pipelines import stored_at_output_size

    def source(steps):
        return SimpleNamespace(metadata={"validation_transform_pipeline": steps})

    assert stored_at_output_size(source(["Resize(256)", "CenterCrop(224)"]), "validation", 224)
    assert stored_at_output_size(source(["Resize(256) CenterCrop(224, 224)"]), "validation", 224)
    assert not stored_at_output_size(source(["Resize(256)", "CenterCrop(256)"]), "validation", 224)
    assert not stored_at_output_size(source(["CenterCrop(224)", "Resize(256)"]), "validation", 224)  # resized after
    assert not stored_at_output_size(source([]), "validation", 224)
    assert not stored_at_output_size(SimpleNamespace(metadata=None), "validation", 224)

