"""Instance detection from each launcher's environment, explicit values, errors, argparse, real torchrun."""

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from imagenet_shards.launcher import (
    Instance,
    LauncherError,
    add_instance_arguments,
    detect_instance,
    instance_from_args,
)

REPO = Path(__file__).resolve().parent.parent


def poprun_env(total, local, offset, **extra):
    env = {
        "POPDIST_NUM_TOTAL_REPLICAS": str(total),
        "POPDIST_NUM_LOCAL_REPLICAS": str(local),
        "POPDIST_REPLICA_INDEX_OFFSET": str(offset),
    }
    env.update({name: str(value) for name, value in extra.items()})
    return env


# ---------------------------------------------------------------- each launcher's environment


def test_nothing_set_is_one_single_instance():
    assert detect_instance(environ={}) == Instance(0, 1, "single")
    # Unrelated variables do not count as a launcher.
    assert detect_instance(environ={"HOME": "/root", "LOCAL_WORLD": "3"}) == Instance(0, 1, "single")


@pytest.mark.parametrize(
    "total, local, offset, index, count",
    [(8, 2, 0, 0, 4), (8, 2, 6, 3, 4), (4, 4, 0, 0, 1), (6, 1, 5, 5, 6)],
)
def test_poprun(total, local, offset, index, count):
    instance = detect_instance(environ=poprun_env(total, local, offset))
    assert instance == Instance(index, count, "poprun")


def test_poprun_agrees_with_its_openmpi_processes():
    env = poprun_env(8, 2, 4, OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=4)
    assert detect_instance(environ=env) == Instance(2, 4, "poprun")


def test_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    instance = detect_instance(environ=env)
    assert instance == Instance(3, 4, "torchrun", local_rank=1)
    assert instance.describe() == "instance 3 of 4 (torchrun: RANK=3 WORLD_SIZE=4 LOCAL_RANK=1)"


def test_torchrun_without_local_rank():
    assert detect_instance(environ={"RANK": "0", "WORLD_SIZE": "2"}) == Instance(0, 2, "torchrun")


def test_slurm():
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "77"}
    instance = detect_instance(environ=env)
    assert instance == Instance(2, 3, "slurm")
    assert instance.describe() == "instance 2 of 3 (slurm: SLURM_PROCID=2 SLURM_NTASKS=3)"


def test_openmpi_alone():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    assert detect_instance(environ=env) == Instance(1, 2, "openmpi")


def test_srun_torchrun_uses_the_process_rank_not_the_slurm_task():
    # srun starts one task per node (2 nodes); torchrun starts 4 processes in each.
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2"}
    assert detect_instance(environ=env) == Instance(6, 8, "torchrun", local_rank=2)


def test_mpirun_inside_sbatch_uses_openmpi_not_the_batch_step():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}
    assert detect_instance(environ=env) == Instance(3, 4, "openmpi")


