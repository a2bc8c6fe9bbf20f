"""One exception root: every exception the package defines derives from datasets.errors.Error, usage errors
from its UsageError, each keeping the builtin base it had (so `except ValueError` still catches it)."""

import importlib
import inspect
import pkgutil

import pytest

import datasets
from datasets.errors import EXIT_DATA, EXIT_USAGE, DatasetError, Error, UsageError, exit_code


def package_exceptions():
    found = {}
    for info in pkgutil.walk_packages(datasets.__path__, "datasets."):
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
    ("datasets.storage", "StorageUnavailable", RuntimeError), ("datasets.storage", "ShardChangedError", OSError),
    ("datasets.launcher", "LauncherError", ValueError), ("datasets.formats", "UnknownFormatError", ValueError),
    ("datasets.loader.jpeg_crop", "JpegError", OSError), ("datasets.repartition.plan", "RepartitionUsageError", ValueError),
])
def test_todays_builtin_bases_are_kept(module, name, base):
    assert issubclass(getattr(importlib.import_module(module), name), base)


@pytest.mark.parametrize("module, name", [
    ("datasets.convert.failures", "UsageError"), ("datasets.tools.tar_shards", "UsageError"),
    ("datasets.repartition.plan", "RepartitionUsageError"), ("datasets.validate.report", "ValidationUsageError"),
    ("datasets.hostbench.run", "CannotStart"),
])
def test_usage_errors_share_one_class_and_exit_2(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, UsageError) and exit_code(cls("x")) == EXIT_USAGE


def test_other_errors_exit_1():
    from datasets.storage import StorageUnavailable

    assert exit_code(DatasetError("x")) == exit_code(StorageUnavailable("x")) == exit_code(OSError()) == EXIT_DATA
