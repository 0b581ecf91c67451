"""``santa generate`` on the fast path (santa.model): its flags, checked before any work, and its
answers beside the HF path's."""

import pytest
import torch

import santa.assets
import santa.generate
from helpers import needs_cuda, refusal
from santa.cli import main
from santa.generate import check_path_arguments


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--path", "fast", "--prefill", "sampled"], "--prefill sampled runs on the HF path only"),
        (["--kernel", "flash", "--sampler", "topk"], "--kernel picks santa's kernel for --sampler systematic, not for --sampler topk"),
        (["--batch", "2", "--prompt", "hi"], "--batch builds needle prompts of different seeds; it does not apply with --prompt"),
        (["--batch", "0"], "argument --batch: expected an integer ≥ 1, got 0"),
        (["--kernel", "fast"], "argument --kernel: invalid choice: 'fast'"),
        (["--path", "gpu"], "argument --path: invalid choice: 'gpu'"),
        (["--device", "tpu"], "argument --device: expected cpu, cuda or cuda:N, got 'tpu'"),
    ],
)
def test_generate_refuses_a_bad_path_flag_before_loading_the_model(no_work, capsys, argv, message):
    assert f"santa generate: error: {message}" in refusal(main, ["generate", *argv], capsys)


def test_device_auto_without_cuda_runs_the_hf_path_on_cpu(no_work, monkeypatch, generate_run_arguments):
    seen = generate_run_arguments
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["generate"]) == 1
    assert (seen["device"], seen["path"], seen["batch"], seen["kernel"]) == ("cpu", "hf", 1, None)


def test_explicit_fast_path_on_cpu_reaches_run(no_work, generate_run_arguments):
    seen = generate_run_arguments
    assert main(["generate", "--device", "cpu", "--path", "fast", "--batch", "3", "--kernel", "flash"]) == 1
    assert (seen["device"], seen["path"], seen["batch"], seen["kernel"]) == ("cpu", "fast", 3, "flash")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": "gpu"}, "path must be one of"),
        ({"batch": 0}, "batch must be an int ≥ 1, got 0"),
        ({"kernel": "fast"}, "kernel must be one of"),
        ({"kernel": "prop", "sampler": "iid"}, "kernel picks santa's kernel for sampler 'systematic'"),
        ({"path": "fast", "prefill": "sampled"}, "prefill 'sampled' runs on the HF path only"),
        ({"batch": 2, "prompt_text": "hi"}, "batch > 1 builds needle prompts"),
    ],
)
def test_run_checks_the_path_arguments_before_loading_the_model(kwargs, message):
    arguments = {"path": "hf", "batch": 1, "kernel": None, "sampler": "systematic", "prefill": "dense", "prompt_text": None} | kwargs
    with pytest.raises(ValueError, match=message):
        check_path_arguments(**arguments)


@pytest.mark.slow
def test_fast_dense_answers_equal_the_hf_paths_answers_on_smollm2():
    common = {"n_tokens": 256, "max_new_tokens": 12, "sampler": "dense", "device": "cpu", "batch": 2}
    _, hf = santa.generate.run(path="hf", **common)
    _, fast = santa.generate.run(path="fast", **common)
    assert [a.text for a in fast] == [a.text for a in hf]


@pytest.mark.slow
def test_fast_batch_answers_every_prompt_with_both_methods_and_names_the_path():
    prompts, answers = santa.generate.run(path="fast", n_tokens=256, max_new_tokens=4, budget=16, sampler="iid", device="cpu", batch=2)
    assert len({p.n_tokens for p in prompts}) == 2  # different lengths in one batch
    assert [(a.method, a.prompt) for a in answers] == [("dense (sdpa)", 0), ("dense (sdpa)", 1), ("iid S=16", 0), ("iid S=16", 1)]
    assert {a.path for a in answers} == {"santa.model/sdpa", "santa.model/reference"}


@pytest.mark.slow
def test_fast_share_read_is_s_over_n_capped_at_one():
    prompts, answers = santa.generate.run(path="fast", n_tokens=256, max_new_tokens=3, budget=100000, sampler="topk", device="cpu")
    sampled = [a for a in answers if a.method.startswith("topk")]
    assert sampled[0].share_per_head == 1.0


@needs_cuda
@pytest.mark.slow
def test_generate_on_cuda_runs_the_kernels_and_finds_the_needle_as_dense_does():
    _, answers = santa.generate.run(path="fast", n_tokens=1024, max_new_tokens=16, budget=128, device="cuda", batch=2)
    dense, santa_answers = answers[:2], answers[2:]
    assert {a.path for a in santa_answers} == {"santa.model/kernels"}
    assert [a.found for a in santa_answers] == [a.found for a in dense]
