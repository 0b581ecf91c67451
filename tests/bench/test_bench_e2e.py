"""santa bench e2e's own attentions (benchmarks/bench/e2e.py): ``flashinfer`` and ``weights-only`` are
plugged into santa.model's decode step with ``make_context(attention=...)``; santa.model keeps no
benchmark backend and refuses their names, saying where they went. Tiny random model, CPU."""

import sys
import types

import pytest
import torch
from benchmarks.bench import e2e

import santa.model
from santa.model import CONFIGS, Transformer, decode_tokens, generate, make_context, pad_prompts, prefill

# santa.model.generate(tiny, PROMPTS, 10, backend="weights-only", budget=8, seed=3, stop_tokens=[STOP]), as
# santa.model drew them while weights-only was built in (tests/test_engine.py pinned them at 581559a)
PROMPTS = [[122, 174, 183, 197, 129], [104, 87, 200, 50, 137, 58, 252, 103, 109, 94, 55, 183, 57, 104, 164, 178, 44, 38, 126, 234, 52, 131, 0], [183, 21, 149, 201, 166, 253, 230, 56, 194, 174, 117, 30]]
STOP = 251
WEIGHTS_ONLY = [[207, 177, 223, 223, 223, 223, 223, 223, 43, 82], [112, 87, 58, 226, 188, 221, 246, 128, 35, 108], [196, 74, 121, 171, 207, 11, 86, 14, 197, 9]]


@pytest.fixture(scope="module")
def tiny():
    return Transformer.random(CONFIGS["tiny"], dtype=torch.float32, seed=0).eval()


@torch.inference_mode()
def generate_plugged(model, prompts, max_new_tokens, backend, *, stop_tokens=(), **kwargs):
    """santa.model.generate's steps (pad, caches, context, prefill, the greedy loop) with the benchmark's
    attention for ``backend`` plugged in; returns the new tokens of each prompt."""
    padded, lengths = pad_prompts(prompts, vocab_size=model.args.vocab_size)
    model.setup_caches(padded.shape[0], padded.shape[1] + max_new_tokens)
    attention, _ = e2e.plugged_attention(model, backend)
    ctx = make_context(model, backend, prompt_len=lengths, attention=attention, **kwargs)
    token = prefill(model, padded, lengths=lengths)
    return decode_tokens(model, ctx, token, lengths, max_new_tokens, stop_tokens=torch.tensor(list(stop_tokens), dtype=torch.long),
                         cuda_graph=False)


@pytest.mark.parametrize("layer_budgets", [None, {1: 4}], ids=["S", "lb"])
def test_the_benchmarks_weights_only_draws_the_tokens_santa_model_drew(tiny, layer_budgets):
    rows = generate_plugged(tiny, PROMPTS, 10, "weights-only", stop_tokens=[STOP], budget=8, seed=3, layer_budgets=layer_budgets)
    assert rows == WEIGHTS_ONLY


def test_weights_only_backend_differs_from_dense(tiny):
    prompt = torch.randint(0, CONFIGS["tiny"].vocab_size, (1, 12), generator=torch.Generator().manual_seed(6))
    tokens = generate_plugged(tiny, prompt, 3, "weights-only")[0]
    assert len(tokens) == 3 and tokens != generate(tiny, prompt, 3)[0].tolist()


def test_the_e2e_backends_are_santa_models_and_the_benchmarks_own():
    assert set(e2e.BACKENDS) == set(santa.model.BACKENDS) | set(e2e.PLUGGED)
    assert not set(e2e.PLUGGED) & set(santa.model.BACKENDS + santa.model.REFERENCE_BACKENDS)
    assert set(e2e.PLUGGED) == set(santa.model.MOVED_TO_BENCHMARKS)


@pytest.mark.parametrize("backend", santa.model.BACKENDS)
def test_santa_models_own_backends_plug_nothing_in(tiny, backend):
    assert e2e.plugged_attention(tiny, backend) == (None, None)


@pytest.mark.parametrize("backend", ["flashinfer", "weights-only"])
@pytest.mark.parametrize("call", ["make_context", "generate"])
def test_santa_model_refuses_a_benchmark_backend_naming_santa_bench_e2e(tiny, backend, call):
    tiny.setup_caches(1, 16)
    cache = tiny.layers[0].attention.kv_cache
    with pytest.raises(ValueError, match=f"backend '{backend}' is not santa.model's: .*santa bench e2e"):
        if call == "make_context":
            make_context(tiny, backend, prompt_len=4)
        else:
            generate(tiny, [[1, 2, 3]], 2, backend=backend)
    assert tiny.layers[0].attention.kv_cache is cache  # refused before any work: the caches were not rebuilt


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


def test_the_plugged_flashinfer_reads_santa_models_cache_as_pages_planned_per_step(tiny, monkeypatch):
    """The flashinfer backend as bench e2e runs it (plan on the host, then the plugged step) decodes the
    tokens of santa.model's sdpa backend; each step is planned with the keys it may see."""
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=FakeFlashInfer))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)  # no accelerator here
    prompt, steps = 18, 4  # 19…22 visible keys: two pages of 16 throughout (no host sync between steps)
    tokens = torch.randint(0, CONFIGS["tiny"].vocab_size, (2, prompt), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        tiny.setup_caches(2, prompt + steps + 1)
        attention, flashinfer = e2e.plugged_attention(tiny, "flashinfer")
        assert isinstance(flashinfer, e2e.FlashInferDecode) and attention == flashinfer.attention
        ctx = make_context(tiny, "flashinfer", prompt_len=prompt, attention=attention)
        token, input_pos = prefill(tiny, tokens), torch.tensor([prompt])
        step = santa.model.greedy_step(tiny, ctx, token, input_pos)
        drawn = []
        for i in range(steps):
            flashinfer.plan(prompt + i + 1)  # as e2e.run_backend plans before every step
            step()
            drawn.append(token[:, 0].tolist())
    assert flashinfer.wrapper.plans == [prompt + 1 + i for i in range(steps)]
    dense = generate(tiny, tokens, steps + 1, backend="sdpa")
    assert [list(row) for row in zip(*drawn, strict=True)] == [row[1:].tolist() for row in dense]
