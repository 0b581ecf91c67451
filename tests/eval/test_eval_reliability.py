"""santa eval / santa bench reliability: hand-edited sweep records named by file and line, every flag
checked before any work (nothing loads for a bad command line), plain-text help, integer arguments."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from helpers import refusal, sweep_jobs, sweep_record, write_jsonl
from santa.cli import main
from santa.eval.report import cells, check_records, compare_methods, pivot, table
from santa.eval.runner import grid


def kl_records() -> list[dict]:
    kl_jobs = grid(models=["m"], tasks=["kl"], lengths=[512], methods=["dense", "systematic"], budgets=[16], prompts=[0, 1])
    return [{"key": j.key(), **asdict(j), "score": 0.1 * (j.method != "dense"), "nll": 2.0, "prompt_tokens": 500,
             "new_tokens": 31} for j in kl_jobs]


def edited(records: list[dict], index: int, **fields) -> list[dict]:
    """``records`` with record ``index`` changed (a field set to ``DROP`` is removed)."""
    changed = {k: v for k, v in {**records[index], **fields}.items() if v is not DROP}
    return records[:index] + [changed] + records[index + 1 :]


DROP = object()
ACCURACY = [sweep_record(j) for j in sweep_jobs()]  # dense, topk S=16 on prompts 0 and 1 (dense first)
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
    write_jsonl(path, edited(make(), index, **fields))
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
    write_jsonl(path, ACCURACY + kl_records())
    assert main(["eval", "report", str(path), *view]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out


def test_pivot_shows_every_method_of_the_records():
    records = [sweep_record(j) for j in grid(models=["m"], tasks=["niah_single"], lengths=[512], methods=["dense", "iid", "prop"],
                                        budgets=[16], prompts=[0, 1])]
    text = pivot(cells(records))
    assert all(f"| {method} |" in text for method in ("dense", "iid", "prop"))


# --- flags checked against the model's config before any work --------------------------------------


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
    from benchmarks.bench.capture import layer_list, resolve_layers

    assert resolve_layers(layer_list("first,mid,last,3"), 30) == [0, 3, 15, 29]
    assert resolve_layers(layer_list("last,last"), 4) == [3]


# --- santa bench real, kernels, e2e: every flag before any work ---------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["--lengths", "9000"], "argument --lengths: smollm2-135m reads at most 8192 tokens, got 9000 + --new-tokens 64"),
    (["--lengths", "8150", "--new-tokens", "100"], "argument --lengths: smollm2-135m reads at most 8192 tokens, got 8150 + --new-tokens 100"),
    (["--budget", "2097152"], "argument --budget: expected an integer in [1, 1048577), got 2097152"),
    (["--batches", "1,5000"], "argument --batches: every batch size must be an integer in [1, 1025), got 5000"),
    (["--lengths", "0-99999999"], "argument --lengths: range '0-99999999' holds more than 100000 values"),
    (["--device", "tpu"], "argument --device: expected cpu, cuda or cuda:N, got 'tpu'"),
    (["--out", "/etc/passwd"], "argument --out: /etc/passwd exists and is not a folder"),
])
def test_bench_real_refuses_a_bad_flag_before_loading(no_work, capsys, argv, message):
    err = refusal(main, ["bench", "real", "--device", "cpu", *argv], capsys)
    assert f"santa bench real: error: {message}" in err


@pytest.fixture
def fake_gpu(monkeypatch):
    """torch sees one 80 GiB GPU (the checks run; nothing may touch it)."""
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(total_memory=80 * 2**30))


@pytest.mark.parametrize("argv,message", [
    (["--tune-variants", "nope"], "--tune-variants: unknown variant 'nope'; choose from default,"),
    (["--prop-budgets", "2000000"], "--prop-budgets: the kernels take at most 1048576 samples per head"),
    (["--sizes", "1000000000"], "the largest case needs about"),
    (["--no-tune", "--batches", "4096", "--batch-keys", "1000000"], "this GPU has 80 GiB"),
    (["--out", "/etc/passwd"], "argument --out: /etc/passwd exists and is not a folder"),
])
def test_bench_kernels_refuses_a_bad_flag_before_touching_the_gpu(fake_gpu, capsys, argv, message):
    from benchmarks.bench.kernels import main as kernels

    err = refusal(kernels, [*argv], capsys)
    assert "santa bench kernels: error: " in err and message in err


@pytest.mark.parametrize("content", [{"layers": {}}, [1, 2], "text", None])
def test_bench_kernels_names_a_real_file_it_cannot_use_and_exits_1(fake_gpu, tmp_path, capsys, content):
    import torch
    from benchmarks.bench.kernels import main as kernels

    path = tmp_path / "capture.pt"
    if content == "text":
        path.write_text("not a capture")
    else:
        torch.save(content, path)
    assert kernels(["--real", str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"santa bench kernels: error: {path}: not a santa bench capture file") and err.count("\n") == 1


def capture_of(q_shape=(1, 9, 64), kv_shape=(1, 5, 3, 64), scale=0.125) -> dict:
    import torch

    return {"layers": {0: {"q": torch.zeros(q_shape), "k": torch.zeros(kv_shape), "v": torch.zeros(kv_shape)}}, "scale": scale}


@pytest.mark.parametrize("cap,message", [
    (capture_of(kv_shape=(1, 5, 4, 64)), "does not match"),
    (capture_of(q_shape=(9, 64)), "expected q [1, H, d]"),
    (capture_of(scale=-1.0), "scale must be a positive number or None"),
    ({"layers": {0: {"q": 1}}}, "must hold floating-point tensors q, k and v"),
])
def test_load_capture_refuses_a_malformed_capture_naming_the_file(tmp_path, cap, message):
    import torch
    from benchmarks.bench.kernels import load_capture

    path = tmp_path / "capture.pt"
    torch.save(cap, path)
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a santa bench capture file: ") + ".*" + re.escape(message)):
        load_capture(str(path))


def test_bench_e2e_refuses_a_case_larger_than_the_device(capsys):
    argv = ["bench", "e2e", "--config", "tiny", "--device", "cpu", "--prompts", "1000000000", "--batches", "64"]
    assert "positions) needs about" in refusal(main, argv, capsys)


# --- help texts: plain text ---------------------------------------------------------------------------


HELP = [["eval"], ["eval", "run"], ["eval", "report"], ["eval", "variance"], ["eval", "bernoulli"], ["bench"],
        ["bench", "kernels"], ["bench", "e2e"], ["bench", "capture"], ["bench", "real"]]


@pytest.mark.parametrize("command", HELP, ids=" ".join)
def test_help_is_plain_text(capsys, command):
    try:
        code = main([*command, "-h"])
    except SystemExit as stop:
        code = stop.code
    assert code in (0, None)
    text = capsys.readouterr().out
    assert text.startswith("usage:")
    for markup in ("``", ":func:", ":class:", ":data:", ":mod:", ":meth:", "`"):
        assert markup not in text, f"{markup!r} in the help of santa {' '.join(command)}"


# --- integer arguments of the library functions: numpy ints accepted, floats a TypeError ---------------


class WordTokenizer:
    """Whitespace tokens and a bare chat template: enough for the prompt generators."""

    def encode(self, text, add_special_tokens=False):
        return text.split()

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "\n".join(m["content"] for m in messages) + "\nanswer:"


def test_prompt_generators_take_numpy_ints_and_give_the_same_prompt():
    import numpy as np

    from santa.eval.tasks import build_prompt, needle_prompt

    tokenizer = WordTokenizer()
    assert needle_prompt(tokenizer, np.int64(300), seed=np.int32(2)) == needle_prompt(tokenizer, 300, seed=2)
    assert build_prompt("niah_single", tokenizer, np.int16(300), np.int64(1)) == build_prompt("niah_single", tokenizer, 300, 1)


@pytest.mark.parametrize("task", ["niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "fwe", "cwe", "kl",
                                  "gsm8k", "mmlu"])
@pytest.mark.parametrize("n_tokens,seed,error", [(300.0, 0, TypeError), (300, 1.0, TypeError), ("300", 0, TypeError),
                                                 (300, None, TypeError), (300, True, TypeError), (300, -1, ValueError)])
def test_prompt_generators_refuse_a_non_int_length_or_seed(task, n_tokens, seed, error):
    from santa.eval.tasks import build_prompt

    if task in ("gsm8k", "mmlu") and n_tokens != 300:
        n_tokens = 300.0  # their length is ignored, but must still be an int
    with pytest.raises(error, match="n_tokens|seed"):
        build_prompt(task, WordTokenizer(), n_tokens, seed)


def test_a_prompt_too_short_for_its_question_is_refused():
    from santa.eval.tasks import needle_prompt

    with pytest.raises(ValueError, match="n_tokens=10 leaves no room for a haystack"):
        needle_prompt(WordTokenizer(), 10)


@pytest.mark.parametrize("kwargs,error", [
    ({"n_resamples": 100.0}, TypeError), ({"seed": 1.5}, TypeError), ({"n_resamples": 0}, ValueError),
    ({"level": 1.0}, ValueError), ({"seed": "0"}, TypeError),
])
def test_bootstrap_ci_checks_its_arguments(kwargs, error):
    from santa.eval.report import bootstrap_ci

    with pytest.raises(error):
        bootstrap_ci([0.0, 1.0], **kwargs)


def test_bootstrap_ci_takes_numpy_ints():
    import numpy as np

    from santa.eval.report import bootstrap_ci

    assert bootstrap_ci([0.0, 1.0, 1.0], n_resamples=np.int64(50), seed=np.int32(3)) == bootstrap_ci([0.0, 1.0, 1.0], n_resamples=50, seed=3)


@pytest.mark.parametrize("kwargs,error", [
    ({"length": 256.0}, TypeError), ({"prompts": 2.0}, TypeError), ({"replicates": 1}, ValueError),
    ({"budgets": (8, 16.0)}, TypeError), ({"budgets": (8, 8)}, ValueError), ({"group_size": 0}, ValueError),
    ({"budgets": 16}, TypeError),
])
def test_variance_diagnostics_check_their_arguments_before_any_work(kwargs, error):
    from santa.eval.variance import diagnostics

    with pytest.raises(error):
        diagnostics(None, None, **kwargs)


@pytest.mark.parametrize("kwargs,error", [
    ({"length": 256.0}, TypeError), ({"prompts": 0}, ValueError), ({"samples": (1, 2.0)}, TypeError), ({"samples": ()}, ValueError),
])
def test_bernoulli_diagnostics_check_their_arguments_before_any_work(kwargs, error):
    from santa.eval.score_stage import bernoulli_diagnostics

    with pytest.raises(error):
        bernoulli_diagnostics(None, None, **kwargs)


@pytest.mark.parametrize("kwargs,error", [
    ({"length": 256.0}, TypeError), ({"batch": 0}, ValueError), ({"budget": 64.0}, TypeError),
    ({"warm_tokens": 8}, ValueError), ({"repeats": None}, TypeError),
])
def test_bench_case_checks_its_arguments_before_any_work(kwargs, error):
    from benchmarks.bench.real import bench_case

    args = dict(length=256, batch=1, backends=["sdpa"], budget=64, new_tokens=8, warm_tokens=2, repeats=1, seed=0) | kwargs
    with pytest.raises(error):
        bench_case(None, None, **args)


def test_capture_and_tiling_check_their_integer_arguments():
    import types

    import numpy as np
    import torch
    from benchmarks.bench.capture import capture
    from benchmarks.bench.kernels import real_inputs, tile_keys

    model = types.SimpleNamespace(model=types.SimpleNamespace(layers=[types.SimpleNamespace(self_attn=None)] * 4))
    ids = torch.zeros(1, 8, dtype=torch.long)
    for layers, error in (([4], ValueError), ([1.0], TypeError), ([-1], ValueError), ([], ValueError), ("0", TypeError)):
        with pytest.raises(error):
            capture(model, ids, layers)
    with pytest.raises(ValueError, match="input_ids"):
        capture(model, torch.zeros(1, 1, dtype=torch.long), [0])
    x = torch.arange(6.0).reshape(1, 3, 1, 2)
    assert torch.equal(tile_keys(x, np.int64(5)), tile_keys(x, 5))
    with pytest.raises(TypeError):
        tile_keys(x, 5.0)
    with pytest.raises(ValueError, match="captured layers"):
        real_inputs(capture_of(), 7, 5, "cpu")


@pytest.mark.parametrize("argv", [["report", "s.jsonl", "--plots", "plots"], ["variance"], ["bernoulli"]])
def test_eval_commands_that_plot_without_matplotlib_say_how_to_install_it(no_work, capsys, monkeypatch, argv):
    import santa.eval.cli

    monkeypatch.setattr(santa.eval.cli, "has_matplotlib", lambda: False)
    assert "needs matplotlib: pip install 'santa-attention[plot]'" in refusal(main, ["eval", *argv], capsys)


@pytest.mark.parametrize("argv,task", [(["run", "--out", "s.jsonl", "--tasks", "niah_single,gsm8k"], "gsm8k"),
                                       (["run", "--out", "s.jsonl", "--tasks", "mmlu"], "mmlu"),
                                       (["variance", "--task", "kl"], "kl")])
def test_eval_commands_refuse_a_task_whose_data_is_not_installed(no_work, capsys, monkeypatch, argv, task):
    import santa.eval.tasks

    monkeypatch.setitem(santa.eval.tasks.TASK_DATA, task, ("santa_no_such_package", "pip install the-data"))
    err = refusal(main, ["eval", *argv], capsys)
    assert f"task {task} needs its data, not installed: pip install the-data" in err


def test_report_plots_stay_in_their_folder_whatever_the_names_in_the_records(tmp_path, capsys):
    path, plots = tmp_path / "sweep.jsonl", tmp_path / "a" / "plots"
    write_jsonl(path, [dict(r, model="../../escaped", schedule="x/../../y") for r in ACCURACY])
    assert main(["eval", "report", str(path), "--plots", str(plots)]) == 0
    written = [line.removeprefix("wrote ") for line in capsys.readouterr().out.splitlines() if line.startswith("wrote ")]
    assert written and all(Path(w).parent == plots for w in written)
    assert sorted(p.name for p in tmp_path.rglob("*.png")) == sorted(Path(w).name for w in written)


def _gguf_header(fields: dict[str, int | str]) -> bytes:
    """A GGUF v3 header with no tensors: ``fields`` as uint32 (type 4) or string (type 8) values."""
    import struct

    def text(s: str) -> bytes:
        return struct.pack("<Q", len(s.encode())) + s.encode()

    body = b"".join(text(k) + (struct.pack("<I", 8) + text(v) if isinstance(v, str) else struct.pack("<II", 4, v))
                    for k, v in fields.items())
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields)) + body


def test_model_shape_reads_a_joined_multi_part_gguf_without_its_packages(tmp_path, monkeypatch):
    """A multi-part model joined into $SANTA_CACHE before (a GPU machine given the joined file, no packages):
    the flags are bounded by that file's header, not refused because part 1's package is missing."""
    from santa import assets
    from santa.eval.cli import ModelShape, model_shape

    monkeypatch.setenv("SANTA_CACHE", str(tmp_path))
    (tmp_path / assets.lookup("qwen2.5-coder-0.5b").gguf_name).write_bytes(_gguf_header({
        "general.architecture": "qwen2", "qwen2.block_count": 3, "qwen2.context_length": 1024,
        "qwen2.attention.head_count": 4, "qwen2.embedding_length": 256}))

    def no_package(package, hint):
        raise FileNotFoundError(f"package {package!r} is not installed")

    monkeypatch.setattr(assets, "package_folder", no_package)
    assert model_shape("qwen2.5-coder-0.5b") == ModelShape(layers=3, context=1024, heads=4, head_dim=64)
