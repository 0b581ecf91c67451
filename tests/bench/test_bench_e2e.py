"""santa bench e2e's own attentions (benchmarks/bench/e2e.py): ``flashinfer`` and ``weights-only`` are
plugged into santa.model's decode step with ``make_context(attention=...)``; santa.model keeps no
benchmark backend and refuses their names, saying where they went. Tiny random model, CPU."""

import sys
import types

import pytest
import torch
from benchmarks.bench import e2e

import santa.model
from helpers import TINY_PROMPTS, TINY_STOP
from santa.model import CONFIGS, decode_tokens, generate, make_context, pad_prompts, prefill

# santa.model.generate(tiny_transformer, TINY_PROMPTS, 10, backend="weights-only", budget=8, seed=3, stop_tokens=[TINY_STOP]), as
# santa.model drew them while weights-only was built in (tests/model/test_engine.py pinned them at 581559a)
WEIGHTS_ONLY = [[207, 177, 223, 223, 223, 223, 223, 223, 43, 82], [112, 87, 58, 226, 188, 221, 246, 128, 35, 108], [196, 74, 121, 171, 207, 11, 86, 14, 197, 9]]


@torch.inference_mode()
def generate_plugged(model, prompts, max_new_tokens, backend, *, stop_tokens=(), **kwargs):
    """santa.model.generate's steps (pad, caches, context, prefill, the greedy loop) with the benchmark's
    attention for ``backend`` plugged in; returns the new tokens of each prompt."""
    padded, lengths = pad_prompts(prompts, vocab_size=model.args.vocab_size)
    model.setup_caches(padded.shape[0], padded.shape[1] + max_new_tokens)
    attention, _ = e2e.plugged_attention(model, backend, budget=kwargs.get("budget", 128))
    ctx = make_context(model, backend, prompt_len=lengths, attention=attention, **kwargs)
    token = prefill(model, padded, lengths=lengths)
    return decode_tokens(model, ctx, token, lengths, max_new_tokens, stop_tokens=torch.tensor(list(stop_tokens), dtype=torch.long),
                         cuda_graph=False)


@pytest.mark.parametrize("layer_budgets", [None, {1: 4}], ids=["S", "lb"])
def test_the_benchmarks_weights_only_draws_the_tokens_santa_model_drew(tiny_transformer, layer_budgets):
    rows = generate_plugged(tiny_transformer, TINY_PROMPTS, 10, "weights-only", stop_tokens=[TINY_STOP], budget=8, seed=3, layer_budgets=layer_budgets)
    assert rows == WEIGHTS_ONLY


def test_weights_only_backend_differs_from_dense(tiny_transformer):
    prompt = torch.randint(0, CONFIGS["tiny"].vocab_size, (1, 12), generator=torch.Generator().manual_seed(6))
    tokens = generate_plugged(tiny_transformer, prompt, 3, "weights-only")[0]
    assert len(tokens) == 3 and tokens != generate(tiny_transformer, prompt, 3)[0].tolist()


def test_the_e2e_backends_are_santa_models_and_the_benchmarks_own():
    assert set(e2e.BACKENDS) == set(santa.model.BACKENDS) | set(e2e.PLUGGED)
    assert not set(e2e.PLUGGED) & set(santa.model.BACKENDS + santa.model.REFERENCE_BACKENDS)
    assert set(e2e.PLUGGED) == set(santa.model.MOVED_TO_BENCHMARKS)


@pytest.mark.parametrize("backend", santa.model.BACKENDS)
def test_santa_models_own_backends_plug_nothing_in(tiny_transformer, backend):
    assert e2e.plugged_attention(tiny_transformer, backend) == (None, None)


@pytest.mark.parametrize("backend", ["flashinfer", "weights-only"])
@pytest.mark.parametrize("call", ["make_context", "generate"])
def test_santa_model_refuses_a_benchmark_backend_naming_santa_bench_e2e(tiny_transformer, backend, call):
    tiny_transformer.setup_caches(1, 16)
    cache = tiny_transformer.layers[0].attention.kv_cache
    with pytest.raises(ValueError, match=f"backend '{backend}' is not santa.model's: .*santa bench e2e"):
        if call == "make_context":
            make_context(tiny_transformer, backend, prompt_len=4)
        else:
            generate(tiny_transformer, [[1, 2, 3]], 2, backend=backend)
    assert tiny_transformer.layers[0].attention.kv_cache is cache  # refused before any work: the caches were not rebuilt


