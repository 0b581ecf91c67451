"""One writer per output: an exclusive ``flock`` held on a command's output file while it runs.

Every resumable command (``santa eval run``, ``santa ablate layers``, ``santa tune evaluate``,
``santa tune budgets``) appends to one file and skips what is already there on a re-run; two
runs appending to the same file at once would write every record twice (or interleave a tuning
history). :func:`writer_lock` lets one of them in and refuses the other at once.

The lock lives on the open file description, so the kernel drops it when the holder ends in any
way — exit, exception, ``kill -9`` — and no stale lock can block a resume. No lock file is made.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OutputUnusable(ValueError):
    """The output file cannot be opened or locked; the message names it."""


class OutputLocked(OutputUnusable):
    """Another run holds the output file's lock; the message names the file."""


@contextmanager
def writer_lock(
    path: str | Path,
    *,
    holder: str = "run",
    locked: type[Exception] = OutputLocked,
    unusable: type[Exception] = OutputUnusable,
) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created if missing) for the ``with`` block.

    holder: what a second holder is called in the refusal (``"`santa eval run`"``).
    A second holder is refused at once with ``locked(message)``; a file that cannot be opened or
    locked raises ``unusable(message)``; both messages start with the path.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as error:
        raise unusable(f"{path}: cannot open it for writing ({error.strerror or error})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise locked(f"{path}: another {holder} is writing this file; wait for it to end or use another --out") from None
    except OSError as error:
        os.close(fd)
        raise unusable(f"{path}: cannot lock it ({error.strerror or error})") from None
    try:
        yield
    finally:
        os.close(fd)  # releases the lock
