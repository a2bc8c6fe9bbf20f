# One entry point for setup and runs. Both README commands go through $(STAMP),
# which rebuilds the environment only when requirements.txt or the setup script changed.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo-output

.PHONY: demo test venv clean

$(STAMP): requirements.txt scripts/setup_venv.sh
	bash scripts/setup_venv.sh
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m datasets.demo --out $(DEMO)

test: $(STAMP)
	$(PY) -m pytest -q tests

clean:
	rm -rf $(DEMO) .pytest_cache
