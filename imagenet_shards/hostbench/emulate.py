"""Emulated accelerators, in the manner of MLPerf Storage / DLIO: the arithmetic, no torch, no processes.

An emulated accelerator takes a batch from its own loader, then sleeps the profile's compute time for
that batch. Its accelerator utilisation (AU) is

    AU = compute time / total time = sum(compute_i) / sum(wait_i + compute_i),  steps i >= 2

(the first step is left out: it holds the workers' start-up, as DLIO leaves it out). A run of N
accelerators passes when every accelerator's AU >= the threshold (MLPerf Storage: 0.90 for ResNet-50),
and a host's result is the largest N that passes (`search_largest`: doubling, then bisection).

What runs the accelerators (processes, loaders, torchrun) is imagenet_shards/hostbench/accelerators.py.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from imagenet_shards.errors import UsageError

DEFAULT_THRESHOLD = 0.90  # MLPerf Storage's AU threshold for ResNet-50 (and 3D U-Net)
MLPERF_SOURCE = ("MLPerf Storage, mlcommons/storage configs/dlio/workload/resnet50_{gpu}.yaml "
                 "(commit caa90c9, 2025-06-13): batch_size 400, computation_time {time} s")


@dataclass(frozen=True)
class Profile:
    """One accelerator's appetite: `batch_size` samples, then `compute_s` seconds of compute."""

    name: str
    batch_size: int
    compute_s: float
    source: str

    @property
    def samples_per_s(self) -> float:
        """What one accelerator consumes when it never waits (inf for compute_s 0)."""
        return self.batch_size / self.compute_s if self.compute_s > 0 else math.inf


PROFILES = {
    "resnet50-h100": Profile("resnet50-h100", 400, 0.224, MLPERF_SOURCE.format(gpu="h100", time=0.224)),
    "resnet50-a100": Profile("resnet50-a100", 400, 0.435, MLPERF_SOURCE.format(gpu="a100", time=0.435)),
    # measured here: examples/train_imagenet.py on one H200 (ResNet-50, bf16 autocast, channels_last, batch 256)
    "resnet50-h200-measured": Profile("resnet50-h200-measured", 256, 0.0552,
                                      "docs/train-on-gpu.md, 'Measured on one H200 (2026-11-27)', its last row: "
                                      "step p50 55.9 ms less data wait p50 0.7 ms, batch 256"),
}


class ProfileError(UsageError):
    """A profile that cannot be used (unknown name, unreadable file, bad numbers): exit 2."""


def resolve_profile(name: str | None, batch_size: int | None = None, compute_s: float | None = None) -> Profile:
    """`--profile NAME|FILE` (a built-in name, a DLIO workload .yaml, or a train_imagenet.py --step-log), or
    `--batch-size`/`--compute-time` by hand; given with a profile they override its figures."""
    if name is None:
        if batch_size is None or compute_s is None:
            raise ProfileError("emulated accelerators need --profile NAME|FILE, or --batch-size and --compute-time")
        return _checked(Profile("by-hand", batch_size, compute_s, "--batch-size and --compute-time"))
    if name in PROFILES:
        profile = PROFILES[name]
    elif name.endswith((".yaml", ".yml")):
        profile = profile_from_dlio_yaml(name)
    elif Path(name).is_file():
        profile = profile_from_step_log(name)
    else:
        raise ProfileError(f"--profile {name}: not one of {', '.join(PROFILES)}, a DLIO workload .yaml or a "
                           f"train_imagenet.py --step-log file")
    if batch_size is not None or compute_s is not None:
        profile = Profile(profile.name + "*", batch_size or profile.batch_size,
                          profile.compute_s if compute_s is None else compute_s,
                          profile.source + " (overridden by hand)")
    return _checked(profile)


def _checked(profile: Profile) -> Profile:
    if profile.batch_size < 1 or not 0 <= profile.compute_s < 3600:
        raise ProfileError(f"profile {profile.name}: batch {profile.batch_size}, compute {profile.compute_s} s: "
                           f"needs a batch >= 1 and a compute time in [0, 3600) s")
    return profile


