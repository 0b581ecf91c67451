"""santa eval / santa bench reliability: hand-edited sweep records named by file and line, every flag
checked before any work (nothing loads for a bad command line), plain-text help, integer arguments."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from cli_helpers import refusal
from santa.cli import main
from santa.eval.report import cells, check_records, compare_methods, pivot, table
from santa.eval.runner import grid
from test_sweep_files import jobs, record, write


def kl_records() -> list[dict]:
    kl_jobs = grid(models=["m"], tasks=["kl"], lengths=[512], methods=["dense", "systematic"], budgets=[16], prompts=[0, 1])
    return [{"key": j.key(), **asdict(j), "score": 0.1 * (j.method != "dense"), "nll": 2.0, "prompt_tokens": 500,
             "new_tokens": 31} for j in kl_jobs]


def edited(records: list[dict], index: int, **fields) -> list[dict]:
    """``records`` with record ``index`` changed (a field set to ``DROP`` is removed)."""
    changed = {k: v for k, v in {**records[index], **fields}.items() if v is not DROP}
    return records[:index] + [changed] + records[index + 1 :]


DROP = object()
ACCURACY = [record(j) for j in jobs()]  # dense, topk S=16 on prompts 0 and 1 (dense first)
VIEWS = [[], ["--pivot"], ["--pivot", "--delta"], ["--smallest-budgets"], ["--compare", "systematic,topk"]]


# --- eval report: every field it reads is checked per line ---------------------------------------------

BAD_RECORDS = {
    "a KL record without nll": (kl_records, 1, {"nll": DROP}, "a record without nll"),
    "a NaN score": (lambda: ACCURACY, 0, {"score": float("nan")}, "score must be a finite number, got nan"),
    "an infinite score": (lambda: ACCURACY, 1, {"score": float("inf")}, "score must be a finite number, got inf"),
    "a NaN KL": (kl_records, 1, {"score": float("nan")}, "score must be a finite number, got nan"),
    "a NaN nll": (kl_records, 0, {"nll": float("nan")}, "nll must be a finite number ≥ 0, got nan"),
    "an accuracy above 1": (lambda: ACCURACY, 1, {"score": 2.0}, "score of a niah_single record must be in [0, 1]"),
    "a negative KL": (kl_records, 1, {"score": -0.5}, "score of a KL record must be ≥ 0"),
    "a dense record with a budget": (lambda: ACCURACY, 0, {"budget": 16}, "budget of a dense record must be 0"),
    "a sampled record with budget 0": (lambda: ACCURACY, 1, {"budget": 0}, "budget of a topk record must be ≥ 1"),
    "an unknown method": (lambda: ACCURACY, 1, {"method": "magic"}, "method must be one of dense, iid"),
    "an unknown task": (lambda: ACCURACY, 1, {"task": "chess"}, "task must be one of niah_single"),
    "an unknown prefill": (lambda: ACCURACY, 1, {"prefill": "half"}, "prefill must be one of dense, sampled"),
    "a negative prompt": (lambda: ACCURACY, 1, {"prompt": -1}, "prompt must be an integer ≥ 0, got -1"),
    "a float length": (lambda: ACCURACY, 1, {"length": 512.5}, "length must be an integer ≥ 0, got 512.5"),
    "a bool budget": (lambda: ACCURACY, 1, {"budget": True}, "budget must be an integer ≥ 0, got True"),
    "an empty model": (lambda: ACCURACY, 1, {"model": ""}, "model must be a non-empty string"),
    "a string share read": (lambda: ACCURACY, 1, {"v_rows_read": "a"}, "v_rows_read must be a number in [0, 1]"),
    "a share read above 1": (lambda: ACCURACY, 1, {"v_rows_read_kv": 3.0}, "v_rows_read_kv must be a number in [0, 1]"),
    "a string answer budget": (lambda: ACCURACY, 1, {"max_new_tokens": "x"}, "max_new_tokens must be an integer ≥ 1"),
    "a string score_samples": (lambda: ACCURACY, 1, {"score_samples": "8"}, "score_samples must be an integer ≥ 0"),
    "a numeric schedule": (lambda: ACCURACY, 1, {"schedule": 5}, "schedule must be a string, got 5"),
    "an unknown KL mode": (kl_records, 1, {"kl_mode": 3}, "kl_mode must be one of chunked, stepwise"),
    "negative new tokens": (lambda: ACCURACY, 1, {"new_tokens": -3}, "new_tokens must be an integer ≥ 0"),
}


@pytest.mark.parametrize("view", VIEWS[:2] + VIEWS[-1:], ids=lambda v: " ".join(v) or "table")
@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_report_names_the_file_and_line_of_a_record_it_cannot_use(tmp_path, capsys, case, view):
    make, index, fields, message = BAD_RECORDS[case]
    path = tmp_path / "sweep.jsonl"
    write(path, edited(make(), index, **fields))
    assert main(["eval", "report", str(path), *view]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"santa eval report: error: {path}, line {index + 1}: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err and "nan [" not in err


@pytest.mark.parametrize("case", ["a NaN score", "an infinite score", "a dense record with a budget", "an unknown method", "a negative prompt"])
def test_the_library_refuses_the_same_records_by_index(case):
    make, index, fields, message = BAD_RECORDS[case]
    records = edited(make(), index, **fields)
    with pytest.raises(ValueError, match=rf"records\[{index}\]: {message[:20]}"):
        cells(records)
    with pytest.raises(ValueError, match=rf"records\[{index}\]"):
        compare_methods(records, "systematic", "topk")
    with pytest.raises(ValueError, match=r"records\[0\] must be a dict"):
        check_records(["not a record"])


def test_a_kl_table_of_records_passed_without_nll_shows_no_perplexity():
    records = [{k: v for k, v in r.items() if k != "nll"} for r in kl_records()]
    text = table(cells(records))
    assert "ppl –" in text and "None" not in text


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: " ".join(v) or "table")
def test_valid_records_of_every_kind_still_report(tmp_path, capsys, view):
    path = tmp_path / "sweep.jsonl"
    write(path, ACCURACY + kl_records())
    assert main(["eval", "report", str(path), *view]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out


def test_pivot_shows_every_method_of_the_records():
    records = [record(j) for j in grid(models=["m"], tasks=["niah_single"], lengths=[512], methods=["dense", "iid", "prop"],
                                        budgets=[16], prompts=[0, 1])]
    text = pivot(cells(records))
    assert all(f"| {method} |" in text for method in ("dense", "iid", "prop"))


# --- flags checked against the model's config before any work --------------------------------------


@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """No weight may load and no sweep may run; the model cache is empty (its config is read from the
    bundled GGUF's header)."""
    import santa.assets
    import santa.eval.cli
    import santa.model

    def refuse(*args, **kwargs):
        raise AssertionError("the command did work before refusing its flags")

    monkeypatch.setenv("SANTA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(santa.assets, "load_model", refuse)
    monkeypatch.setattr(santa.model, "load_bundled", refuse, raising=False)
    monkeypatch.setattr(santa.eval.cli, "run_sweep", refuse)
    return tmp_path


def schedule(tmp_path, layers: dict) -> str:
    path = tmp_path / "learned.json"
    path.write_text(json.dumps({"layer_budgets": {str(k): v for k, v in layers.items()}}))
    return str(path)


@pytest.mark.parametrize("layers,bad", [({0: 4, 30: 2}, 30), ({99: 4}, 99), ({**{i: 4 for i in range(30)}, 31: 1}, 31)])
def test_eval_run_refuses_schedule_layers_past_the_model_before_any_work(no_work, capsys, layers, bad):
    out = no_work / "sweep.jsonl"
    path = schedule(no_work, layers)
    err = refusal(main, ["eval", "run", "--out", str(out), "--prompts", "0", "--layer-budgets", path], capsys)
    assert f"argument --layer-budgets: {path} sets layer {bad}, but smollm2-135m has 30 layers (0 to 29)" in err
    assert not out.exists()


def test_eval_run_reads_the_layer_count_from_the_cached_config(no_work, capsys, monkeypatch):
    """A cached model is measured by its config.json (here a 4-layer one), not the GGUF."""
    folder = no_work / "cache" / "smollm2-135m"
    folder.mkdir(parents=True)
    config = {"num_hidden_layers": 4, "max_position_embeddings": 4096, "num_attention_heads": 9, "hidden_size": 576}
    (folder / "config.json").write_text(json.dumps(config))
    path = schedule(no_work, {4: 2})
    err = refusal(main, ["eval", "run", "--out", str(no_work / "s.jsonl"), "--layer-budgets", path], capsys)
    assert "smollm2-135m has 4 layers (0 to 3)" in err
    err = refusal(main, ["eval", "run", "--out", str(no_work / "s.jsonl"), "--lengths", "4096"], capsys)
    assert "smollm2-135m reads at most 4096 tokens" in err


@pytest.mark.parametrize("config,message", [
    ("{", "cannot read the model's config"),
    ('{"num_hidden_layers": 0, "max_position_embeddings": 8, "num_attention_heads": 1, "hidden_size": 8}',
     "num_hidden_layers must be an integer ≥ 1, got 0"),
    ('{"num_hidden_layers": "4"}', "num_attention_heads must be an integer ≥ 1, got None"),
])
def test_an_unreadable_cached_config_is_one_line_and_exit_1(no_work, capsys, config, message):
    folder = no_work / "cache" / "smollm2-135m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(config)
    assert main(["eval", "run", "--out", str(no_work / "s.jsonl"), "--prompts", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("santa eval run: error: ") and message in err and err.count("\n") == 1


def test_a_partial_schedule_is_named_on_stderr_and_runs(no_work, capsys, monkeypatch):
    import santa.eval.cli

    seen = {}
    monkeypatch.setattr(santa.eval.cli, "run_sweep", lambda jobs, out, **kw: seen.setdefault("jobs", jobs) and 0)
    path = schedule(no_work, {0: 8, 3: 2})
    assert main(["eval", "run", "--out", str(no_work / "s.jsonl"), "--prompts", "0", "--layer-budgets", path]) == 0
    assert f"note: {path} sets 2 of smollm2-135m's 30 layers; the others use --budgets" in capsys.readouterr().err
    assert {j.layer_budgets for j in seen["jobs"] if j.method != "dense"} == {((0, 8), (3, 2))}


@pytest.mark.parametrize("argv,message", [
    (["--lengths", "9000"], "argument --lengths: smollm2-135m reads at most 8192 tokens, got 9000 + --max-new-tokens 64"),
    (["--lengths", "8192"], "argument --lengths: smollm2-135m reads at most 8192 tokens, got 8192 + --max-new-tokens 64"),
    (["--lengths", "8000", "--max-new-tokens", "500"], "got 8000 + --max-new-tokens 500"),
    (["--tasks", "kl", "--lengths", "10000"], "argument --lengths: smollm2-135m reads at most 8192 tokens, got 10000 (kl)"),
    (["--tasks", "gsm8k", "--max-new-tokens", "100000"], "argument --max-new-tokens: smollm2-135m reads at most 8192 tokens"),
    (["--prompts", "0-99999", "--budgets", "1-99999"], "holds up to 39,999,700,000 jobs, more than 1,000,000"),
    (["--prompts", "0-9999", "--seeds", "0-999"], "more than 1,000,000; split it over several sweeps"),
    (["--threads", "1099511627776"], "argument --threads: at most 1024, got 1099511627776"),
    (["--device", "cuda:7"], "argument --device: cuda:7"),
])
def test_eval_run_refuses_flags_beyond_the_model_or_the_machine_before_any_work(no_work, capsys, argv, message):
    import torch

    if "cuda:7" in argv and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a device cuda:7")
    out = no_work / "sweep.jsonl"
    err = refusal(main, ["eval", "run", "--out", str(out), *argv], capsys)
    assert message in err
    assert not out.exists()


def test_kl_at_the_full_context_is_accepted(no_work, monkeypatch):
    import santa.eval.cli

    monkeypatch.setattr(santa.eval.cli, "run_sweep", lambda jobs, out, **kw: len(jobs))
    argv = ["eval", "run", "--out", str(no_work / "s.jsonl"), "--tasks", "kl", "--lengths", "8192", "--methods", "dense"]
    assert main([*argv, "--prompts", "0"]) == 0


@pytest.mark.parametrize("argv,message", [
    (["variance", "--length", "100000"], "argument --length: smollm2-135m reads at most 8192 tokens, got 100000"),
    (["bernoulli", "--length", "8193"], "argument --length: smollm2-135m reads at most 8192 tokens, got 8193"),
    (["variance", "--replicates", "100000"], "argument --replicates: 100000 replicates × 9 heads × 2048 keys"),
    (["variance", "--budgets", "16,100000000"], "past santa.sampling.MAX_DRAWS"),
    (["bernoulli", "--samples", "1,1000000"], "argument --samples: B = 1000000 draws × 9 heads × 64 features"),
    (["variance", "--out", "/"], "argument --out: / is a folder"),
    (["bernoulli", "--plot", "x.nosuchformat"], "matplotlib cannot write .nosuchformat files"),
])
def test_eval_diagnostics_refuse_flags_beyond_the_model_before_loading(no_work, capsys, argv, message):
    assert message in refusal(main, ["eval", *argv], capsys)


# --- santa bench capture: --layers and --tokens against the model, before it loads -----------------


@pytest.mark.parametrize("argv,message", [
    (["--layers", "99"], "argument --layers: layer 99 is past the model's 30 layers (valid: 0 to 29, first, mid, last)"),
    (["--layers", "0,30"], "argument --layers: layer 30 is past the model's 30 layers"),
    (["--layers", "x"], "argument --layers: expected layer indices ≥ 0 or first, mid, last, got 'x'"),
    (["--layers", "-1"], "argument --layers: expected layer indices ≥ 0 or first, mid, last, got '-1'"),
    (["--layers", "1.5"], "argument --layers: expected layer indices ≥ 0 or first, mid, last, got '1.5'"),
    (["--layers", ","], "argument --layers: give at least one layer"),
    (["--tokens", "9000"], "argument --tokens: smollm2-135m reads at most 8192 tokens, got 9000"),
    (["--tokens", "1"], "argument --tokens: expected an integer ≥ 256, got 1"),
    (["--tokens", "x"], "argument --tokens: expected an integer, got 'x'"),
    (["--model", "nosuch"], "argument --model: unknown model 'nosuch'"),
    (["--seed", "-1"], "argument --seed:"),
    (["--threads", "-1"], "argument --threads:"),
    (["--out", "/"], "argument --out: / is a folder"),
])
def test_bench_capture_refuses_a_bad_flag_before_loading(no_work, capsys, argv, message):
    err = refusal(main, ["bench", "capture", *argv], capsys)
    assert f"santa bench capture: error: {message}" in err


def test_bench_capture_names_resolve_against_the_layer_count():
    from santa.bench.capture import layer_list, resolve_layers

    assert resolve_layers(layer_list("first,mid,last,3"), 30) == [0, 3, 15, 29]
    assert resolve_layers(layer_list("last,last"), 4) == [3]