def test_a_losing_launchers_broken_variables_are_ignored():
    env = {"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "junk"}
    assert detect_instance(environ=env) == Instance(1, 2, "torchrun")


def test_reads_os_environ_by_default(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("POPDIST_", "OMPI_", "SLURM_")) or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_PROCID", "4")
    monkeypatch.setenv("SLURM_NTASKS", "5")
    assert detect_instance() == Instance(4, 5, "slurm")


# ---------------------------------------------------------------- contradictions and incomplete environments


@pytest.mark.parametrize(
    "env, words",
    [
        (poprun_env(8, 2, 4, OMPI_COMM_WORLD_RANK=1), ["OMPI_COMM_WORLD_RANK=1", "instance 2 of 4"]),
        (poprun_env(8, 2, 4, OMPI_COMM_WORLD_SIZE=8), ["OMPI_COMM_WORLD_SIZE=8", "POPDIST_NUM_LOCAL_REPLICAS=2"]),
        (poprun_env(6, 4, 0), ["POPDIST_NUM_TOTAL_REPLICAS=6", "not a multiple", "POPDIST_NUM_LOCAL_REPLICAS=4"]),
        (poprun_env(8, 2, 3), ["POPDIST_REPLICA_INDEX_OFFSET=3", "not a multiple", "POPDIST_NUM_LOCAL_REPLICAS=2"]),
        (poprun_env(8, 2, 8), ["POPDIST_REPLICA_INDEX_OFFSET=8", "out of range", "POPDIST_NUM_TOTAL_REPLICAS=8"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2"}, ["LOCAL_RANK=2", "WORLD_SIZE=2"]),
    ],
)
def test_contradictions_name_the_variables(env, words):
    with pytest.raises(LauncherError) as raised:
        detect_instance(environ=env)
    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize(
    "env, missing",
    [
        ({"RANK": "1"}, "WORLD_SIZE"),
        ({"WORLD_SIZE": "4"}, "RANK"),
        ({"LOCAL_RANK": "0"}, "RANK, WORLD_SIZE"),
        ({"SLURM_PROCID": "0"}, "SLURM_NTASKS"),
        ({"SLURM_NTASKS": "4"}, "SLURM_PROCID"),
        ({"OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE"),
        (
            {"POPDIST_NUM_TOTAL_REPLICAS": "8", "POPDIST_NUM_LOCAL_REPLICAS": "2"},
            "POPDIST_REPLICA_INDEX_OFFSET",
        ),
        ({"POPDIST_REPLICA_INDEX_OFFSET": "0"}, "POPDIST_NUM_TOTAL_REPLICAS, POPDIST_NUM_LOCAL_REPLICAS"),
    ],
)
def test_incomplete_environment_names_what_is_missing(env, missing):
    with pytest.raises(LauncherError) as raised:
        detect_instance(environ=env)
    message = str(raised.value)
    assert f"{missing} is not" in message
    for name, value in env.items():
        assert f"{name}={value}" in message


# ---------------------------------------------------------------- out of range and non-integers


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"RANK": "5", "WORLD_SIZE": "4"}, "RANK=5 is out of range for WORLD_SIZE=4"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 is out of range for WORLD_SIZE=4"),
        ({"RANK": "-1", "WORLD_SIZE": "4"}, "RANK=-1 must not be negative"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1 must not be negative"),
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "3"}, "SLURM_PROCID=3 is out of range for SLURM_NTASKS=3"),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "-2"}, "OMPI_COMM_WORLD_SIZE=-2 must be at least 1"),
        (poprun_env(8, 0, 0), "POPDIST_NUM_LOCAL_REPLICAS=0"),
        (poprun_env(0, 2, 0), "POPDIST_NUM_TOTAL_REPLICAS=0"),
        (poprun_env(8, 2, -2), "POPDIST_REPLICA_INDEX_OFFSET=-2 must not be negative"),
    ],
)
def test_out_of_range(env, expected):
    with pytest.raises(LauncherError, match=expected):
        detect_instance(environ=env)


