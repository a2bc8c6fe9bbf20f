"""Emulated accelerators (issue 44), storage depth: a local folder against the same shards on a loopback S3.

    python benchmarks/emulated_s3.py --dataset DIR [--out benchmark-output/emulated-s3] [--profile resnet50-h100]
        [--accelerators auto] [--seconds 10] [--max-accelerators 32] [--runs 1] [--split train]

Starts `weed mini` (SeaweedFS, the S3 server the tests start: testing_rigs/s3_server.py) on
loopback, uploads DIR (a converted dataset) with upload_dataset.py, then runs

    host_benchmark.py --data imagenet --imagenet-data-path DIR|s3://... --accelerators A --profile P --depth storage

on each, and prints their answers side by side (accelerators fed, samples/s and MB/s at each N) with the
two JSON reports in OUT. Loopback S3 costs what the S3 protocol costs the host's CPU (SigV4, HTTP, the
server's own work on the same cores), not a network's bandwidth or latency: see docs/emulated-accelerators.md.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def seaweed_server_class():
    """The loopback S3 server, the tests' own (testing_rigs/, beside the library: the wheel does not ship it)."""
    from testing_rigs.s3_server import SeaweedServer

    return SeaweedServer


def run(command, env=None) -> subprocess.CompletedProcess:
    print("+ " + " ".join(map(str, command)), flush=True)
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
    result = subprocess.run([str(c) for c in command], env=full_env, cwd=REPO, text=True, capture_output=True)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result


def emulate(location, out_json, args, env=None) -> dict:
    command = [sys.executable, REPO / "host_benchmark.py", "--data", "imagenet", "--imagenet-data-path", location,
               "--split", args.split, "--accelerators", args.accelerators, "--profile", args.profile,
               "--depth", "storage", "--seconds", args.seconds, "--max-accelerators", args.max_accelerators,
               "--runs", args.runs, "--json", out_json]
    result = run(command + (["--s3-endpoint", env["S3_ENDPOINT"]] if env else []),
                 {k: v for k, v in (env or {}).items() if k != "S3_ENDPOINT"})
    if result.returncode != 0:
        raise SystemExit(f"emulated_s3: host_benchmark failed on {location} (exit {result.returncode})")
    return json.loads(Path(out_json).read_text())


def summary_lines(name, report) -> list:
    answer = report["headline"]
    lines = [f"{name:<6} accelerators fed {answer['accelerators_fed']}, "
             f"{answer['accelerators_fed_per_core']:.2f} per core"]
    for row in report["results"]:
        lines.append(f"       N {row['accelerators']:>3}: AU {row['au_mean']:.3f} (min {row['au_min']:.3f}) "
                     f"{row['samples_per_s']:>9,.0f} samples/s {row['mb_per_s']:>7,.0f} MB/s "
                     f"CPU {row['cpu_s_per_sample'] * 1e3:.3f} ms/sample")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="a converted dataset (img, tensor or tfrecord)")
    parser.add_argument("--out", default="benchmark-output/emulated-s3")
    parser.add_argument("--profile", default="resnet50-h100")
    parser.add_argument("--accelerators", default="auto")
    parser.add_argument("--seconds", default="10")
    parser.add_argument("--max-accelerators", default="32")
    parser.add_argument("--runs", default="1")
    parser.add_argument("--split", default="train")
    args = parser.parse_args(argv)
    dataset = Path(args.dataset).resolve()
    if not (dataset / "metadata.json").is_file():
        print(f"emulated_s3: {dataset}: not a converted dataset (no metadata.json)", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    server = seaweed_server_class()(out / "seaweedfs").start()
    try:
        server.create_bucket("emulated")
        target = f"s3://emulated/{dataset.name}"
        env = server.env()
        upload = run([sys.executable, REPO / "upload_dataset.py", dataset, target, "--s3-endpoint", server.endpoint,
                      "--no-progress"], env)
        if upload.returncode != 0:
            print("emulated_s3: the upload failed", file=sys.stderr)
            return 1
        local = emulate(dataset, out / "local.json", args)
        remote = emulate(target, out / "s3.json", args, dict(env, S3_ENDPOINT=server.endpoint))
    finally:
        server.stop()
    print(f"\n{args.profile}, storage depth, {args.split} split of {dataset}:")
    print("\n".join(summary_lines("local", local) + summary_lines("s3", remote)))
    print(f"reports: {out / 'local.json'}, {out / 's3.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
