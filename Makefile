# Two entry points: `make audit` (the main job, into out/) and `make test`. Both set up .venv first.
# `make reports` makes the committed main report again.
PYTHON ?= python3
VENV := .venv
# The local CPU build; override on a GPU machine, e.g. `make test TORCH=torch`.
TORCH ?= torch==2.13.0

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q $(TORCH)
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

.PHONY: setup audit reports test test-all
setup: $(VENV)/.installed

# The job both targets run: audit GradProbe on the TinyStories-33M architecture (CPU), project it
# to Mistral-7B (scaled and traced), write the report (its PNGs beside it) and keep the run record,
# so that `auditor report RUN_DIR` makes the same report again.
GRADPROBE_AUDIT := $(VENV)/bin/auditor gradprobe --arch tinystories-33m --target mistral-7b

# The main job, into out/ (ignored by git): a fresh clone stays clean. Replaced each time.
OUT := out
audit: setup
	rm -rf $(OUT)/gradprobe-tinystories-33m-run && mkdir -p $(OUT)
	$(GRADPROBE_AUDIT) --run-dir $(OUT)/gradprobe-tinystories-33m-run -o $(OUT)/gradprobe-tinystories-33m.md
	@echo "make audit: report, PNGs and run record in $(OUT)/ (ignored by git); make reports remakes the committed one"

# The committed main report and its run record (tests/test_reports_regenerate.py makes the
# report again from that record alone). Rewrites tracked files: commit what it changes.
AUDIT_RUN := reports/gradprobe-tinystories-33m-runs/audit
reports: setup
	rm -rf $(AUDIT_RUN)
	$(GRADPROBE_AUDIT) --run-dir $(AUDIT_RUN) -o reports/gradprobe-tinystories-33m.md
	$(VENV)/bin/python -m auditor.record.portable_paths $(AUDIT_RUN)  # committed: no folder of this machine

# The suite runs in two worker processes (pytest-xdist), a test file to a worker: about 16 minutes
# on 2 cores. It leaves out the three `heavy` tests (real runs at a larger scale, a minute or more
# each) to stay inside CI's 20 minutes; `make test-all` runs them too. `pytest tests/FILE.py`
# runs one file in this process. The project's own modules are compiled first: with PYTHONDONTWRITEBYTECODE set, each of the suite's hundreds of fresh
# processes would compile them again (0.33 s against 0.15 s an import of the auditor).
test: setup
	$(VENV)/bin/ruff check --quiet auditor gradprobe architectures tests benchmarks examples
	$(VENV)/bin/mypy
	$(VENV)/bin/python -m compileall -q auditor gradprobe architectures examples > /dev/null
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile -m "not heavy"

test-all: setup
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadfile
