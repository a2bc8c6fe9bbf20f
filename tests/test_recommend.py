"""host_benchmark.py --recommend: the arithmetic on fixed rows, the saved-report path, and end to end.

No assertion on speed: the end-to-end test checks that the decision's arithmetic is that of the
rows of the same run, whatever they measured.
"""

import json
import math

import pytest

from conftest import run_script
from imagenet_shards.hostbench.recommend import candidates, recommend

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def loader_row(fmt, per_cpu_s, images_per_s, bytes_per_image, workers=2):
    return {"id": f"{fmt}/device", "label": f"{fmt}, device normalisation", "kind": "loader", "format": fmt,
            "normalization": "device", "workers": workers, "images_per_s": images_per_s,
            "images_per_cpu_s": per_cpu_s, "mb_per_s": images_per_s * bytes_per_image / 1e6}


def ceiling_row(fmt, transport, mb_per_s):
    return {"id": f"transport_ceiling/{fmt}@{transport}", "label": f"{fmt} {transport}", "kind": "transport_ceiling",
            "transport": transport, "mb_per_s": mb_per_s}


ROWS = [
    {"id": "bare_decode_augment", "kind": "ceiling", "format": "folder", "images_per_cpu_s": 700.0},
    loader_row("img", 1000.0, 1800.0, 50_000),
    {**loader_row("img", 5000.0, 1900.0, 50_000), "id": "img/device-noverify"},  # not the row that stands for img
    loader_row("tensor", 4000.0, 6000.0, 150_000),
    ceiling_row("img", "local", 500.0),
    ceiling_row("tensor", "local", 500.0),
]
BYTES = {"img": 50_000, "tensor": 150_000}


def decide(rows=ROWS, target=3000, instances=1, cores=2, images=1000, page_cache=1e12):
    return recommend(rows, target_rate=target, instances=instances, cores_per_instance=cores,
                     split_images={"img": images, "tensor": images}, bytes_per_image=BYTES,
                     page_cache_bytes=page_cache)


def by_format(decision):
    return {a["format"]: a for a in decision["formats"]}


def test_cores_decide_when_the_split_fits_the_page_cache():
    decision = decide()
    img, tensor = by_format(decision)["img"], by_format(decision)["tensor"]
    assert img["cores_needed"] == pytest.approx(3.0) and img["workers"] == 3
    assert img["rate_by_cores"] == pytest.approx(2000) and not img["meets_target"]
    assert img["limited_by"] == "cores" and "short 1.00" in img["short"]
    assert img["storage"] == "page cache" and img["rate_by_storage"] is None
    assert tensor["cores_needed"] == pytest.approx(0.75) and tensor["workers"] == 1
    assert tensor["mb_per_s_needed_per_host"] == pytest.approx(450.0) and tensor["meets_target"]
    assert decision["recommended"] == {"format": "tensor", "dataloader_worker": 1, "row": "tensor/device",
                                       "meets_target": True}
    assert "fewest cores" in decision["why"]


def test_a_split_larger_than_the_page_cache_is_read_at_the_storage_ceiling():
    decision = decide(page_cache=100e6)  # tensor's split: 1000 x 150 KB = 150 MB; img's 50 MB fits
    tensor = by_format(decision)["tensor"]
    assert not tensor["fits_page_cache"] and tensor["storage"] == "local ceiling"
    assert tensor["rate_by_storage"] == pytest.approx(500e6 / 150_000)
    assert tensor["meets_target"] and decision["recommended"]["format"] == "tensor"
    # Two instances share the host's storage: each gets half of it, and tensor falls short on storage.
    decision = decide(page_cache=100e6, instances=2)
    tensor, img = by_format(decision)["tensor"], by_format(decision)["img"]
    assert tensor["rate_by_storage"] == pytest.approx(500e6 / 150_000 / 2)
    assert tensor["limited_by"] == "memory (then storage)" and not tensor["meets_target"]
    assert "needs 900.0 MB/s per host" in tensor["short"] and "short 400.0 MB/s" in tensor["short"]
    assert "does not fit" in tensor["short"]
    # Nothing reaches 3000: the closest (img, 2000 by cores, against tensor's 1667 by storage) is named.
    assert decision["recommended"] == {"format": "img", "dataloader_worker": 3, "row": "img/device",
                                       "meets_target": False}
    assert decision["why"].startswith("no format reaches 3,000 img/s") and "cores" in decision["why"]


def test_a_remote_copy_sets_the_ceiling_even_when_the_split_fits():
    rows = ROWS + [ceiling_row("tensor", "s3", 300.0)]
    tensor = by_format(decide(rows))["tensor"]
    assert tensor["storage"] == "s3 ceiling" and tensor["ceiling_mb_per_s"] == 300.0
    assert tensor["rate_by_storage"] == pytest.approx(2000) and tensor["limited_by"] == "storage"
    assert not tensor["meets_target"] and "the s3 ceiling is 300.0" in tensor["short"]


