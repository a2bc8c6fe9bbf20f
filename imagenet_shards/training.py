"""What a training script needs beside the loader (`imagenet_shards.loader`), in one import.

examples/train_imagenet.py is the model: `torchvision` first (with the CPU wheel's schema fix, so that a
CPU-only torch and a CUDA torchvision import together), the launcher's instance, the exit codes of every
command (0 done, 1 data, 2 usage) and the CPU meter that counts a process tree's CPU-seconds.
"""

from imagenet_shards.torchvision_cpu import torchvision  # noqa: F401  (re-exported: import it before torch's models)
from imagenet_shards.errors import Error, exit_code  # noqa: F401
from imagenet_shards.hostbench.timing import CpuMeter  # noqa: F401
from imagenet_shards.launcher import LauncherError, detect_instance  # noqa: F401

__all__ = ["CpuMeter", "Error", "LauncherError", "detect_instance", "exit_code", "torchvision"]