def profile_from_dlio_yaml(path: str) -> Profile:
    """A DLIO workload YAML's reader.batch_size and train.computation_time (e.g. MLPerf Storage's own config)."""
    try:
        import yaml
    except ImportError:
        raise ProfileError(f"--profile {path}: reading a DLIO YAML needs PyYAML (pip install pyyaml)") from None
    try:
        config = yaml.safe_load(Path(path).read_text())
        batch = int(config["reader"]["batch_size"])
        compute = float(config["train"]["computation_time"])
    except OSError as error:
        raise ProfileError(f"--profile {path}: cannot read: {error.strerror or error}") from None
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as error:
        raise ProfileError(f"--profile {path}: not a DLIO workload with reader.batch_size and "
                           f"train.computation_time ({type(error).__name__}: {error})") from None
    model = config.get("model")
    name = model.get("name", Path(path).stem) if isinstance(model, dict) else Path(path).stem
    return Profile(f"dlio:{name}", batch, compute, f"DLIO workload {path}")


def profile_from_step_log(path: str) -> Profile:
    """A measured profile from examples/train_imagenet.py --step-log (one JSON line per step: images,
    wait_s, step_s): the median batch and the median of (step_s - wait_s), the model's own time a step,
    first step left out."""
    steps = []
    try:
        with open(path) as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    entry = json.loads(line)
                    steps.append((int(entry["images"]), float(entry["step_s"]) - float(entry["wait_s"])))
    except OSError as error:
        raise ProfileError(f"--profile {path}: cannot read: {error.strerror or error}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise ProfileError(f"--profile {path}: line {number} is not a train_imagenet.py --step-log line "
                           f"(images, wait_s, step_s): {type(error).__name__}: {error}") from None
    steps = steps[1:]
    if not steps:
        raise ProfileError(f"--profile {path}: fewer than 2 steps logged (the first is left out)")
    batch = int(statistics.median(s[0] for s in steps))
    compute = statistics.median(s[1] for s in steps)
    return Profile(f"measured:{Path(path).name}", batch, compute,
                   f"train_imagenet.py --step-log {path}: median of {len(steps)} steps (step_s - wait_s)")


def check_threshold(value: float) -> float:
    if not 0 < value <= 1:
        raise UsageError(f"--au-threshold {value:g}: not in (0, 1]")
    return value


def utilisation(computes: list, steps: list) -> float | None:
    """AU of one accelerator: its steps' compute time (the profile's) over their whole time (the wait for
    the batch + compute, measured), the first step left out; None when nothing is left or compute is 0."""
    computes, steps = computes[1:], steps[1:]
    if not steps or sum(steps) <= 0 or sum(computes) <= 0:
        return None
    return sum(computes) / sum(steps)


