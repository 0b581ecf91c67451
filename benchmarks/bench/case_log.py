"""The resumable JSONL files of the kernel A/B scripts (paged_ab.py, contiguous_ab.py, short_slices.py,
covered_cost.py): a run record first (command, commit, date, device: :func:`santa.provenance.run_record`), then one
line per case appended as it is measured, so a call cut at its time limit keeps what it measured and a re-run skips
the cases already there; one writer at a time (:mod:`santa.writer_lock`; :func:`run_locked` also serves
phase_marks.py and capacity_ab.py, whose records differ)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable


def cases_done(path: str) -> set[str]:
    """The keys of the cases already in ``path``; a file with no records gets the run record first."""
    from santa.provenance import run_record
    from santa.sweep_files import append_record, read_records

    records = read_records(path)
    if not records:
        append_record(path, {"key": "run", **run_record()})
    return {record["key"] for record in records}


def add_case(path: str, entry: dict) -> None:
    """Append one measured case to ``path`` and print it (one JSON line)."""
    from santa.sweep_files import append_record

    append_record(path, entry)
    print(json.dumps(entry), flush=True)


def run_locked(path: str, script: str, measure: Callable[[], None]) -> None:
    """``measure()`` holding ``path``'s writer lock; another run holding it, or a file that cannot be written, ends the
    script with one line naming ``script`` (exit status 1)."""
    from santa.writer_lock import OutputUnusable, writer_lock

    try:
        with writer_lock(path, holder=script):
            measure()
    except OutputUnusable as error:
        sys.exit(f"{script}: {error}")
