"""The new-user trial of issue 44, on the ``santa`` entry: length flags checked against the model's
context before anything loads, Ctrl-C as one line and status 130, one seed range on every seed
flag, ``santa --version``, the subcommand's usage above ablate's and tune's cross-flag errors, the
exit statuses in their help, and ``santa generate`` timing both methods after the same warm-up."""

from __future__ import annotations

import argparse
import importlib
import time
from importlib import metadata

import pytest

import santa
import santa.cli
import santa.generate
from helpers import CharTokenizer, refusal, tiny_hf_model
from santa.cli import main

SMOLLM2_CONTEXT = 8192  # max_position_embeddings of SmolLM2-135M (the bundled GGUF's context_length)


def one_refusal(argv: list[str], capsys, prog: str) -> str:
    """The error line of ``santa ARGV``, which must stop with status 2 (usage above, no traceback)."""
    err = refusal(main, argv, capsys)
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"{prog}: error: "), err
    return line


# --- 1 and 5: --length (and --max-new-tokens) against the model's context, before loading ------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--length", "100000"], f"argument --length: smollm2-135m reads at most {SMOLLM2_CONTEXT} tokens, got 100000"),
        (["--length", "8190", "--max-new-tokens", "32"],
         f"argument --length: smollm2-135m reads at most {SMOLLM2_CONTEXT} tokens (prompt and answer), got 8190 + --max-new-tokens 32"),
    ],
)
def test_generate_refuses_a_needle_past_the_context_before_loading(no_work, capsys, flags, message):
    assert one_refusal(["generate", "--device", "cpu", *flags], capsys, "santa generate") == f"santa generate: error: {message}"


def test_generate_takes_a_needle_that_just_fits_the_context(no_work, generate_run_arguments):
    seen = generate_run_arguments
    assert main(["generate", "--device", "cpu", "--length", str(SMOLLM2_CONTEXT - 32), "--max-new-tokens", "32"]) == 1
    assert seen["n_tokens"] + seen["max_new_tokens"] == SMOLLM2_CONTEXT


# --- 2: Ctrl-C ---------------------------------------------------------------------------------------


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("argv", "module", "prog"),
    [
        (["generate", "--device", "cpu"], "santa.generate:run", "santa generate"),
        (["tune", "budgets", "--out", "OUT"], "santa.budgets.tune_cli:main", "santa tune"),
        (["ablate", "layers", "--out", "OUT"], "santa.budgets.ablate_cli:main", "santa ablate"),
        (["eval", "report", "x.jsonl"], "santa.eval.cli:main", "santa eval"),
    ],
)
def test_ctrl_c_is_one_line_and_status_130(monkeypatch, capsys, tmp_path, argv, module, prog):
    name, attribute = module.split(":")
    monkeypatch.setattr(importlib.import_module(name), attribute, interrupt)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    try:
        status = main(argv)
    except KeyboardInterrupt:  # it would print its traceback
        pytest.fail("KeyboardInterrupt escaped santa's entry")
    assert status == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"{prog}: interrupted"
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


# --- 3: one seed range on every seed flag --------------------------------------------------------------


def every_parser():
    """(command, parser) of every santa parser and subparser with flags of its own (bench aside: its own tests)."""
    from santa.budgets import ablate_cli, tune_cli
    from santa.eval import cli as eval_cli

    todo = [("santa", santa.cli.build_parser()), ("santa eval", eval_cli.build_parser()),
            ("santa ablate", ablate_cli.build_parser()), ("santa tune", tune_cli.build_parser())]
    while todo:
        name, parser = todo.pop()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items()]


def seed_flags() -> dict[str, object]:
    flags = {}
    for name, parser in every_parser():
        for flag in ("--seed", "--seeds"):
            if flag in parser._option_string_actions:
                flags[f"{name} {flag}"] = parser._option_string_actions[flag].type
    return flags


def test_the_seed_flags_are_found():
    assert {"santa generate --seed", "santa tune budgets --seed", "santa tune evaluate --seeds",
            "santa ablate layers --seeds", "santa eval run --seeds"} <= set(seed_flags())


