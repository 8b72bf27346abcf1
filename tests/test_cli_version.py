"""`auditor --version` prints the installed distribution's version and exits 0."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_version_is_the_projects():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    done = subprocess.run([sys.executable, "-m", "auditor", "--version"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"auditor {declared}"


def test_gradprobe_version_is_the_projects_too():
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    done = subprocess.run([sys.executable, "-m", "gradprobe", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"gradprobe {declared}"
