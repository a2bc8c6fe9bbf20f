# One entry point for setup and runs. Both README commands go through $(STAMP),
# which rebuilds the environment only when requirements.txt, the setup script or the native code changed.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo-output

.PHONY: demo test venv clean

$(STAMP): requirements.txt scripts/setup_venv.sh native/jpeg_crop/_jpeg_crop.c native/jpeg_crop/resample.c native/jpeg_crop/resample.h setup.py imagenet_shards/torchvision_hook.py
	bash scripts/setup_venv.sh
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m imagenet_shards.tools.demo --out $(DEMO)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 tests

clean:
	rm -rf $(DEMO) .pytest_cache
