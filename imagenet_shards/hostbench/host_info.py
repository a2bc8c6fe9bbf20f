"""The host the benchmark figures come from: what it is, and how busy other programs keep it."""

from __future__ import annotations

import os
import platform
import time


def host_description() -> dict:
    import PIL
    import torch

    return {
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "hostname": platform.node(),
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pillow": PIL.__version__,
        "platform": platform.platform(),
    }


def cores_busy_now(seconds: float = 0.5) -> float | None:
    """How many cores the whole host keeps busy, sampled from /proc/stat over `seconds` (None without it)."""
    def busy_and_total():
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        return sum(values) - idle, sum(values)

    try:
        busy0, total0 = busy_and_total()
        time.sleep(seconds)
        busy1, total1 = busy_and_total()
    except (OSError, ValueError, IndexError):
        return None
    cpus = os.cpu_count() or 1
    return cpus * (busy1 - busy0) / max(1, total1 - total0)


def busy_host_warning(usable_cpus: int | None = None, busy: float | None = None) -> str:
    """A warning when other programs already keep the CPUs busy (call before starting any worker)."""
    usable = usable_cpus or host_description()["usable_cpus"]
    if busy is None:
        if not hasattr(os, "getloadavg"):
            return ""
        busy, what = os.getloadavg()[0], "load average"
    else:
        what = "cores busy"
    if busy < 0.25 * usable:
        return ""
    return (f"other programs keep this host busy before the benchmark starts ({what} {busy:.1f} of {usable} CPUs): "
            f"wall-clock figures (img/s, per worker, latency) will be low and noisy; images per CPU-second hold "
            f"better")


def memory_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (what the page cache could hold without swapping), else None."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