def percentile(values: list, q: float) -> float | None:
    """The q-th percentile (0..100), linear between the order statistics; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarise(accelerators: list, profile: Profile, threshold: float) -> dict:
    """One N's figures from each accelerator's record (accelerators.consume: waits, steps, computes, samples,
    bytes, seconds; cpu_s, epochs): AU mean/std per accelerator, samples/s, MB/s, CPU-s per sample, wait p50/p90."""
    aus = [utilisation(a["computes"], a["steps"]) for a in accelerators]
    known = [au for au in aus if au is not None]
    waits = [w for a in accelerators for w in a["waits"][1:]]
    samples = sum(a["samples"] for a in accelerators)
    seconds = max((a["seconds"] for a in accelerators), default=0.0) or 1e-9
    cpu = sum(a["cpu_s"] for a in accelerators)
    n = len(accelerators)
    waited = [sum(a["waits"][1:]) / sum(a["steps"][1:]) for a in accelerators if sum(a["steps"][1:]) > 0]
    wait_share = statistics.fmean(waited) if waited else None
    return {
        "accelerators": n,
        "au_per_accelerator": aus,
        "au_mean": statistics.fmean(known) if known else None,
        "au_std": statistics.pstdev(known) if len(known) > 1 else (0.0 if known else None),
        "au_min": min(known) if known else None,
        "passed": bool(known) and len(known) == n and min(known) >= threshold,
        # 1 - AU = the share of step time spent waiting for the batch + the share the sleep overran (a host too
        # busy to wake the accelerator's process on time: CPU contention, not the data)
        "wait_share": wait_share,
        "late_share": None if wait_share is None or not known else max(0.0, 1 - statistics.fmean(known) - wait_share),
        "steps": sum(max(0, len(a["waits"]) - 1) for a in accelerators),
        "samples": samples, "seconds": seconds,
        "samples_per_s": samples / seconds,
        "mb_per_s": sum(a["bytes"] for a in accelerators) / 1e6 / seconds,
        "cpu_s_per_sample": cpu / samples if samples else None,
        "wait_ms_p50": _ms(percentile(waits, 50)), "wait_ms_p90": _ms(percentile(waits, 90)),
        "epochs_read": max((a.get("epochs") or 0 for a in accelerators), default=0),
        "profile_samples_per_s": n * profile.samples_per_s if profile.compute_s > 0 else None,
    }


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def search_largest(passes, max_n: int, start: int = 1) -> tuple:
    """The largest N in [start, max_n] for which `passes(N)` holds, assuming it holds for every smaller N
    once it holds for one: N = 1, 2, 4, ... until one fails (or max_n), then bisection between the last
    that passed and the first that failed. Returns (largest N or 0, [N tried, in order])."""
    tried = []

    def attempt(n):
        tried.append(n)
        return passes(n)

    good, bad, n = 0, None, start
    while True:
        if not attempt(n):
            bad = n
            break
        good = n
        if n >= max_n:
            break
        n = min(n * 2, max_n)
    if bad is None:
        return good, tried
    while bad - good > 1:
        middle = (good + bad) // 2
        if attempt(middle):
            good = middle
        else:
            bad = middle
    return good, tried


def headline(best: int, results: dict, profile: Profile, cores: float) -> dict:
    """The answer: accelerators fed, and fed per host core; where even one is not fed, the fractional
    figure (delivered samples/s at N = 1 / the profile's rate) and the AU at N = 1."""
    one = results.get(1)
    answer = {"accelerators_fed": best, "host_cores": cores,
              "accelerators_fed_per_core": best / cores if cores else None}
    if best == 0 and one is not None:
        rate = profile.samples_per_s
        answer["fraction_of_one"] = one["samples_per_s"] / rate if math.isfinite(rate) else None
        answer["au_at_1"] = one["au_mean"]
        answer["fraction_of_one_per_core"] = (answer["fraction_of_one"] / cores
                                              if answer["fraction_of_one"] is not None and cores else None)
    return answer


def spread(values: list) -> float | None:
    """(max - min) / median of repeated runs' figures: MLPerf's 'within 5%' is spread <= 0.05."""
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle else None


def page_cache_note(bytes_read_per_epoch: float, memory_available: float | None) -> str | None:
    """MLPerf Storage's rule: the dataset is >= 5x host RAM, so the page cache cannot serve it. A warning
    when this run's epoch fits the memory the page cache may use (recommend.py's check); else None."""
    if not memory_available or bytes_read_per_epoch > memory_available:
        return None
    ratio = bytes_read_per_epoch / memory_available
    return (f"the data read ({bytes_read_per_epoch / 1e9:,.2f} GB an epoch) fits the page cache "
            f"({memory_available / 1e9:,.1f} GB available; MLPerf Storage asks for a dataset >= 5x host RAM, "
            f"this is {ratio:.2f}x): after the first epoch the figures are memory's, not the storage's")


def profile_dict(profile: Profile) -> dict:
    return asdict(profile) | {"samples_per_s": profile.samples_per_s if math.isfinite(profile.samples_per_s) else None}
