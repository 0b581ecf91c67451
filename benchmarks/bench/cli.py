"""``santa bench``: ``santa bench kernels …`` (decode kernels), ``santa bench e2e …`` (whole model),
``santa bench capture …`` (real attention inputs for ``kernels --real``), ``santa bench real …``.

The benchmarks live in the source checkout, not in the library: ``santa bench`` (santa.cli) finds
this folder next to ``src/`` and runs :func:`main`; from the checkout's root
``python -m benchmarks.bench.cli kernels …`` (or ``python -m benchmarks.bench.kernels …``) does the same.
Each benchmark parses its own flags (``santa bench kernels -h``); this module only picks it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "kernels": ("benchmarks.bench.kernels", "decode-step kernel benchmark (benchmarks/PROTOCOL.md)"),
    "e2e": ("benchmarks.bench.e2e", "end-to-end batched long-context decode (Llama-3.1-8B shapes)"),
    "capture": ("benchmarks.bench.capture", "real decode-step q/K/V from the bundled model (for kernels --real)"),
    "real": ("benchmarks.bench.real", "decode ms/token of a bundled real model, dense vs santa, answers checked"),
}


def build_parser() -> argparse.ArgumentParser:
    """The usage, help and errors of ``santa bench`` (argparse-style; the benchmark's own flags are not parsed here)."""
    lines = [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    return argparse.ArgumentParser(
        prog="santa bench",
        usage="santa bench {kernels,e2e,capture,real} [options]",
        description="benchmarks:\n" + "\n".join(lines) + "\n\nsanta bench <benchmark> -h lists its options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.error(f"choose a benchmark: {', '.join(COMMANDS)}")
    if argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        parser.error(f"unknown benchmark {name!r}; choose from {', '.join(COMMANDS)}")
    return importlib.import_module(COMMANDS[name][0]).main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