class FakeFlashInfer:
    """Stands in for flashinfer's ``BatchDecodeWithPagedKVCacheWrapper`` on the CPU: ``plan`` records the
    pages of each sequence, ``run`` gathers them and runs exact attention (float32) over the planned keys."""

    def __init__(self, workspace, **buffers):
        self.plans = []

    def plan(self, indptr, indices, last, n_head, n_kv_head, head_dim, page_size, *, q_data_type, kv_data_type):
        pages_per_seq = int(indptr[1] - indptr[0])
        self.plans.append((pages_per_seq - 1) * page_size + int(last[0]))
        self.pages = indices.view(len(indptr) - 1, pages_per_seq)  # [B, pages]

    def run(self, q, kv):
        k_pages, v_pages = kv  # [pages, P, H_kv, d]
        batch, n = q.shape[0], self.plans[-1]
        k = k_pages[self.pages].reshape(batch, -1, *k_pages.shape[2:])[:, :n].transpose(1, 2)  # [B, H_kv, n, d]
        v = v_pages[self.pages].reshape(batch, -1, *v_pages.shape[2:])[:, :n].transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2)


def test_the_plugged_flashinfer_reads_santa_models_cache_as_pages_planned_per_step(tiny_transformer, monkeypatch):
    """The flashinfer backend as bench e2e runs it (plan on the host, then the plugged step) decodes the
    tokens of santa.model's sdpa backend; each step is planned with the keys it may see."""
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=FakeFlashInfer))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)  # no accelerator here
    prompt, steps = 18, 4  # 19…22 visible keys: two pages of 16 throughout (no host sync between steps)
    tokens = torch.randint(0, CONFIGS["tiny"].vocab_size, (2, prompt), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        tiny_transformer.setup_caches(2, prompt + steps + 1)
        attention, flashinfer = e2e.plugged_attention(tiny_transformer, "flashinfer")
        assert isinstance(flashinfer, e2e.FlashInferDecode) and attention == flashinfer.attention
        ctx = make_context(tiny_transformer, "flashinfer", prompt_len=prompt, attention=attention)
        token, input_pos = prefill(tiny_transformer, tokens), torch.tensor([prompt])
        step = santa.model.greedy_step(tiny_transformer, ctx, token, input_pos)
        drawn = []
        for i in range(steps):
            flashinfer.plan(prompt + i + 1)  # as e2e.run_backend plans before every step
            step()
            drawn.append(token[:, 0].tolist())
    assert flashinfer.wrapper.plans == [prompt + 1 + i for i in range(steps)]
    dense = generate(tiny_transformer, tokens, steps + 1, backend="sdpa")
    assert [list(row) for row in zip(*drawn, strict=True)] == [row[1:].tolist() for row in dense]


def test_e2e_runs_santas_two_launch_prop_only_when_asked():
    assert "santa-prop-2launch" not in e2e.parse_args(["--device", "cpu", "--config", "tiny", "--batches", "1", "--prompts", "8"]).backends


def test_the_plugged_two_launch_prop_draws_the_tokens_of_santa_models_prop(tiny_transformer):
    """santa-prop-2launch is santa.model's santa-prop step on a plan that never takes the one-launch kernel: off Hopper
    (here, the CPU) the two are the same computation, so they decode the same tokens."""
    prompt = torch.randint(0, CONFIGS["tiny"].vocab_size, (2, 12), generator=torch.Generator().manual_seed(8))
    plugged = generate_plugged(tiny_transformer, prompt, 4, "santa-prop-2launch", budget=8, seed=3)
    built_in = generate(tiny_transformer, prompt, 4, backend="santa-prop", budget=8, seed=3)
    assert [[int(t) for t in row] for row in plugged] == [[int(t) for t in row] for row in built_in]


def test_the_bytes_model_follows_the_kernel_a_row_ran():
    """santa-prop on the one-launch kernel writes no stash; on the Triton prop (santa-prop-2launch, or santa-prop off
    Hopper or on fp8) it does, so the same row shape has a lower s_kv there."""
    assert e2e.row_kernel({"backend": "santa-prop", "impl": "cuda one-launch C8s"}) == "prop one launch"
    assert e2e.row_kernel({"backend": "santa-prop", "impl": "triton"}) == "prop"
    assert e2e.row_kernel({"backend": "santa-prop-2launch", "impl": "triton"}) == "prop"
    assert e2e.row_kernel({"backend": "santa-flash", "impl": "triton"}) == "flash"
    one, two = (e2e.kv_speedup_from_bytes(kernel, 30000, 128, 4, 128, 2) for kernel in ("prop one launch", "prop"))
    assert one == 2 * 30000 * 128 * 2 / (30000 * 128 * 2 + 4 * 128 * 128 * 2)
    assert two < one
