"""santa eval run --error-targets (issue 42): budgets from an error target on the sweep's sampled jobs, with old keys
kept for the fixed budget, the target in the report's setting, the HF path's real rows read, and bad targets refused."""

from __future__ import annotations

import json

import pytest

from helpers import refusal
from santa.eval.report import setting_label
from santa.eval.runner import grid

GRID = dict(models=["smollm2-135m"], tasks=["niah_single"], lengths=[1024], methods=["dense", "topk", "systematic"],
            budgets=[64], prompts=[0])


def test_targets_multiply_the_sampled_jobs_only_and_the_fixed_budget_keeps_its_keys():
    plain = {j.method: j.key() for j in grid(**GRID)}
    jobs = grid(**GRID, error_targets=[0.0, 0.1])
    assert sorted((j.method, j.error_target) for j in jobs) == [("dense", 0.0), ("systematic", 0.0), ("systematic", 0.1),
                                                                ("topk", 0.0)]
    keys = {(j.method, j.error_target): j.key() for j in jobs}
    assert keys[("systematic", 0.0)] == plain["systematic"] and "error_target" not in plain["systematic"]
    assert json.loads(keys[("systematic", 0.1)])["error_target"] == 0.1
    targeted = next(j for j in jobs if j.error_target)
    assert targeted.config().error_target == 0.1 and targeted.config().budget == 64


def test_the_report_shows_the_target_in_the_setting():
    assert setting_label({"prefill": "dense", "task": "niah_single", "error_target": 0.1}) == "dense+ε0.1"
    assert setting_label({"prefill": "dense", "task": "niah_single", "error_target": 0.0}) == "dense"


def test_grid_refuses_bad_targets():
    with pytest.raises(ValueError, match="error target"):
        grid(**GRID, error_targets=[-0.1])
    with pytest.raises(ValueError, match="error targets apply"):
        grid(**{**GRID, "methods": ["dense", "topk"]}, error_targets=[0.1])


@pytest.mark.parametrize(("value", "match"), [("-1", "≥ 0"), ("nan", "finite"), ("x", "numbers ≥ 0")])
def test_a_bad_flag_is_refused_before_any_work(tmp_path, capsys, monkeypatch, value, match):
    import santa.eval.cli as eval_cli
    from santa.cli import main

    monkeypatch.setattr(eval_cli, "run_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    err = refusal(main, ["eval", "run", "--out", str(tmp_path / "s.jsonl"), "--error-targets", value], capsys)
    assert "--error-targets" in err and match in err


def test_the_hf_path_records_the_rows_the_heads_read():
    """A job's config on the reference path counts the pilot's and the output's rows (DecodeStats)."""
    import torch

    import santa.hf
    from helpers import tiny_hf_model

    model = tiny_hf_model("llama")
    job = grid(**{**GRID, "methods": ["systematic"], "budgets": [6]}, error_targets=[0.3])[0]
    config = job.config()
    santa.hf.configure(model, config)
    with torch.inference_mode():
        model.generate(torch.tensor([[5, 17, 3, 9, 23, 8, 61, 2, 44, 2, 50, 9]]), max_new_tokens=3, do_sample=False,
                       pad_token_id=0)
    assert config.stats.calls > 0 and 0 < config.stats.share_per_head <= 1


def test_santa_generate_passes_the_target(capsys, generate_run_arguments):
    from santa.cli import main

    assert main(["generate", "--error-target", "0.1", "--budget", "128"]) == 1  # the stand-in's refusal
    assert (generate_run_arguments["error_target"], generate_run_arguments["budget"]) == (0.1, 128)
    assert main(["generate"]) == 1 and generate_run_arguments["error_target"] is None
    capsys.readouterr()


def test_santa_generate_refuses_a_bad_target_before_loading(capsys):
    from santa.cli import main
    from santa.generate import sampled_name

    err = refusal(main, ["generate", "--error-target", "-0.5"], capsys)
    assert "argument --error-target: expected a finite number > 0" in err
    assert sampled_name("systematic", 64, None) == "systematic S=64"
    assert sampled_name("systematic", 64, 0.1) == "systematic ε=0.1 S≤64"


def test_santa_generate_says_the_fast_paths_error_target_reads_are_not_counted(capsys):
    """Where nothing counted an error target's reads (off the kernels) the row says so (NaN), where None still means
    exact."""
    import math

    import santa.cli
    from santa.generate import Answer, Prompt

    prompt = Prompt(task="user", text="hi", answers=(), n_tokens=2, seed=0)
    answer = Answer(method="santa-prop ε=0.1 S≤64", text="x", found=False, prefill_s=0.1, decode_s=0.1, new_tokens=3,
                    share_per_head=math.nan, share_per_kv_head=None)
    santa.cli.print_answers([prompt], [answer], fast=True)
    row = capsys.readouterr().out.splitlines()[-1]
    assert "not counted" in row and "100 %" not in row and "nan" not in row