@pytest.mark.parametrize("flag", sorted(seed_flags()))
def test_every_seed_flag_takes_2_63_minus_1_and_refuses_2_63(flag):
    parse = seed_flags()[flag]
    assert parse(str(2**63 - 1)) in (2**63 - 1, [2**63 - 1])
    with pytest.raises(argparse.ArgumentTypeError, match=r"2\*\*63"):
        parse(str(2**63))


def test_tune_budgets_refuses_seed_2_63_before_ray(no_work, monkeypatch, capsys):
    import santa.budgets.distributed

    monkeypatch.setattr(santa.budgets.distributed, "import_ray", lambda: pytest.fail("Ray was imported"))
    line = one_refusal(["tune", "budgets", "--out", str(no_work / "run"), "--seed", str(2**63)], capsys, "santa tune budgets")
    assert line == f"santa tune budgets: error: argument --seed: expected an integer in [0, 2**63), got {2**63}"
    assert not (no_work / "run").exists()


# --- 4: santa --version ---------------------------------------------------------------------------


def test_version_prints_the_installed_distributions_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"santa {metadata.version('santa-attention')}\n"


def test_version_falls_back_to_the_packages_version(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert santa.cli.version() == santa.__version__


# --- 7 and 11: ablate's and tune's subcommands: their usage above their errors, exit statuses in help ---


@pytest.mark.parametrize(
    ("argv", "prog", "message"),
    [
        (["ablate", "layers", "--model", "tiny-random", "--kl-tokens", "300", "--length", "256"], "santa ablate layers", "--kl-tokens (300)"),
        (["tune", "budgets", "--questions", "20", "--train-prompts", "0-9"], "santa tune budgets", "--questions (20)"),
        (["tune", "evaluate", "--schedule", "SCHEDULE", "--model", "tiny-random", "--kl-tokens", "300", "--length", "256"],
         "santa tune evaluate", "--kl-tokens (300)"),
    ],
)
def test_cross_flag_errors_print_the_subcommands_usage(no_work, capsys, argv, prog, message):
    (no_work / "s.json").write_text('{"0": 4, "1": 4}')
    argv = [str(no_work / "s.json") if a == "SCHEDULE" else a for a in argv]
    out = "out.jsonl" if argv[1] != "budgets" else "run"
    err = refusal(main, [*argv, "--out", str(no_work / out)], capsys)
    assert f"usage: {prog} " in err
    assert err.strip().splitlines()[-1].startswith(f"{prog}: error: {message}")


@pytest.mark.parametrize("argv", [["ablate", "-h"], ["tune", "-h"], ["ablate", "layers", "-h"], ["tune", "budgets", "-h"],
                                  ["tune", "evaluate", "-h"], ["eval", "-h"], ["-h"], ["generate", "-h"]])
def test_every_help_states_the_exit_statuses(capsys, argv):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "exit status: 0 done" in text and "2 a bad command line" in text and "130 interrupted" in text


# --- 12: santa generate times both methods after the same warm-up --------------------------------------




ONE_OFF_S = 0.5  # what the first forward pass of the process pays alone (a lazy initialisation)


def test_the_first_timed_prefill_does_not_pay_the_one_off_costs(monkeypatch):
    """The first forward pass is slow once (as SmolLM2's first 2k-token prefill on the CPU: 5.6 s
    against 2.0 s for the next): both methods' prefills must be timed after it, like for like."""
    model = tiny_hf_model("llama")
    monkeypatch.setattr(santa.generate, "load_model", lambda *args, **kwargs: (model, CharTokenizer()))
    forward, calls = santa.generate.padded_forward, []

    def first_call_slow(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(ONE_OFF_S)
        return forward(*args, **kwargs)

    monkeypatch.setattr(santa.generate, "padded_forward", first_call_slow)
    _, answers = santa.generate.run(prompt_text="the needle is 7 " * 3, sampler="systematic", budget=4, max_new_tokens=3, device="cpu")
    dense, sampled = answers
    assert dense.prefill_s < ONE_OFF_S and sampled.prefill_s < ONE_OFF_S, (dense.prefill_s, sampled.prefill_s)
