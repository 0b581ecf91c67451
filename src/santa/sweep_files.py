"""Sweep files: the JSONL files every resumable command appends records to, one line each.

``santa eval run`` (its job records), ``santa ablate layers`` and ``santa tune evaluate`` (their
schedule cells), ``santa tune budgets`` (its update history) and the benchmarks that resume
(``benchmarks/kernels/cuda_stream_check.py``, ``benchmarks/vllm/capacity_ab.py``) write one record
per finished piece of work with :func:`append_record` (one ``write`` of one line on an
``O_APPEND`` descriptor, then ``fsync``) and skip on a re-run every record whose ``"key"`` is
already in the file. The reports read them, plain or gzip, with :func:`load_sweep`.

One writer per file: a command holds the file's lock (:func:`sweep_lock`, the
:func:`santa.writer_lock.writer_lock` of every resumable command) while it appends, so a second
one on the same file stops at once (:class:`SweepLocked`) instead of writing every record twice;
:func:`appending` adds the refusal of gzip data, which cannot be appended to.

Below :mod:`santa.eval` and :mod:`santa.budgets`, which both write these files: it imports no torch.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from santa.writer_lock import writer_lock

GZIP_MAGIC = b"\x1f\x8b"


class SweepFileError(ValueError):
    """A sweep file that cannot be read or written; the message names the file (and the line)."""


class SweepLocked(SweepFileError):
    """Another sweep is writing the file (it holds the file's lock)."""


@dataclass
class SweepFile:
    """The records of one sweep file with their line numbers, and the lines a killed writer cut short."""

    path: Path
    records: list[tuple[int, dict]] = field(default_factory=list)  # (line number, record)
    torn: list[int] = field(default_factory=list)  # line numbers of records cut mid-write (skipped)


def _file_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when it is gzip (found by its magic number, whatever its name)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SweepFileError(f"{path}: no such file") from None
    except OSError as error:
        raise SweepFileError(f"{path}: cannot read it ({error.strerror or error})") from None
    if not data.startswith(GZIP_MAGIC):
        if path.suffix == ".gz" and data:
            raise SweepFileError(f"{path}: named .gz but not a gzip file")
        return data
    try:
        return gzip.decompress(data)
    except EOFError:
        raise SweepFileError(f"{path}: the gzip data is cut short (a truncated copy?)") from None
    except (gzip.BadGzipFile, zlib.error) as error:
        raise SweepFileError(f"{path}: corrupt gzip data ({error})") from None


def _is_gzip(path: str | Path) -> bool:
    """Whether the file holds gzip data (by its magic number, whatever its name)."""
    with open(path, "rb") as f:
        return f.read(len(GZIP_MAGIC)) == GZIP_MAGIC


def _text(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise SweepFileError(f"{path}, line {line}: not UTF-8 text (byte {error.start}); not a sweep JSONL file") from None


def load_sweep(path: str | Path) -> SweepFile:
    """Every record of a sweep JSONL file, plain or gzip, with its line number.

    A line that starts like a record (``{"``) but is not valid JSON was cut mid-write by a killed
    writer: it is skipped and its line number kept in ``torn`` (its job has no record, so a re-run
    runs it again). Blank lines are skipped. Anything else — a missing file, binary data, a cut-short
    gzip, a line that is not JSON or a JSON value without a ``"key"`` — raises
    :class:`SweepFileError` naming the file and line.
    """
    path = Path(path)
    sweep = SweepFile(path)
    for number, line in enumerate(_text(path, _file_bytes(path)).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if line.lstrip().startswith('{"'):
                sweep.torn.append(number)
                continue
            raise SweepFileError(f"{path}, line {number}: not a JSON record: {line[:60]!r}") from None
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise SweepFileError(f"{path}, line {number}: not a sweep record (a JSON object with a \"key\"): {line[:60]!r}")
        sweep.records.append((number, record))
    return sweep


def read_records(path: str | Path) -> list[dict]:
    """Every complete record of a sweep file (see :func:`load_sweep`: torn lines are skipped)."""
    return [record for _, record in load_sweep(path).records]


def sweep_lock(path: str | Path, *, holder: str = "`santa eval run`") -> AbstractContextManager[None]:
    """Hold an exclusive ``flock`` on the sweep file ``path`` (created if missing) for one writer.

    A second holder is refused at once with :class:`SweepLocked` (``holder``: what the refusal calls
    it). The lock lives on the open file description, so the kernel drops it when this process ends
    in any way — exit, exception, ``kill -9`` — and no stale lock can block a resume. No lock file is
    made (:func:`santa.writer_lock.writer_lock`, shared with the other resumable commands).
    """
    return writer_lock(path, holder=holder, locked=SweepLocked, unusable=SweepFileError)


@contextmanager
def appending(path: str | Path, *, holder: str = "`santa eval run`") -> Iterator[None]:
    """Hold the file's :func:`sweep_lock` for the ``with`` block, after refusing gzip data in it
    (:class:`SweepFileError`: records are appended as plain lines)."""
    with sweep_lock(path, holder=holder):
        if _is_gzip(path):
            raise SweepFileError(f"{path}: a gzip file cannot be appended to; gunzip it and run on the .jsonl")
        yield


def append_record(path: str | Path, record: dict) -> None:
    """Append one JSON line atomically: one write on an O_APPEND descriptor, then fsync."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        # A torn line left by a killed writer would swallow this record: start on a fresh line.
        if os.fstat(fd).st_size > 0:
            with open(path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    data = b"\n" + data
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
