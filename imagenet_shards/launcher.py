"""Which instance of a distributed job this process is: its index and the instance count.

Every process that reads a share of the data calls `detect_instance()` (or, in a CLI,
`add_instance_arguments()` + `instance_from_args()`) and gets an `Instance(index, count, source)`.

Sources, in order of precedence (the first launcher whose variables are present wins):

1. explicit  ``--instance-index`` / ``--instance-count`` (or the ``index``/``count`` arguments).
   Both given: the environment is not consulted at all, so they also rescue a broken environment.
   Only one given: the other comes from the launcher found in the environment; no launcher is an error.
2. poprun    ``POPDIST_NUM_TOTAL_REPLICAS``, ``POPDIST_NUM_LOCAL_REPLICAS``, ``POPDIST_REPLICA_INDEX_OFFSET``.
   One instance (process) owns ``local`` replicas, so count = total // local, index = offset // local.
   poprun starts its instances through mpirun, so ``OMPI_COMM_WORLD_RANK``/``_SIZE``, where set,
   must equal index/count.
3. torchrun  ``RANK``, ``WORLD_SIZE`` (``LOCAL_RANK`` is kept and checked). One instance per process.
4. OpenMPI   ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``.
5. SLURM     ``SLURM_PROCID``, ``SLURM_NTASKS``.
6. single    nothing set: ``Instance(0, 1, 'single')``.

Why torchrun and OpenMPI beat SLURM: both are commonly started *inside* a SLURM job, and then the SLURM
variables describe something else. ``srun torchrun ...`` runs one SLURM task per node, each starting
several processes: SLURM_PROCID is the node's task number, while RANK/WORLD_SIZE identify the process.
``mpirun`` inside ``sbatch`` starts processes that inherit the batch script's SLURM_PROCID=0; only the
OMPI_COMM_WORLD_* variables tell them apart. Variables of a launcher that lost are ignored, not
cross-checked, because their meaning legitimately differs. poprun is cross-checked against OpenMPI
because there the two describe the same processes.

Caveat (SLURM): an ``sbatch --ntasks=N`` script that runs this program directly, without ``srun``,
carries SLURM_PROCID=0 and SLURM_NTASKS=N from the batch step, so it would act as instance 0 of N and
process 1/N of the data. Launch with ``srun``, or pass ``--instance-index 0 --instance-count 1``.
Print `Instance.describe()` at start-up so the log shows where the numbers came from.

Contradictory, incomplete or out-of-range values raise `LauncherError` naming the variables and values.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from typing import Mapping

from imagenet_shards.errors import Error


POPRUN_VARS = ("POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
OPENMPI_VARS = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
SLURM_VARS = ("SLURM_PROCID", "SLURM_NTASKS")

_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")


class LauncherError(Error, ValueError):
    """The launcher's environment or the explicit values do not describe a valid instance."""


@dataclass(frozen=True)
class Instance:
    index: int  # this instance's index, 0 <= index < count
    count: int  # number of instances
    source: str  # "explicit" | "poprun" | "torchrun" | "slurm" | "openmpi" | "single"
    local_rank: int | None = None  # torchrun LOCAL_RANK where known
    # The variables/arguments the numbers came from, for describe(); not part of identity.
    evidence: str = field(default="", compare=False)

    def describe(self) -> str:
        where = f"{self.source}: {self.evidence}" if self.evidence else self.source
        return f"instance {self.index} of {self.count} ({where})"


def _read_int(environ: Mapping[str, str], name: str) -> int | None:
    """The integer value of `name`, None when unset; non-integer text (including empty) is an error."""
    text = environ.get(name)
    if text is None:
        return None
    if not _INTEGER.fullmatch(text):
        raise LauncherError(f"{name}={text!r} is not an integer")
    return int(text)


def _show(values: Mapping[str, int]) -> str:
    return " ".join(f"{name}={value}" for name, value in values.items())


def _check_range(index_name: str, index: int, count_name: str, count: int) -> None:
    if count < 1:
        raise LauncherError(f"{count_name}={count} must be at least 1")
    if index < 0:
        raise LauncherError(f"{index_name}={index} must not be negative")
    if index >= count:
        raise LauncherError(f"{index_name}={index} is out of range for {count_name}={count}")


def _require_all(launcher: str, required: tuple[str, ...], values: Mapping[str, int | None]) -> None:
    missing = [name for name in required if values[name] is None]
    if missing:
        present = {name: value for name, value in values.items() if value is not None}
        raise LauncherError(
            f"incomplete {launcher} environment: {_show(present)} is set but {', '.join(missing)} "
            f"is not; set it, or pass --instance-index and --instance-count"
        )


