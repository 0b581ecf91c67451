"""``santa ablate layers`` and ``santa tune evaluate``: resumable schedule cells on the tiny random
Llama (2 layers, byte tokenizer), paired CIs and the Fig. 8 plot; flags checked before any work."""

import json

import pytest

from helpers import TINY_CELLS_FLAGS, CountingScorer, refusal
from santa.budgets import ablate_cli, tune_cli
from santa.budgets.ablate import layer_cells
from santa.budgets.sweep import Cell, run_cells
from santa.schedule_file import write_schedule
from santa.sweep_files import read_records


def test_layer_cells_are_the_baseline_and_one_per_layer():
    cells = layer_cells(n_layers=3, base=4, seeds=(0, 1))
    assert [(c.name, c.schedule, c.seed) for c in cells[:4]] == [
        ("uniform", (4, 4, 4), 0),
        ("layer 0", (1, 4, 4), 0),
        ("layer 1", (4, 1, 4), 0),
        ("layer 2", (4, 4, 1), 0),
    ]
    assert len(cells) == 8 and {c.seed for c in cells[4:]} == {1}


def test_a_killed_sweep_resumes_with_the_cells_it_had_not_finished(tmp_path):
    out = tmp_path / "cells.jsonl"
    cells = [Cell(f"c{i}", (i + 1, 2)) for i in range(4)]
    first = CountingScorer(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        run_cells(cells, out=out, prompts=[0, 1], setting={"m": 1}, make_scorer=lambda: first, progress=False)
    second = CountingScorer()
    assert run_cells(cells, out=out, prompts=[0, 1], setting={"m": 1}, make_scorer=lambda: second, progress=False) == 2
    assert second.calls == 2
    assert sorted(r["name"] for r in read_records(out)) == ["c0", "c1", "c2", "c3"]


def test_a_finished_sweep_loads_no_model(tmp_path):
    out = tmp_path / "cells.jsonl"
    cells = [Cell("c", (1, 2))]
    run_cells(cells, out=out, prompts=[0], setting={}, make_scorer=CountingScorer, progress=False)

    def refuse():
        raise AssertionError("the scorer was built although nothing was pending")

    assert run_cells(cells, out=out, prompts=[0], setting={}, make_scorer=refuse, progress=False) == 0


def test_ablation_on_the_tiny_model_writes_cells_table_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from santa.budgets.ablate_cli import main

    out, plot = tmp_path / "ablation.jsonl", tmp_path / "ablation.png"
    assert main(["layers", "--out", str(out), "--base", "4", "--plot", str(plot), *TINY_CELLS_FLAGS]) == 0
    records = read_records(out)
    assert sorted(r["name"] for r in records) == ["layer 0", "layer 1", "uniform"]
    assert all(len(r["scores"]) == 3 and r["score"] >= 0 for r in records)  # KL per prompt
    assert plot.stat().st_size > 0
    table = capsys.readouterr().out
    assert "| layer 0 | 5 | 3 |" in table and "Δ vs uniform" in table


def test_evaluate_pairs_a_schedule_with_the_uniform_of_its_total(tmp_path, capsys):
    from santa.budgets.tune_cli import main

    schedule = write_schedule(tmp_path / "learned.json", [6, 2])
    out = tmp_path / "eval.jsonl"
    assert main(["evaluate", "--schedule", str(schedule), "--out", str(out), "--seeds", "0,1", *TINY_CELLS_FLAGS]) == 0
    records = read_records(out)
    assert {(r["name"], tuple(r["schedule"])) for r in records} == {("uniform", (4, 4)), ("schedule learned", (6, 2))}
    assert len(records) == 4  # two cells × two seeds
    assert "| schedule learned | 8 | 3 |" in capsys.readouterr().out


def test_task_scorer_grades_tiny_model_answers(tmp_path):
    from santa.budgets.rewards import load
    from santa.budgets.scorers import TaskScorer

    model, tokenizer = load("tiny-random")
    scorer = TaskScorer(model, tokenizer, task="niah_multivalue", length=600, max_new_tokens=3)
    scores = scorer.scores({0: 2, 1: 3}, prompts=[0, 1], seed=0)
    assert sorted(scores) == [0, 1] and all(0.0 <= s <= 1.0 for s in scores.values())


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--base", "0"], "--base"),
        (["--layers", "2"], "--layers"),
        (["--metric", "bleu"], "argument --metric: invalid choice: 'bleu' (choose from kl, "),
        (["--prompts", "a-b"], "--prompts"),
        (["--kl-tokens", "200"], "--kl-tokens"),
        (["--device", "tpu"], "--device"),
        (["--sampler", "dense"], "--sampler"),
        (["--metric", "niah_multivalue", "--length", "200"], "at --length 200"),
    ],
)
def test_ablate_cli_refuses_bad_flags(tmp_path, capsys, flags, complaint):
    err = refusal(ablate_cli.main, ["layers", "--out", str(tmp_path / "a.jsonl"), *TINY_CELLS_FLAGS, *flags], capsys)
    assert complaint in err
    assert not (tmp_path / "a.jsonl").exists()


def test_evaluate_refuses_a_bad_schedule_file_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"layer_budgets": {"0": 0}}))
    assert str(bad) in refusal(tune_cli.main, ["evaluate", "--schedule", str(bad), "--out", str(tmp_path / "e.jsonl"), *TINY_CELLS_FLAGS], capsys)
