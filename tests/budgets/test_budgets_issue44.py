"""The new-user trial of issue 44 on ``santa ablate`` / ``santa tune``: ``--length`` checked against the
model's context before any work, and Spearman's ρ said in words where it is undefined."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from helpers import TINY_CELLS_FLAGS, refusal
from santa.budgets import agreement
from santa.budgets.cli_args import check_model_arguments
from santa.budgets.sweep import Comparison

SMOLLM2_CONTEXT = 8192
TUNE_SYNTHETIC = ["--model", "tiny-random", "--reward", "synthetic", "--no-plots", "--no-progress", "--device", "cpu",
                  "--workers", "1", "--num-cpus", "1"]


def error_line(main, argv, capsys) -> str:
    return refusal(main, argv, capsys).strip().splitlines()[-1]


# --- 1: --length against the model's context ----------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "flags", "message"),
    [
        ("ablate layers", ["--length", "100000"], f"argument --length: smollm2-135m reads at most {SMOLLM2_CONTEXT} tokens, got 100000"),
        ("ablate layers", ["--metric", "niah_single", "--length", "8150"],
         f"argument --length: smollm2-135m reads at most {SMOLLM2_CONTEXT} tokens (prompt and answer), got 8150 + --max-new-tokens 64"),
        ("ablate layers", ["--metric", "gsm8k", "--max-new-tokens", "9000"],
         f"argument --max-new-tokens: smollm2-135m reads at most {SMOLLM2_CONTEXT} tokens (prompt and answer), got 9000"),
        ("ablate layers", ["--model", "tiny-random", "--length", "9000"], "argument --length: tiny-random reads at most 8192 tokens, got 9000"),
        ("tune budgets", ["--length", "100000"], f"argument --length: smollm2-135m reads at most {SMOLLM2_CONTEXT} tokens, got 100000"),
        ("tune evaluate", ["--length", "100000"], f"argument --length: smollm2-135m reads at most {SMOLLM2_CONTEXT} tokens, got 100000"),
    ],
)
def test_a_length_past_the_context_is_refused_before_any_work(no_work, monkeypatch, capsys, command, flags, message):
    import santa.budgets.distributed
    import santa.budgets.rewards
    from santa.budgets import ablate_cli, tune_cli

    # the cache is empty under no_work: reading the layers or the tokenizer would build it (dequantise the GGUF)
    monkeypatch.setattr(santa.budgets.rewards, "model_layers", lambda *a, **k: pytest.fail("the layers were read"))
    monkeypatch.setattr(santa.budgets.distributed, "import_ray", lambda: pytest.fail("Ray was imported"))
    (no_work / "s.json").write_text('{"0": 4, "1": 4}')
    name, sub = command.split()
    main = ablate_cli.main if name == "ablate" else tune_cli.main
    out = ["--out", str(no_work / ("run" if sub == "budgets" else "out.jsonl"))]
    schedule = ["--schedule", str(no_work / "s.json")] if sub == "evaluate" else []
    assert error_line(main, [sub, *out, *schedule, *flags], capsys) == f"santa {command}: error: {message}"


def namespace(**fields) -> argparse.Namespace:
    defaults = {"model": "tiny-random", "length": 9000, "kl_tokens": 32, "max_new_tokens": 64}
    return argparse.Namespace(**{**defaults, **fields})


class Refused(Exception):
    pass


class Parser:
    def error(self, message):
        raise Refused(message)


def test_the_synthetic_reward_runs_no_model_so_its_length_is_not_checked():
    check_model_arguments(Parser(), namespace(), metric="kl", context=False)  # no refusal
    with pytest.raises(Refused, match="argument --length: tiny-random reads at most 8192 tokens, got 9000"):
        check_model_arguments(Parser(), namespace(), metric="kl")


def test_kl_tokens_are_part_of_the_length_and_a_task_answer_is_not():
    check_model_arguments(Parser(), namespace(length=8192), metric="kl")  # KL: the teacher-forced tokens lie inside it
    with pytest.raises(Refused, match=r"got 8192 \+ --max-new-tokens 1"):
        check_model_arguments(Parser(), namespace(length=8192, max_new_tokens=1), metric="niah_single")
    check_model_arguments(Parser(), namespace(length=8191, max_new_tokens=1), metric="niah_single")


# --- 10: Spearman's ρ in words where undefined -------------------------------------------------------


def one_hot(layer: int, delta: float) -> Comparison:
    return Comparison(name=f"layer {layer}", layer=layer, total=8, prompts=4, mean=0.1, low=0.0, high=0.2,
                      delta=delta, delta_low=delta - 0.01, delta_high=delta + 0.01)


@pytest.mark.parametrize(
    ("schedule", "comparisons", "says"),
    [
        ([4, 4, 4], [one_hot(0, 0.1), one_hot(1, 0.3), one_hot(2, 0.2)], "undefined (the schedule gives every ablated layer the same samples)"),
        ([2, 4, 6], [one_hot(0, 0.1), one_hot(1, 0.1), one_hot(2, 0.1)], "undefined (every ablated layer has the same sensitivity)"),
        ([2, 4, 6], [one_hot(1, 0.1)], "undefined (1 ablated layer with a result, at least 2 needed)"),
        ([2, 4, 6], [], "undefined (0 ablated layers with a result, at least 2 needed)"),
    ],
)
def test_an_undefined_spearman_is_said_in_words(schedule, comparisons, says):
    text = agreement.agreement_text(schedule, comparisons, metric="kl")
    assert f"Spearman ρ(samples, one-hot sensitivity) = {says};" in text and "nan" not in text


def test_a_defined_spearman_is_its_value():
    text = agreement.agreement_text([2, 4, 6], [one_hot(0, 0.1), one_hot(1, 0.2), one_hot(2, 0.3)], metric="kl")
    assert text.startswith("Spearman ρ(samples, one-hot sensitivity) = +1.00; most sensitive layers [2, 1, 0]")
    assert agreement.undefined_because([0.1, 0.2], [1, 2]) is None


def test_tune_evaluate_prints_an_undefined_rho_in_words(monkeypatch, capsys):
    """score_schedules' last lines, on a uniform schedule beside its ablation (the cells are faked)."""
    from santa.budgets import sweep, tune_cli

    monkeypatch.setattr(tune_cli, "read_ablation", lambda *a, **k: [{"metric": "kl"}])
    monkeypatch.setattr(sweep, "run_cells", lambda *a, **k: None)
    monkeypatch.setattr(sweep, "existing_records", lambda *a, **k: [])
    monkeypatch.setattr(sweep, "table", lambda *a, **k: "table")
    comparisons = [one_hot(0, 0.1), one_hot(1, 0.3)]
    monkeypatch.setattr(sweep, "compare", lambda records, **k: comparisons if records else [])
    args = argparse.Namespace(ablation="ablation.jsonl", model="tiny-random", threads=None, seeds=[0], prompts=[0], out="o.jsonl",
                              metric="kl", length=160, sampler="systematic", kl_tokens=8, no_progress=True)
    assert tune_cli.score_schedules(args, {"schedule s": (4, 4)}, n_layers=2, total=8) == 0
    out = capsys.readouterr().out
    assert "schedule s: Spearman ρ(samples, one-hot sensitivity) = undefined (the schedule gives every ablated layer the same samples)" in out
    assert "nan" not in out


# --- 6 (as in santa eval run): an --out that cannot be made is named, before any work ------------------


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("command", ["ablate layers", "tune evaluate", "tune budgets"])
def test_an_out_that_cannot_be_made_names_out_before_any_work(no_work, monkeypatch, capsys, command):
    """/proc passes os.access (W_OK for root): only making the folder tells, before a model loads or Ray starts."""
    import santa.budgets.distributed
    from santa.budgets import ablate_cli, tune_cli
    from santa.schedule_file import write_schedule

    monkeypatch.setattr(santa.budgets.distributed, "tune", lambda *a, **k: pytest.fail("Ray started"))
    name, sub = command.split()
    main = ablate_cli.main if name == "ablate" else tune_cli.main
    if sub == "budgets":
        argv = ["budgets", "--out", "/proc/nope/run", *TUNE_SYNTHETIC]
    else:
        schedule = ["--schedule", str(write_schedule(no_work / "s.json", [4, 4]))] if sub == "evaluate" else []
        argv = [sub, "--out", "/proc/nope/x.jsonl", *schedule, *TINY_CELLS_FLAGS]
    assert error_line(main, argv, capsys).startswith(f"santa {command}: error: argument --out: cannot create the folder /proc/nope")
