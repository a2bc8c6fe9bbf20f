"""One exception root: every exception the package defines derives from imagenet_shards.errors.Error, usage errors
from its UsageError, each keeping the builtin base it had (so `except ValueError` still catches it)."""

import importlib
import inspect
import pkgutil

import pytest

import imagenet_shards
from imagenet_shards.errors import EXIT_DATA, EXIT_USAGE, DatasetError, Error, UsageError, exit_code


def package_exceptions():
    found = {}
    for info in pkgutil.walk_packages(imagenet_shards.__path__, "imagenet_shards."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                found[f"{info.name}.{name}"] = value
    return found


def test_every_exception_the_package_defines_has_the_one_root():
    found = package_exceptions()
    assert len(found) >= 40
    assert sorted(name for name, cls in found.items() if not issubclass(cls, Error)) == []


@pytest.mark.parametrize("module, name, base", [
    ("imagenet_shards.storage", "StorageUnavailable", RuntimeError), ("imagenet_shards.storage", "ShardChangedError", OSError),
    ("imagenet_shards.launcher", "LauncherError", ValueError), ("imagenet_shards.formats", "UnknownFormatError", ValueError),
    ("imagenet_shards.loader.transform.jpeg_crop", "JpegError", OSError), ("imagenet_shards.repartition.plan", "RepartitionUsageError", ValueError),
])
def test_todays_builtin_bases_are_kept(module, name, base):
    assert issubclass(getattr(importlib.import_module(module), name), base)


@pytest.mark.parametrize("module, name", [
    ("imagenet_shards.convert.failures", "UsageError"), ("imagenet_shards.tools.tar_shards", "UsageError"),
    ("imagenet_shards.repartition.plan", "RepartitionUsageError"), ("imagenet_shards.validate.report", "ValidationUsageError"),
    ("imagenet_shards.hostbench.run", "CannotStart"),
])
def test_usage_errors_share_one_class_and_exit_2(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, UsageError) and exit_code(cls("x")) == EXIT_USAGE


def test_other_errors_exit_1():
    from imagenet_shards.storage import StorageUnavailable

    assert exit_code(DatasetError("x")) == exit_code(StorageUnavailable("x")) == exit_code(OSError()) == EXIT_DATA
