# One entry point for setup and runs. Both README commands go through $(STAMP),
# which rebuilds the environment only when requirements.txt, the setup script or the native code changed.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo-output

.PHONY: demo test venv native clean

$(STAMP): requirements.txt scripts/setup_venv.sh native/jpeg_crop/_jpeg_crop.c native/jpeg_crop/resample.c native/jpeg_crop/resample.h setup.py imagenet_shards/torchvision_hook.py
	bash scripts/setup_venv.sh
	touch $(STAMP)

venv: $(STAMP)

# The region decoder is built into the checkout (imagenet_shards/_jpeg_crop*.so, by the setup script); a checkout
# that found .venv made already (a git worktree beside it) builds its own once.
native: $(STAMP)
	@$(PY) -c "import imagenet_shards._jpeg_crop" 2>/dev/null || { $(PY) setup.py -q build_ext --inplace; rm -rf build; }

demo: native
	$(PY) -m imagenet_shards.tools.demo --out $(DEMO)

test: native
	$(PY) -m pytest -q -n 2 tests

clean:
	rm -rf $(DEMO) .pytest_cache
