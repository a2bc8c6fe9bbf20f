#!/usr/bin/env bash
# Creates the project-local virtual environment (.venv) with the pinned stack,
# then builds pillow-simd LAST (any later pip resolve touching torchvision would
# reinstall stock pillow over it). Called by `make` only when requirements.txt or
# this script changed, so a second `make demo`/`make test` reinstalls nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY=$VENV/bin/python
PILLOW_SIMD=pillow-simd==12.1.1.post0

say() { printf '\n=== %s\n' "$*"; }

if [ ! -x "$PY" ]; then
  say "creating $VENV"
  python3 -m venv "$VENV"
fi
"$PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true

say "installing the pinned stack (requirements.txt)"
"$PY" -m pip install -r requirements.txt

# pillow-simd compiles against libjpeg and zlib headers.
if ! dpkg -s libjpeg-dev zlib1g-dev >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  say "installing libjpeg-dev and zlib1g-dev for the pillow-simd build"
  (apt-get update -qq && apt-get install -y -qq libjpeg-dev zlib1g-dev) || true
fi

active=""
say "building $PILLOW_SIMD with AVX2"
"$PY" -m pip uninstall -y -q pillow pillow-simd >/dev/null 2>&1 || true
if CC="cc -mavx2" "$PY" -m pip install -q --no-cache-dir --no-binary :all: "$PILLOW_SIMD"; then
  active="pillow-simd (AVX2)"
else
  say "AVX2 build failed; trying the plain pillow-simd build"
  if "$PY" -m pip install -q --no-cache-dir --no-binary :all: "$PILLOW_SIMD"; then
    active="pillow-simd (plain, no AVX2)"
  else
    say "pillow-simd did not build; FALLING BACK TO STOCK PILLOW (decoding will be ~1.5x slower)"
    "$PY" -m pip install -q pillow
    active="stock pillow (pillow-simd build FAILED)"
  fi
fi
version=$("$PY" -c "import PIL; print(PIL.__version__)")
echo "$active $version" > "$VENV/.pil-flavour"
say "ACTIVE PIL: $active, PIL.__version__ = $version"

# The region JPEG decoder (native/jpeg_crop) links the same system libjpeg-turbo as pillow-simd; built after it
# so nothing reinstalls over it, into the checkout's package (imagenet_shards/_jpeg_crop*.so, .gitignore'd) as a
# development build is: the same module wherever the checkout is imported from (PYTHONPATH, `pip install -e .`).
# Without it the loader decodes whole train JPEGs.
say "building imagenet_shards._jpeg_crop (native/jpeg_crop, region JPEG decode) against the system libjpeg-turbo"
"$PY" -m pip uninstall -y -q jpeg-crop >/dev/null 2>&1 || true  # an earlier .venv's copy in site-packages
rm -rf build imagenet_shards/_jpeg_crop*.so
if "$PY" setup.py -q build_ext --inplace && "$PY" -c "from imagenet_shards import _jpeg_crop" 2>/dev/null; then
  jpeg_decode="crop (native/jpeg_crop: train JPEGs decode only the crop's region)"
else
  jpeg_decode="pil (native/jpeg_crop build FAILED: train JPEGs are decoded whole, slower)"
fi
rm -rf build
echo "$jpeg_decode" > "$VENV/.jpeg-decode"
say "ACTIVE JPEG TRAIN DECODE: $jpeg_decode"

# `import torchvision` as a script's first line: the schema fix of imagenet_shards/torchvision_cpu.py as a lazy import
# hook in site-packages (a .pth line registers a finder; torch is imported only when torchvision is).
say "installing the torchvision import hook (imagenet_shards/torchvision_hook.py)"
"$PY" imagenet_shards/torchvision_hook.py "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
