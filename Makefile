# Two entry points: `make audit` (the main job) and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV := .venv
# The local CPU build; override on a GPU machine, e.g. `make test TORCH=torch`.
TORCH ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q $(TORCH)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

.PHONY: setup audit test
setup: $(VENV)/.installed

# The main job: audit GradProbe on the TinyStories-33M architecture (CPU), project it to
# Mistral-7B (scaled and traced) and write the report. Its run record is kept beside the report
# (replaced each time), so `auditor report reports/gradprobe-tinystories-33m-runs/audit` makes
# the same report again.
AUDIT_RUN := reports/gradprobe-tinystories-33m-runs/audit
audit: setup
	rm -rf $(AUDIT_RUN)
	$(VENV)/bin/auditor gradprobe --arch tinystories-33m --target mistral-7b \
		--run-dir $(AUDIT_RUN) -o reports/gradprobe-tinystories-33m.md
	$(VENV)/bin/python -m auditor.portable_paths $(AUDIT_RUN)  # committed: no folder of this machine

# The suite runs in two worker processes (pytest-xdist), a test file to a worker: about 11 minutes
# on 2 cores instead of 21. `pytest tests/FILE.py` runs one file in this process.
test: setup
	$(VENV)/bin/ruff check --quiet auditor gradprobe architectures tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile
