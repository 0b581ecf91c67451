"""Shared test helpers for command lines that must stop before doing any work."""

from __future__ import annotations

import pytest


def exit_code_and_stderr(main, argv: list[str], capsys) -> tuple[object, str]:
    """Run ``main(argv)``, which must raise SystemExit: (its exit code, what it wrote to stderr)."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    return stop.value.code, capsys.readouterr().err


def refusal(main, argv: list[str], capsys) -> str:
    """The stderr of a command that must stop with status 2 (argparse's refusal) and no traceback."""
    code, err = exit_code_and_stderr(main, argv, capsys)
    assert code == 2
    assert "Traceback" not in err
    return err