VALID_ENVIRONMENTS = {
    "RANK": {"RANK": "0", "WORLD_SIZE": "2"},
    "WORLD_SIZE": {"RANK": "0", "WORLD_SIZE": "2"},
    "LOCAL_RANK": {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
    "SLURM_NTASKS": {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
    "OMPI_COMM_WORLD_RANK": {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
    "POPDIST_NUM_LOCAL_REPLICAS": poprun_env(4, 2, 0),
}


@pytest.mark.parametrize("text", ["", "two", "1.0", "0x1", "1_0", "3 4", "\u0663"])
@pytest.mark.parametrize("name", sorted(VALID_ENVIRONMENTS))
def test_non_integer_values(name, text):
    env = dict(VALID_ENVIRONMENTS[name])
    assert detect_instance(environ=env).count == 2  # valid before the one variable is spoiled
    env[name] = text
    with pytest.raises(LauncherError) as raised:
        detect_instance(environ=env)
    assert str(raised.value) == f"{name}={text!r} is not an integer"


def test_surrounding_whitespace_is_tolerated():
    assert detect_instance(environ={"RANK": " 1\n", "WORLD_SIZE": "2 "}) == Instance(1, 2, "torchrun")


# ---------------------------------------------------------------- explicit values


def test_explicit_values_override_the_environment():
    env = {"RANK": "3", "WORLD_SIZE": "4", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    instance = detect_instance(1, 3, environ=env)
    assert instance == Instance(1, 3, "explicit")
    assert instance.describe() == "instance 1 of 3 (explicit: --instance-index=1 --instance-count=3)"


def test_explicit_values_rescue_a_broken_environment():
    assert detect_instance(0, 1, environ={"RANK": "banana"}) == Instance(0, 1, "explicit")


def test_explicit_index_takes_its_count_from_the_environment():
    instance = detect_instance(index=2, environ={"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    assert instance == Instance(2, 4, "explicit", local_rank=0)
    assert "WORLD_SIZE=4" in instance.describe()


def test_explicit_count_takes_its_index_from_the_environment():
    instance = detect_instance(count=8, environ={"SLURM_PROCID": "5", "SLURM_NTASKS": "6"})
    assert instance == Instance(5, 8, "explicit")
    assert "SLURM_PROCID=5" in instance.describe()


def test_explicit_half_that_does_not_fit_the_environment():
    with pytest.raises(LauncherError, match=r"instance 4 of 4 is out of range .*--instance-index=4.*WORLD_SIZE=4"):
        detect_instance(index=4, environ={"RANK": "0", "WORLD_SIZE": "4"})
    with pytest.raises(LauncherError, match=r"instance 5 of 3 is out of range .*--instance-count=3.*SLURM_PROCID=5"):
        detect_instance(count=3, environ={"SLURM_PROCID": "5", "SLURM_NTASKS": "6"})


@pytest.mark.parametrize(
    "index, count, expected",
    [
        (1, None, "--instance-index=1 was given without --instance-count"),
        (None, 4, "--instance-count=4 was given without --instance-index"),
    ],
)
def test_explicit_half_without_a_launcher_is_an_error(index, count, expected):
    with pytest.raises(LauncherError, match=expected):
        detect_instance(index, count, environ={})


@pytest.mark.parametrize(
    "index, count, expected",
    [
        (4, 4, "--instance-index=4 is out of range for --instance-count=4"),
        (-1, 4, "--instance-index=-1 must not be negative"),
        (0, 0, "--instance-count=0 must be at least 1"),
        ("1", 4, "--instance-index='1' is not an integer"),
        (0, 2.0, "--instance-count=2.0 is not an integer"),
        (True, 2, "--instance-index=True is not an integer"),
    ],
)
def test_explicit_out_of_range_or_wrong_type(index, count, expected):
    with pytest.raises(LauncherError, match=expected):
        detect_instance(index, count, environ={})


# ---------------------------------------------------------------- argparse


def make_parser():
    parser = argparse.ArgumentParser(prog="prog")
    add_instance_arguments(parser)
    return parser


def test_argparse_defaults_defer_to_the_environment():
    args = make_parser().parse_args([])
    assert (args.instance_index, args.instance_count) == (None, None)
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "3"}
    assert instance_from_args(args, environ=env) == Instance(1, 3, "openmpi")
    assert instance_from_args(args, environ={}) == Instance(0, 1, "single")


def test_argparse_values_override_the_environment():
    args = make_parser().parse_args(["--instance-index", "2", "--instance-count", "5"])
    assert instance_from_args(args, environ={"RANK": "0", "WORLD_SIZE": "1"}) == Instance(2, 5, "explicit")


def test_argparse_help_says_the_options_override_the_environment():
    help_text = " ".join(make_parser().format_help().split())
    assert "--instance-index I" in help_text and "--instance-count N" in help_text
    assert help_text.count("overrides the launcher's environment variables") == 2


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--instance-index", "x"], "argument --instance-index: 'x' is not an integer"),
        (["--instance-index", "-1"], "argument --instance-index: -1 is below the minimum of 0"),
        (["--instance-count", "0"], "argument --instance-count: 0 is below the minimum of 1"),
    ],
)
def test_argparse_rejects_bad_values(argv, expected, capsys):
    with pytest.raises(SystemExit) as exited:
        make_parser().parse_args(argv)
    assert exited.value.code == 2
    assert expected in capsys.readouterr().err


# ---------------------------------------------------------------- real torchrun

# Each process writes its own file: two processes printing to one pipe can interleave their
# lines (print writes the text and the newline separately when unbuffered).
WORKER = """
import dataclasses, json, os
from imagenet_shards.launcher import detect_instance
instance = detect_instance()
with open(f"instance-{os.getpid()}.json", "w") as handle:
    json.dump(dataclasses.asdict(instance), handle)
"""


def test_real_torchrun_gives_each_process_its_own_index(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(WORKER))
    launcher_vars = ("POPDIST_", "OMPI_", "SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTHONPATH")
    env = {name: value for name, value in os.environ.items() if not name.startswith(launcher_vars)}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    completed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    seen = [json.loads(path.read_text()) for path in tmp_path.glob("instance-*.json")]
    assert sorted((item["index"], item["count"], item["source"], item["local_rank"]) for item in seen) == [
        (0, 2, "torchrun", 0),
        (1, 2, "torchrun", 1),
    ]
