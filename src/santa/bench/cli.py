"""``santa bench``: ``santa bench kernels …`` (decode kernels), ``santa bench e2e …`` (whole model),
``santa bench capture …`` (real attention inputs for ``kernels --real``)."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "kernels": ("santa.bench.kernels", "decode-step kernel benchmark (BENCH.md protocol)"),
    "e2e": ("santa.bench.e2e", "end-to-end batched long-context decode (Llama-3.1-8B shapes)"),
    "capture": ("santa.bench.capture", "real decode-step q/K/V from the bundled model (for kernels --real)"),
}


def usage() -> str:
    lines = ["usage: santa bench {kernels,e2e,capture} [options]", ""]
    lines += [f"  {name:<8} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"santa bench: unknown benchmark {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return importlib.import_module(COMMANDS[name][0]).main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
