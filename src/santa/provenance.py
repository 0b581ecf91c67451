"""Which code produced a record: the commit that benchmarks and sweeps write beside their numbers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _git(*args: str) -> str | None:
    """``git args…`` in this checkout → its stdout, or None without git or a repository."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=Path(__file__).parent).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def code_commit() -> str | None:
    """``$SANTA_COMMIT`` when set (a lent machine's copy of the tree may carry a stale ``.git``, so
    the caller who shipped it says which commit it is), else the short ``git`` HEAD of this
    checkout, else None."""
    given = os.environ.get("SANTA_COMMIT")
    if given:
        return given
    head = (_git("rev-parse", "--short", "HEAD") or "").strip()
    return head or None


def source_dirty() -> bool | None:
    """Whether ``src/`` differs from the commit :func:`code_commit` names; None where git cannot say
    (no git, or ``$SANTA_COMMIT`` set: this checkout's ``.git`` is not that commit's)."""
    if os.environ.get("SANTA_COMMIT"):
        return None
    status = _git("status", "--porcelain", "--", str(Path(__file__).resolve().parents[1]))
    return None if status is None else bool(status.strip())
