"""Builds `imagenet_shards._jpeg_crop` (the region JPEG decoder, native/jpeg_crop/) with the package:
`pip install .` is one step.

The project's metadata is in pyproject.toml; this file only adds the extension. It links the system
libjpeg-turbo (`-ljpeg`). Where its headers are missing (or the compiler fails) the extension is left
out with one printed line and the install still succeeds: the loader then decodes JPEGs whole with
PIL and says so once (imagenet_shards/loader/jpeg_crop.py). `make` builds the same extension into the checkout
(`setup.py build_ext --inplace`, scripts/setup_venv.sh). DATASETS_NATIVE_BUILD=0 leaves it out on purpose
(tests/test_train_example.py's editable install: the checkout's build is there already).
"""
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "native/jpeg_crop"


class OptionalBuildExt(build_ext):
    """build_ext that skips an extension which does not compile or link, saying so in one line."""

    def run(self):
        try:
            super().run()
        except Exception as error:  # no compiler at all (DistutilsPlatformError and kin)
            self._skipped(error)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as error:  # CompileError / LinkError: e.g. jpeglib.h not found
            self._skipped(error, ext.name)

    @staticmethod
    def _skipped(error, name="imagenet_shards._jpeg_crop"):
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"WARNING: {name} (native JPEG region decoder) not built ({first}); the loader decodes JPEGs "
              f"whole with PIL. Install libjpeg-turbo's headers (libjpeg62-turbo-dev, libjpeg-turbo8-dev or "
              f"libjpeg-turbo-devel) and reinstall for the fast path.")


WANTED = os.environ.get("DATASETS_NATIVE_BUILD", "1").strip() != "0"

setup(
    ext_modules=[] if not WANTED else [
        Extension("imagenet_shards._jpeg_crop", [f"{NATIVE}/_jpeg_crop.c", f"{NATIVE}/resample.c"],
                  depends=[f"{NATIVE}/resample.h"], libraries=["jpeg"], extra_compile_args=["-O2"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
