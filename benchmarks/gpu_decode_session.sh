#!/usr/bin/env bash
# One run on a GPU host that reaches no package registry: every row of docs/train-on-gpu.md's
# decode-location table, the device pixel bound and the memory check, each step's log under $OUT.
#
#   bash benchmarks/gpu_decode_session.sh [STEPS...]      # default: every step, in order
#
# Needs, in the checkout (carried to the host; `bash benchmarks/gpu_decode_session.sh prepare` on a
# machine with a registry makes both): .device-photos/ (the photos of ../shared/photos/large) and
# .device-wheels/ (the small pure or manylinux wheels the loader needs beyond torch, torchvision,
# numpy and Pillow). A failed step is logged and the next one runs. EARLIER=COMMIT (at prepare) also
# carries that commit's imagenet_shards/, examples/ and benchmarks/, so that `parts` and `resnet50_earlier`
# measure it beside this checkout in the same run.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu-decode-out}
WORK=${WORK:-/tmp/gpu-decode-work}
PY=${PY:-python3}
CROPS=${CROPS:-460}          # 460 crops of 106 photos: ~39,000 train images, 152 steps of 256 an epoch
STEPS=${STEPS_PER_RUN:-200}  # steps per training run; the first 20 are not counted
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$WORK/deps:$PWD/native/jpeg_crop:$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME COMMAND...: its output in $OUT/NAME.log, its time and exit code in $OUT/steps.log
  local name=$1; shift
  local started=$SECONDS
  echo "=== $name $(date +%T)" | tee -a "$OUT/steps.log"
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "    $name: rc=$rc in $((SECONDS - started)) s" | tee -a "$OUT/steps.log"
  tail -n 15 "$OUT/$name.log"
  return 0
}

prepare() {  # on a machine with a registry, before the run: what the GPU host cannot download
  rm -rf .device-photos && cp -r ../shared/photos/large .device-photos
  mkdir -p .device-wheels
  for v in 310 311 312 313 314; do
    pip download -q --no-deps --only-binary=:all: --python-version "$v" --platform manylinux_2_28_x86_64 \
      -d .device-wheels crc32c==2.9.post0
  done
  pip download -q --no-deps -d .device-wheels braceexpand==0.1.7 tqdm==4.70.1 webdataset==1.0.2
  rm -f .device-wheels/earlier.tar.gz
  if [ -n "${EARLIER:-}" ]; then  # the library under its name at that commit (datasets/ before 0.2.0)
    git archive "$EARLIER" $(git ls-tree --name-only "$EARLIER" imagenet_shards datasets) examples benchmarks \
      | gzip > .device-wheels/earlier.tar.gz
  fi
}

earlier_tree() {  # the carried earlier commit, unpacked once
  [ -f .device-wheels/earlier.tar.gz ] || { echo "no earlier commit carried (EARLIER= at prepare)"; return 1; }
  [ -d "$WORK/earlier" ] || { mkdir -p "$WORK/earlier" && tar -xzf .device-wheels/earlier.tar.gz -C "$WORK/earlier"; }
}

environment() {
  nvidia-smi || true
  nproc; free -g | head -2
  "$PY" -c "import sys, torch, torchvision, PIL, numpy; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'torchvision', torchvision.__version__, 'PIL', PIL.__version__, 'numpy', numpy.__version__); print(torch.cuda.get_device_name(0))"
  for module in crc32c braceexpand tqdm webdataset; do
    "$PY" -c "import $module" 2>/dev/null || "$PY" -m pip install -q --no-deps --no-index --find-links .device-wheels \
      --target "$WORK/deps" "$module"
  done
  "$PY" -c "import crc32c, braceexpand; import imagenet_shards.loader; print('imagenet_shards.loader imports')"
}

native() {  # the region decoder against the host's libjpeg-turbo, into imagenet_shards/: setuptools, else cc directly
  local suffix; suffix=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
  "$PY" setup.py -q build_ext --inplace || cc -O2 -shared -fPIC $("$PY"-config --includes 2>/dev/null \
    || "$PY" -c "import sysconfig; print('-I' + sysconfig.get_paths()['include'])") native/jpeg_crop/_jpeg_crop.c \
    native/jpeg_crop/resample.c -ljpeg -o "imagenet_shards/_jpeg_crop$suffix"
  cp "imagenet_shards/_jpeg_crop$suffix" "native/jpeg_crop/_jpeg_crop$suffix"  # an earlier commit's top-level name
  "$PY" -c "from imagenet_shards.loader import jpeg_crop; print('decode path', jpeg_crop.decode_path())"
}

dataset() {
  "$PY" benchmarks/photo_crops_dataset.py --photos .device-photos --out "$WORK/source" --crops "$CROPS" --workers 16 &&
  "$PY" create_webdataset.py --source "$WORK/source" --target "$WORK/img" --format img --seed 0 --workers 16
}

device_decode_tests() {  # the CUDA side of the unit tests, where pytest is there
  "$PY" -c "import pytest" 2>/dev/null || { echo "no pytest here"; return 0; }
  "$PY" -m pytest -q -p no:cacheprovider tests/test_device_decode.py tests/test_pinned_ring.py
}

check() {
  "$PY" benchmarks/device_decode_check.py --data "$WORK/img" --batch-size 256 --workers 4 --batches 4 \
    --memory-steps "${MEMORY_STEPS:-1000}" --json "$OUT/device_decode_check.json"
}

parts() {  # the decode and the crop/resize of one batch timed apart, and the earlier commit's resize
  local earlier=()
  earlier_tree && earlier=(--resampler-from "$(ls "$WORK"/earlier/{imagenet_shards,datasets}/loader/device_resample.py 2>/dev/null | head -1)")
  "$PY" benchmarks/device_decode_check.py --data "$WORK/img" --parts-only --jpegs "$WORK/source/train" \
    --batch-size 256 --repeats 20 "${earlier[@]}" ${PROFILE:+--profile} --json "$OUT/parts.json"
}

wait_rows() {  # wait_rows NAME ARGS...: one train_data_wait.py run, its JSON and step logs kept
  local name=$1; shift
  "$PY" benchmarks/train_data_wait.py --data "$WORK/img" --batch-size 256 --steps "$STEPS" --warmup 20 --amp \
    --channels-last --keep-logs "$OUT/steps" --json "$OUT/$name.json" "$@"
}

resnet50_device() { wait_rows resnet50_device --arch resnet50 --own-rate --decode device --workers 4; }
resnet50_earlier() {  # the ResNet-50 device row with the earlier commit's loader, in the same run
  earlier_tree || return 1
  (cd "$WORK/earlier" && PYTHONPATH="$WORK/deps:$ROOT/native/jpeg_crop:$WORK/earlier" \
    "$PY" benchmarks/train_data_wait.py --data "$WORK/img" --batch-size 256 --steps "$STEPS" --warmup 20 --amp \
    --channels-last --keep-logs "$OUT/steps-earlier" --json "$OUT/resnet50_earlier.json" --arch resnet50 \
    --decode device --workers 4)
}
resnet50_host() { wait_rows resnet50_host --arch resnet50 --decode host --workers 15; }
resnet18() { wait_rows resnet18 --arch resnet18 --own-rate --decode device,host --workers 6; }

if [ "${1:-}" = prepare ]; then prepare; exit; fi
for name in "${@:-environment native dataset parts resnet50_device resnet50_earlier resnet18 check resnet50_host device_decode_tests}"; do
  for one in $name; do step "$one" "$one"; done
done
echo "done $(date +%T)" | tee -a "$OUT/steps.log"