def test_more_cores_let_the_cheaper_format_through_and_ties_go_to_fewer_bytes():
    decision = decide(cores=4)
    assert by_format(decision)["img"]["meets_target"]
    assert decision["recommended"]["format"] == "tensor"  # 0.75 cores against 3
    same = [loader_row("img", 4000.0, 1.0, 50_000), loader_row("tensor", 4000.0, 1.0, 150_000)]
    assert decide(same)["recommended"]["format"] == "img"


def test_candidates_take_each_formats_device_row_and_its_bytes():
    found = {c.format: c for c in candidates(ROWS, {})}
    assert found["img"].row == "img/device" and found["img"].images_per_cpu_s == 1000.0
    assert found["img"].bytes_per_image == pytest.approx(50_000)  # from MB/s / img/s when not given
    assert found["tensor"].ceiling.mb_per_s == 500.0


def test_recommend_from_a_saved_report(tmp_path):
    saved = tmp_path / "bench.json"
    config = {"split": "train", "cpus": 2, "workers": 2, "memory_available_bytes": int(1e12),
              "sources": {fmt: {"format": fmt, "samples": 1000, "bytes_per_image": b} for fmt, b in BYTES.items()}}
    saved.write_text(json.dumps({"rows": ROWS, "config": config, "goals": []}))
    out = tmp_path / "with-decision.json"
    result = run_script("host_benchmark.py", "--recommend", saved, "--target-rate", 3000, "--json", out,
                        "--recommend-plot", tmp_path / "rec.png")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "=> --format tensor with --dataloader-worker 1" in result.stdout
    assert json.loads(out.read_text())["recommendation"]["recommended"]["format"] == "tensor"
    assert (tmp_path / "rec.png").read_bytes().startswith(PNG_MAGIC)
    result = run_script("host_benchmark.py", "--recommend", saved, "--target-rate", 5000, "--instances", 2,
                        "--cores-per-instance", 1)
    assert result.returncode == 0 and "none reaches the target" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("argv, expected", [
    (["--recommend", "--target-rate", "5"], "--compare DIR"),
    (["--recommend", "x.json"], "--target-rate"),
    (["--data", "generated", "--target-rate", "10"], "apply to --recommend only"),
])
def test_recommend_usage_errors(argv, expected):
    result = run_script("host_benchmark.py", *argv)
    assert result.returncode == 2 and expected in result.stderr, result.stderr


def test_a_file_that_is_not_a_saved_report_is_one_line_exit_1(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 5}')
    result = run_script("host_benchmark.py", "--recommend", bad, "--target-rate", 100)
    assert result.returncode == 1 and "not a saved" in result.stderr and "Traceback" not in result.stderr


def test_recommend_end_to_end_matches_the_rows_of_the_same_run(compare_run):
    """The `--compare --recommend --target-rate 3000` run shared with test_host_benchmark (conftest.compare_run)."""
    result, out, _, rec_png = compare_run
    assert result.returncode == 0, result.stdout + result.stderr
    saved = json.loads(out.read_text())
    rows = {row["id"]: row for row in saved["rows"]}
    decision = saved["recommendation"]
    assert {a["format"] for a in decision["formats"]} == {"folder", "img", "tensor"}
    for assessment in decision["formats"]:
        row = rows[assessment["row"]]
        assert assessment["images_per_cpu_s"] == row["images_per_cpu_s"]
        assert assessment["cores_needed"] == pytest.approx(3000 / row["images_per_cpu_s"])
        assert assessment["workers"] == max(1, math.ceil(3000 / row["images_per_cpu_s"] - 1e-9))
        source = saved["config"]["sources"][assessment["format"]]
        assert assessment["mb_per_s_needed_per_host"] == pytest.approx(3000 * source["bytes_per_image"] / 1e6)
        ceiling = rows[f"transport_ceiling/{assessment['format']}@local"]
        assert ceiling["mb_per_s"] > 0 and assessment["storage"] == "page cache"  # the sample fits in memory
    chosen = decision["recommended"]
    assert f"--dataloader-worker {chosen['dataloader_worker']}" in result.stdout or not chosen["meets_target"]
    assert decision["why"] in result.stdout
    assert rec_png.read_bytes().startswith(PNG_MAGIC)
    # The same decision from the saved report, without measuring again.
    again = run_script("host_benchmark.py", "--recommend", out, "--target-rate", 3000)
    assert again.returncode == 0 and decision["why"] in again.stdout, again.stdout + again.stderr


def test_decode_location_is_priced_from_device_decode_rows_or_said_to_be_unmeasured():
    assert "not measured" in decide()["decode_location"]
    device = {**loader_row("img", 20_000.0, 7000.0, 50_000), "id": "img/device-device-decode"}
    decision = decide(ROWS + [device], target=6000, cores=1)
    assessed = by_format(decision)
    assert assessed["img (JPEG decode on the device)"]["cores_needed"] == pytest.approx(6000 / 20_000)
    assert decision["recommended"]["format"] == "img (JPEG decode on the device)"
    assert "priced" in decision["decode_location"]
