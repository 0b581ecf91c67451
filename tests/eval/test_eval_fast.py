"""``santa eval run`` on the fast path (santa.model): the path logic, its flags, and its records."""

import math
import os

import pytest
import torch

import santa.assets
import santa.eval.cli
from helpers import needs_cuda, refusal
from santa.cli import main
from santa.engine import check_paths, hf_reason, nominal_share, resolve_path
from santa.eval.runner import Job, grid, run_sweep
from santa.sweep_files import read_records


def job(**kwargs) -> Job:
    fields = {"model": "m", "task": "niah_single", "length": 512, "prompt": 0, "prefill": "dense", "method": "prop", "budget": 16, "seed": 0, "max_new_tokens": 4}
    return Job(**(fields | kwargs))


def kernels_label() -> str:
    triton = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    return "santa.model/kernels" if triton else "santa.model/kernels-torch"


def test_auto_path_is_fast_on_cuda_and_hf_on_cpu():
    assert (resolve_path("auto", "cuda"), resolve_path("auto", "cpu"), resolve_path("fast", "cpu")) == ("fast", "hf", "fast")


def test_resolve_path_refuses_an_unknown_path():
    with pytest.raises(ValueError, match="path must be one of"):
        resolve_path("gpu", "cpu")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"prefill": "sampled"}, "sampled prefill"),
        ({"task": "kl", "prefill": "sampled"}, "sampled prefill"),
        ({"score_samples": 8}, "Bernoulli"),
        ({"task": "kl", "exact_when_covers": True}, "exact_when_covers"),
    ],
)
def test_jobs_the_fast_path_cannot_run_say_why(fields, reason):
    assert reason in hf_reason(job(method="systematic", **fields))


def test_a_plain_decode_job_runs_on_the_fast_path():
    assert hf_reason(job(method="topk")) is None


def test_teacher_forced_kl_runs_on_the_fast_path_for_every_method():
    kl = grid(models=["m"], tasks=["kl"], lengths=[512], methods=["dense", "prop", "flash", "systematic", "topk"], budgets=[16], prompts=[0])
    assert [hf_reason(j) for j in kl] == [None] * len(kl)
    check_paths(kl, "fast")  # prop and flash KL are no longer refused


def test_prop_on_the_hf_path_is_refused():
    with pytest.raises(ValueError, match="method prop runs on the fast path only"):
        check_paths([job()], "hf")


def test_flash_with_sampled_prefill_is_refused_on_the_fast_path():
    with pytest.raises(ValueError, match="method flash runs on the fast path only .* sampled prefill"):
        check_paths([job(method="flash", prefill="sampled")], "fast")


def test_nominal_share_is_s_over_n_capped_at_one():
    assert nominal_share("santa-prop", 8, 7, 2) == pytest.approx((1.0 + 8 / 9) / 2)
    assert nominal_share("sdpa", 8, 100, 5) == 1.0


def test_the_path_is_not_part_of_the_job_key():
    assert "path" not in job().key()


def test_kv_caches_multiply_the_grid_and_the_models_cache_keeps_the_old_keys():
    jobs = grid(models=["m"], tasks=["fwe"], lengths=[512], methods=["dense", "prop"], budgets=[128], prompts=[0],
                kv_caches=["auto", "fp8"])
    assert sorted((j.method, j.kv_cache) for j in jobs) == [("dense", "auto"), ("dense", "fp8"), ("prop", "auto"), ("prop", "fp8")]
    assert "kv_cache" not in job().key() and '"kv_cache": "fp8"' in job(kv_cache="fp8").key()
    with pytest.raises(ValueError, match="kv_cache"):
        grid(models=["m"], tasks=["fwe"], lengths=[512], methods=["dense"], prompts=[0], kv_caches=["fp8_e5m2"])


def test_an_fp8_cache_on_the_hf_path_is_refused():
    with pytest.raises(ValueError, match="an fp8 KV cache runs on the fast path only"):
        check_paths([job(method="dense", kv_cache="fp8")], "hf")
    with pytest.raises(ValueError, match="an fp8 KV cache runs on the fast path only .* sampled prefill"):
        check_paths([job(method="systematic", prefill="sampled", kv_cache="fp8")], "fast")
    check_paths([job(method="dense", kv_cache="fp8")], "fast")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--path", "gpu"], "argument --path: invalid choice: 'gpu'"),
        (["--path", "hf", "--methods", "dense,prop"], "argument --methods: prop and flash run on the fast path only"),
        (["--path", "fast", "--methods", "flash", "--tasks", "kl", "--lengths", "512", "--prefill", "sampled"],
         "argument --methods: method flash runs on the fast path only (santa.kernels), but sampled prefill"),
        (["--path", "hf", "--methods", "dense", "--kv-caches", "auto,fp8"],
         "argument --kv-caches: an fp8 KV cache runs on the fast path only (santa.model), but --path hf was asked for"),
        (["--kv-caches", "fp16"], "argument --kv-caches: unknown KV cache 'fp16'; choose from auto, fp8"),
    ],
)
def test_eval_run_refuses_a_bad_path_flag_before_any_work(no_work, capsys, tmp_path, argv, message):
    assert f"santa eval run: error: {message}" in refusal(main, ["eval", "run", "--out", str(tmp_path / "s.jsonl"), *argv], capsys)


