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


# the environment variables that change what a benchmark or sweep measures
_RECORDED_ENV = ("SANTA_", "TRITON_", "CUDA_VISIBLE_DEVICES", "CUBLAS_", "VLLM_", "PYTORCH_", "TORCH_")


def run_record(argv: list[str] | None = None) -> dict:
    """What a results file needs to be rerun: the exact command line, the environment variables that
    change a measurement (``SANTA_*``, ``TRITON_*``, ``VLLM_*``, ``PYTORCH_*``, ``CUDA_VISIBLE_DEVICES`` …),
    the commit (and whether ``src/`` differed from it), the date (UTC), the host's Python, torch and
    Triton versions and the device (the first CUDA device's name, else ``"cpu"``).

    argv: the command's arguments (default ``sys.argv``); the command is written shell-quoted, so it
    can be pasted back: ``python script.py …`` for a script, ``santa bench e2e …`` for a console
    script (its name, not its path).
    """
    import platform
    import shlex
    import sys
    import time

    argv = list(sys.argv if argv is None else argv)
    program = argv[0] if argv else "python"
    words = ["python", program] if program.endswith(".py") else [os.path.basename(program)]
    record: dict = {
        "command": shlex.join([*words, *argv[1:]]),
        "env": {name: value for name, value in sorted(os.environ.items()) if name.startswith(_RECORDED_ENV)},
        "commit": code_commit() or "unknown",
        "source_dirty": source_dirty(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "host": platform.node(),
    }
    try:
        import torch

        record["torch"] = torch.__version__
        record["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        record["device"] = "cpu"
    try:
        import triton

        record["triton"] = triton.__version__
    except ImportError:
        pass
    return record
