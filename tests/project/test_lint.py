"""The code base stays ruff-clean (STYLE.md)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO


@pytest.mark.skipif(shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(), reason="ruff not installed")
def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    result = subprocess.run([ruff, "check", "src", "tests", "benchmarks"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