@pytest.fixture(scope="module")
def loaded():
    return santa.assets.load_model("smollm2-135m")


def sweep(loaded, out, path, methods, *, prompts=(0, 1), max_new_tokens=6, **kwargs):
    jobs = grid(
        models=["smollm2-135m"], tasks=["niah_single"], lengths=[256], methods=methods, budgets=[16], prompts=prompts, max_new_tokens=max_new_tokens, **kwargs
    )
    return jobs, run_sweep(jobs, out, device="cpu", progress=False, load=lambda name, device: loaded, path=path)


@pytest.mark.slow
def test_fast_records_name_the_path_each_method_ran(loaded, tmp_path):
    sweep(loaded, tmp_path / "s.jsonl", "fast", ["dense", "systematic", "prop"], prompts=[0], max_new_tokens=2)  # the interpreter is slow
    paths = {r["method"]: r["path"] for r in read_records(tmp_path / "s.jsonl")}
    assert paths == {"dense": "santa.model/sdpa", "systematic": "santa.model/reference", "prop": kernels_label()}


@pytest.mark.slow
def test_a_fast_sweep_runs_every_batch_on_the_model_it_converted_once(loaded, tmp_path):
    jobs = grid(models=["smollm2-135m"], tasks=["niah_single"], lengths=[256], methods=["dense"], budgets=[16], prompts=[0, 1],
                max_new_tokens=2)
    ran = run_sweep(jobs, tmp_path / "s.jsonl", device="cpu", progress=False, load=lambda name, device: loaded, path="fast", batch_size=1)
    records = read_records(tmp_path / "s.jsonl")
    assert ran == 2 and sorted(r["prompt"] for r in records) == [0, 1] and {r["batch"] for r in records} == {1}


@pytest.mark.slow
def test_fast_dense_answers_equal_the_hf_paths(loaded, tmp_path):
    sweep(loaded, tmp_path / "hf.jsonl", "hf", ["dense"])
    sweep(loaded, tmp_path / "fast.jsonl", "fast", ["dense"])
    answers = {path: [r["answer"] for r in read_records(tmp_path / f"{path}.jsonl")] for path in ("hf", "fast")}
    assert answers["fast"] == answers["hf"]


@pytest.mark.slow
def test_a_sweep_written_on_the_hf_path_resumes_on_the_fast_path_with_nothing_to_run(loaded, tmp_path):
    sweep(loaded, tmp_path / "s.jsonl", "hf", ["dense"])
    assert sweep(loaded, tmp_path / "s.jsonl", "fast", ["dense"])[1] == 0


@pytest.mark.slow
def test_sampled_prefill_jobs_asked_on_the_fast_path_run_on_hf_and_say_why(loaded, tmp_path):
    sweep(loaded, tmp_path / "s.jsonl", "fast", ["systematic"], prefills=["sampled"])
    records = read_records(tmp_path / "s.jsonl")
    assert {(r["path"], r["path_reason"].split(":")[0]) for r in records} == {("hf", "sampled prefill")}


@needs_cuda
@pytest.mark.slow
def test_on_cuda_prop_and_flash_run_the_kernels(tmp_path):
    cuda = santa.assets.load_model("smollm2-135m", device="cuda")
    jobs = grid(models=["smollm2-135m"], tasks=["niah_single"], lengths=[1024], methods=["prop", "flash"], budgets=[128], prompts=[0, 1], max_new_tokens=8)
    run_sweep(jobs, tmp_path / "s.jsonl", device="cuda", progress=False, load=lambda name, device: cuda, path="auto")
    assert {r["path"] for r in read_records(tmp_path / "s.jsonl")} == {"santa.model/kernels"}


def kl_sweep(loaded, out, path, methods, *, prompts=(0, 1), kl_tokens=4, budgets=(16,)):
    jobs = grid(models=["smollm2-135m"], tasks=["kl"], lengths=[256], methods=methods, budgets=list(budgets), prompts=prompts, kl_tokens=kl_tokens)
    run_sweep(jobs, out, device="cpu", progress=False, load=lambda name, device: loaded, path=path)
    return {(r["method"], r["prompt"]): r for r in read_records(out)}


