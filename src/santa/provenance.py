"""Which code produced a record: the commit that benchmarks and sweeps write beside their numbers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def code_commit() -> str | None:
    """``$SANTA_COMMIT`` when set (a lent machine's copy of the tree may carry a stale ``.git``, so
    the caller who shipped it says which commit it is), else the short ``git`` HEAD of this
    checkout, else None."""
    given = os.environ.get("SANTA_COMMIT")
    if given:
        return given
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None