def _from_poprun(environ: Mapping[str, str]) -> Instance:
    values = {name: _read_int(environ, name) for name in POPRUN_VARS}
    _require_all("poprun", POPRUN_VARS, values)
    total, local, offset = (values[name] for name in POPRUN_VARS)
    if local < 1 or total < 1:
        raise LauncherError(f"replica counts must be at least 1: {_show(values)}")
    if offset < 0:
        raise LauncherError(f"POPDIST_REPLICA_INDEX_OFFSET={offset} must not be negative")
    if total % local:
        raise LauncherError(
            f"POPDIST_NUM_TOTAL_REPLICAS={total} is not a multiple of POPDIST_NUM_LOCAL_REPLICAS={local}"
        )
    if offset % local:
        raise LauncherError(
            f"POPDIST_REPLICA_INDEX_OFFSET={offset} is not a multiple of POPDIST_NUM_LOCAL_REPLICAS={local}"
        )
    if offset >= total:
        raise LauncherError(
            f"POPDIST_REPLICA_INDEX_OFFSET={offset} is out of range for POPDIST_NUM_TOTAL_REPLICAS={total}"
        )
    index, count = offset // local, total // local
    evidence = _show(values)
    rank, size = (_read_int(environ, name) for name in OPENMPI_VARS)
    if (rank is not None and rank != index) or (size is not None and size != count):
        mpi = _show({name: value for name, value in zip(OPENMPI_VARS, (rank, size)) if value is not None})
        raise LauncherError(
            f"poprun and OpenMPI disagree: {evidence} means instance {index} of {count}, but {mpi}"
        )
    if rank is not None or size is not None:
        evidence += " (agrees with OMPI_COMM_WORLD_*)"
    return Instance(index, count, "poprun", evidence=evidence)


def _from_torchrun(environ: Mapping[str, str]) -> Instance:
    values = {name: _read_int(environ, name) for name in TORCHRUN_VARS}
    _require_all("torchrun", ("RANK", "WORLD_SIZE"), values)
    rank, world_size, local_rank = values["RANK"], values["WORLD_SIZE"], values["LOCAL_RANK"]
    _check_range("RANK", rank, "WORLD_SIZE", world_size)
    if local_rank is not None:
        _check_range("LOCAL_RANK", local_rank, "WORLD_SIZE", world_size)
    shown = {name: value for name, value in values.items() if value is not None}
    return Instance(rank, world_size, "torchrun", local_rank=local_rank, evidence=_show(shown))


def _from_pair(environ: Mapping[str, str], source: str, names: tuple[str, str]) -> Instance:
    values = {name: _read_int(environ, name) for name in names}
    _require_all(source, names, values)
    index_name, count_name = names
    _check_range(index_name, values[index_name], count_name, values[count_name])
    return Instance(values[index_name], values[count_name], source, evidence=_show(values))


def _from_environment(environ: Mapping[str, str]) -> Instance:
    def present(names: tuple[str, ...]) -> bool:
        return any(name in environ for name in names)

    if present(POPRUN_VARS):
        return _from_poprun(environ)
    if present(TORCHRUN_VARS):
        return _from_torchrun(environ)
    if present(OPENMPI_VARS):
        return _from_pair(environ, "openmpi", OPENMPI_VARS)
    if present(SLURM_VARS):
        return _from_pair(environ, "slurm", SLURM_VARS)
    return Instance(0, 1, "single")


def _check_explicit(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise LauncherError(f"{name}={value!r} is not an integer")


def detect_instance(
    index: int | None = None, count: int | None = None, environ: Mapping[str, str] | None = None
) -> Instance:
    """This process's instance: explicit values first, then the launcher's environment (see module doc).

    `environ` defaults to os.environ; tests pass a dict.
    """
    if environ is None:
        environ = os.environ
    _check_explicit("--instance-index", index)
    _check_explicit("--instance-count", count)
    if index is not None and count is not None:
        _check_range("--instance-index", index, "--instance-count", count)
        return Instance(index, count, "explicit", evidence=f"--instance-index={index} --instance-count={count}")
    if index is None and count is None:
        return _from_environment(environ)

    found = _from_environment(environ)
    given = f"--instance-index={index}" if index is not None else f"--instance-count={count}"
    if found.source == "single":
        missing = "--instance-count" if index is not None else "--instance-index"
        raise LauncherError(f"{given} was given without {missing}, and no launcher environment supplies it")
    # Combine the given value with the launcher's other value, then check the pair together.
    index = found.index if index is None else index
    count = found.count if count is None else count
    evidence = f"{given}, other value from {found.source}: {found.evidence}"
    if count < 1 or not 0 <= index < count:
        raise LauncherError(f"instance {index} of {count} is out of range ({evidence})")
    return Instance(index, count, "explicit", local_rank=found.local_rank, evidence=evidence)


def _argument_int(text: str, minimum: int) -> int:
    if not _INTEGER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer")
    value = int(text)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} is below the minimum of {minimum}")
    return value


def add_instance_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --instance-index / --instance-count, which override the launcher's environment variables."""
    group = parser.add_argument_group(
        "instance", "which share of the work this process does; detected from poprun, torchrun, "
        "OpenMPI or SLURM environment variables unless given here"
    )
    group.add_argument(
        "--instance-index", type=lambda text: _argument_int(text, 0), default=None, metavar="I",
        help="this instance's index, 0-based; overrides the launcher's environment variables",
    )
    group.add_argument(
        "--instance-count", type=lambda text: _argument_int(text, 1), default=None, metavar="N",
        help="number of instances; overrides the launcher's environment variables",
    )


def instance_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Instance:
    """The instance for parsed arguments from a parser given `add_instance_arguments`."""
    return detect_instance(args.instance_index, args.instance_count, environ)