@pytest.mark.slow
def test_fast_kl_is_stepwise_with_dense_exactly_zero_and_systematic_above(loaded, tmp_path):
    records = kl_sweep(loaded, tmp_path / "s.jsonl", "fast", ["dense", "systematic"])
    assert sorted(records) == [("dense", 0), ("dense", 1), ("systematic", 0), ("systematic", 1)]
    assert {(r["method"], r["path"], r["kl_mode"], r["new_tokens"], r["dtype"]) for r in records.values()} == {
        ("dense", "santa.model/sdpa", "stepwise", 3, "float32"), ("systematic", "santa.model/reference", "stepwise", 3, "float32")}
    assert all(records["dense", p]["kl"] == 0.0 and records["dense", p]["kl_per_token"] == [0.0] * 3 for p in (0, 1))
    for p in (0, 1):
        r = records["systematic", p]
        assert math.isfinite(r["kl"]) and r["kl"] > 0 and r["score"] == r["kl"] and len(r["kl_per_token"]) == 3
        assert math.isfinite(r["nll"]) and r["ppl"] == pytest.approx(math.exp(r["nll"]))


@pytest.mark.slow
def test_fast_stepwise_kl_matches_the_hf_paths_chunk_for_the_deterministic_methods(loaded, tmp_path):
    """Teacher-forcing alignment: the fast path's dense steps (santa.model, right-padded, SDPA one token
    at a time) and the HF path's dense chunk (left-padded, one forward) score the same 7 tokens, both in
    float32 on the CPU: their nll differ only by float32 rounding through 30 layers (~1e-6 measured),
    where feeding or scoring one token off would move it by O(1) nats. Top-k is deterministic and
    per-row as well, so stepwise and chunked give the same KL too."""
    fast = kl_sweep(loaded, tmp_path / "fast.jsonl", "fast", ["dense", "topk"], kl_tokens=8)
    hf = kl_sweep(loaded, tmp_path / "hf.jsonl", "hf", ["dense", "topk"], kl_tokens=8)
    assert {r["kl_mode"] for r in fast.values()} == {"stepwise"} and {r["kl_mode"] for r in hf.values()} == {"chunked"}
    for key in hf:
        assert fast[key]["nll"] == pytest.approx(hf[key]["nll"], abs=1e-4), key
        assert fast[key]["kl"] == pytest.approx(hf[key]["kl"], abs=1e-4), key
    assert all(fast["topk", p]["kl"] > 1e-3 for p in (0, 1))  # the comparison is not 0 ≈ 0


@pytest.mark.slow
def test_fast_kl_for_prop_runs_the_kernels(loaded, tmp_path):
    records = kl_sweep(loaded, tmp_path / "s.jsonl", "fast", ["prop"], prompts=[0], kl_tokens=2)  # the interpreter is slow
    (r,) = records.values()
    assert (r["path"], r["kl_mode"], r["new_tokens"]) == (kernels_label(), "stepwise", 1)
    assert math.isfinite(r["kl"]) and r["kl"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("path", ["hf", "fast"])
def test_kl_jobs_of_two_teacher_forced_lengths_in_one_batch_each_score_their_own(loaded, tmp_path, path):
    jobs = [job for kl_tokens in (4, 6) for job in grid(models=["smollm2-135m"], tasks=["kl"], lengths=[256], methods=["dense"],
                                                         budgets=[16], prompts=[0], kl_tokens=kl_tokens)]
    run_sweep(jobs, tmp_path / "s.jsonl", device="cpu", progress=False, load=lambda name, device: loaded, path=path)
    assert sorted((r["max_new_tokens"], r["new_tokens"]) for r in read_records(tmp_path / "s.jsonl")) == [(4, 3), (6, 5)]


@pytest.mark.slow
def test_fp8_cells_run_on_their_own_cache_and_score_kl_against_dense_on_the_models(loaded, tmp_path):
    """One sweep, dense and systematic on the model's cache and on fp8: answers on both, records that say
    which cache they ran on, and KL against dense on the model's cache (so fp8 dense is above 0)."""
    answers = sweep(loaded, tmp_path / "a.jsonl", "fast", ["dense"], prompts=[0], max_new_tokens=2, kv_caches=["auto", "fp8"])[0]
    assert len(answers) == 2
    assert sorted(r["kv_cache"] for r in read_records(tmp_path / "a.jsonl")) == ["auto", "fp8"]
    jobs = grid(models=["smollm2-135m"], tasks=["kl"], lengths=[256], methods=["dense", "systematic"], budgets=[16], prompts=[0],
                kl_tokens=4, kv_caches=["auto", "fp8"])
    run_sweep(jobs, tmp_path / "kl.jsonl", device="cpu", progress=False, load=lambda name, device: loaded, path="fast")
    kl = {(r["method"], r["kv_cache"]): r["kl"] for r in read_records(tmp_path / "kl.jsonl")}
    assert kl["dense", "auto"] == 0.0 and kl["dense", "fp8"] > 0.0
    assert all(math.isfinite(v) and v > 0 for key, v in kl.items() if key != ("dense", "auto"))


@pytest.mark.slow
def test_an_error_targets_fast_records_carry_the_rows_the_kernels_counted(loaded, tmp_path):
    sweep(loaded, tmp_path / "s.jsonl", "fast", ["prop"], prompts=[0], max_new_tokens=2, error_targets=[0.3])  # one step
    (record,) = read_records(tmp_path / "s.jsonl")
    assert record["v_rows_read_mode"].startswith("measured") and 0 < record["v_rows_read"] <= 1
