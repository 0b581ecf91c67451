"""santa.engine: one decode loop, one prefill, one teacher-forced scorer on santa.model, and the path rules.

The pinned token ids below were produced by the code before santa.engine existed (581559a: santa.model.generate,
santa.eval.runner.fast_prefill / fast_decode / teacher_forced, with santa.model calling the eager santa.decode())
on a tiny random model in float32 on the CPU; the same ids came out with and without TRITON_INTERPRET=1. The
engine must reproduce them: same seed, same tokens, on every method. The ids of the sampled backends (iid,
stratified, systematic, santa-prop, santa-flash) were drawn again when they moved to request-keyed draws
(issue 26: a key per sequence and layer, counter (position, head, stream) instead of a step counter and the
batch row, or a generator per layer), by the same calls on the torch fallback; systematic and santa-prop, one
estimator on the same uniforms, now draw the same ids. They were drawn again when the exactness rule became one
rule on every path (issue 44: a sequence whose live keys S covers is computed exactly, so the tiny prompts' first
steps at S = 8 are exact where they used to be sampled), by the same calls on the torch fallback.
"""

import importlib
import os

import pytest
import torch

import santa.kernels
import santa.model
from helpers import TINY_PROMPTS, TINY_STOP, needs_cuda
from santa import engine, methods
from santa.model import CONFIGS, Transformer, generate, make_context

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1" and santa.kernels.use_triton(torch.device("cpu"))
KERNEL_BACKENDS = ("santa-prop", "santa-flash")
# the kernels run in Triton's interpreter in CI (about a second a step): fewer steps there, compared with a prefix
# of the pinned ids (greedy decoding of n tokens is the first n of a longer run: draws keyed on each position)
KERNEL_TOKENS = 3 if INTERPRETED else 10

TEXTS = [[136, 49, 66, 186, 87, 160, 168, 243, 170, 173, 161, 32, 126, 237], [156, 3, 114, 115, 207, 98, 95, 185, 255, 50, 145, 240, 209, 217, 73, 187, 176, 204, 151, 114, 222, 22, 195, 190, 190, 75, 23, 56, 114, 198], [231, 237, 234, 199, 201, 210, 183, 181, 243]]
GENERATE = {  # santa.model.generate(TINY, TINY_PROMPTS, 10, backend=..., budget=8, seed=3, stop_tokens=[TINY_STOP], layer_budgets=None | {1: 4})
    'sdpa/S': [[207, 196, 74, 233, 24, 180, 18, 246, 223, 112], [112, 132, 190, 247, 251], [196, 74, 218, 249, 68, 237, 200, 20, 171, 164]],
    'iid/S': [[207, 196, 74, 233, 14, 147, 127, 175, 246, 223], [112, 132, 57, 223, 129, 59, 193, 215, 154, 232], [196, 74, 33, 38, 57, 33, 38, 223, 112, 121]],
    'iid/lb': [[207, 196, 164, 188, 196, 251], [112, 132, 57, 154, 83, 215, 14, 56, 67, 237], [196, 74, 33, 126, 74, 113, 168, 231, 42, 50]],
    'stratified/S': [[207, 196, 74, 233, 29, 223, 112, 196, 38, 44], [112, 132, 51, 172, 91, 67, 53, 109, 215, 180], [196, 74, 218, 2, 112, 111, 147, 207, 245, 146]],
    'stratified/lb': [[207, 196, 74, 233, 24, 15, 223, 20, 222, 102], [112, 132, 51, 95, 162, 51, 145, 80, 84, 104], [196, 74, 218, 2, 9, 51, 18, 36, 10, 11]],
    'systematic/S': [[207, 196, 74, 233, 196, 38, 44, 74, 188, 132], [112, 132, 190, 162, 51, 95, 45, 180, 250, 126], [196, 74, 113, 1, 228, 231, 42, 137, 195, 45]],
    'systematic/lb': [[207, 196, 38, 44, 16, 38, 44, 74, 211, 35], [112, 132, 190, 247, 141, 15, 43, 200, 241, 2], [196, 74, 113, 1, 228, 231, 42, 137, 195, 45]],
    'topk/S': [[207, 196, 74, 233, 24, 180, 18, 184, 22, 71], [112, 132, 57, 58, 45, 110, 83, 162, 6, 209], [196, 74, 121, 1, 228, 231, 42, 50, 51, 51]],
    'topk/lb': [[207, 196, 74, 233, 29, 19, 9, 42, 55, 128], [112, 132, 51, 56, 58, 34, 75, 57, 223, 215], [196, 202, 188, 160, 29, 74, 237, 200, 20, 171]],
    'santa-prop/S': [[207, 196, 74, 233, 196, 38, 44, 74, 188, 132], [112, 132, 190, 162, 51, 95, 45, 180, 250, 126], [196, 74, 113, 1, 228, 231, 42, 137, 195, 45]],
    'santa-prop/lb': [[207, 196, 38, 44, 16, 38, 44, 74, 211, 35], [112, 132, 190, 247, 141, 15, 43, 200, 241, 2], [196, 74, 113, 1, 228, 231, 42, 137, 195, 45]],
    'santa-flash/S': [[207, 196, 74, 233, 29, 191, 239, 29, 196, 164], [112, 132, 147, 23, 28, 215, 154, 83, 215, 22], [196, 108, 55, 91, 168, 193, 164, 240, 41, 62]],
    'santa-flash/lb': [[207, 196, 38, 44, 16, 181, 98, 20, 234, 44], [112, 132, 84, 46, 73, 129, 59, 5, 58, 147], [196, 74, 218, 79, 66, 64, 52, 223, 112, 111]],
    'weights-only/S': [[207, 177, 223, 223, 223, 223, 223, 223, 43, 82], [112, 87, 58, 226, 188, 221, 246, 128, 35, 108], [196, 74, 121, 171, 207, 11, 86, 14, 197, 9]],
    'weights-only/lb': [[207, 177, 223, 223, 223, 223, 223, 223, 43, 82], [112, 87, 58, 226, 188, 221, 246, 128, 35, 108], [196, 74, 121, 171, 207, 11, 86, 14, 197, 9]],
}
DECODE = {  # fast_decode(prefill of TINY_PROMPTS with room 12, 10 | 6 tokens, backend=..., budget 8 (sdpa: 0), seed 5, stops {TINY_STOP, 7} | none with layer_budgets {0: 3}; sdpa/no-stops: dense, 6 tokens, no stops)
    'sdpa': [[207, 196, 74, 233, 24, 180, 18, 246, 223, 112], [112, 132, 190, 247, 251], [196, 74, 218, 249, 68, 237, 200, 20, 171, 164]],
    'sdpa/no-stops': [[207, 196, 74, 233, 24, 180], [112, 132, 190, 247, 251, 90], [196, 74, 218, 249, 68, 237]],
    'iid': [[207, 196, 74, 233, 24, 18, 100, 18, 246, 223], [112, 132, 112, 148, 129, 184, 146, 147, 44, 16], [196, 108, 55, 223, 112, 52, 128, 137, 195, 189]],
    'iid/lb': [[207, 196, 74, 188, 10, 246], [112, 29, 49, 162, 51, 49], [196, 254, 126, 18, 36, 32]],
    'stratified': [[207, 196, 74, 233, 29, 191, 128, 247, 85, 98], [112, 132, 84, 48, 119, 109, 215, 22, 16, 231], [196, 74, 237, 198, 231, 42, 50, 121, 19, 9]],
    'stratified/lb': [[207, 196, 164, 188, 132, 84], [112, 132, 190, 202, 68, 237], [196, 74, 121, 218, 79, 38]],
    'systematic': [[207, 196, 74, 233, 221, 233, 29, 19, 9, 70], [112, 132, 84, 48, 129, 59, 116, 28, 108, 55], [196, 108, 55, 200, 79, 118, 2, 51, 152, 1]],
    'systematic/lb': [[207, 196, 108, 55, 41, 184], [112, 132, 43, 91, 174, 35], [196, 108, 23, 57, 113, 168]],
    'topk': [[207, 196, 74, 233, 24, 180, 18, 184, 22, 71], [112, 132, 57, 58, 45, 110, 83, 162, 6, 209], [196, 74, 121, 1, 228, 231, 42, 50, 51, 51]],
    'topk/lb': [[207, 196, 74, 233, 14, 120], [112, 132, 190, 58, 223, 215], [196, 108, 55, 227, 80, 84]],
    'santa-prop': [[207, 196, 74, 233, 221, 233, 29, 19, 9, 70], [112, 132, 84, 48, 129, 59, 116, 28, 108, 55], [196, 108, 55, 200, 79, 118, 2, 51, 152, 1]],
    'santa-prop/lb': [[207, 196, 108, 55, 41, 184], [112, 132, 43, 91, 174, 35], [196, 108, 23, 57, 113, 168]],
    'santa-flash': [[207, 196, 74, 233, 24, 180, 18, 246, 223, 112], [112, 132, 57, 159, 237, 80, 84, 23, 214, 193], [196, 74, 40, 250, 181, 45, 248, 157, 85, 34]],
    'santa-flash/lb': [[207, 196, 74, 233, 24, 180], [112, 148, 127, 3, 146, 147], [196, 202, 223, 112, 196, 33]],
}
TEACHER_FORCED = {  # teacher_forced(prefill of TEXTS[:-5], the last 5 tokens, backend=..., budget 8, seed 2, layer_budgets {1: 3}): nll, kl [B, 4]
    'sdpa': {'nll': [[7.446305, 6.927145, 7.327446, 8.056576], [6.870753, 4.080771, 5.584723, 7.10146], [6.065213, 6.059735, 5.744326, 5.920406]]},
    'iid': {'nll': [[7.445516, 7.000932, 7.436617, 7.074751], [5.908371, 4.367332, 6.175743, 6.704941], [6.401462, 6.509717, 5.855, 6.196519]], 'kl': [[0.099705, 0.220213, 0.151803, 0.170092], [0.140305, 0.085024, 0.10184, 0.125093], [0.032105, 0.039048, 0.140217, 0.044115]]},
    'stratified': {'nll': [[7.200118, 6.923378, 7.481618, 8.034021], [6.402582, 3.75609, 6.002077, 6.606593], [6.331542, 5.97469, 5.750695, 6.051927]], 'kl': [[0.044588, 0.041375, 0.043797, 0.183613], [0.078283, 0.124834, 0.077806, 0.066044], [0.052258, 0.017946, 0.05573, 0.01403]]},
    'systematic': {'nll': [[6.874446, 6.794028, 7.262927, 7.267117], [7.127836, 4.158265, 4.840336, 7.169822], [6.307724, 5.95568, 6.239319, 5.922791]], 'kl': [[0.048191, 0.065495, 0.024031, 0.135809], [0.084351, 0.079397, 0.052434, 0.03717], [0.021958, 0.018552, 0.042034, 0.023429]]},
    'topk': {'nll': [[7.355479, 6.609736, 7.158513, 7.68356], [7.451971, 3.856905, 5.850636, 7.17242], [6.05713, 6.041854, 5.992918, 5.948117]], 'kl': [[0.020107, 0.033587, 0.007902, 0.111471], [0.029606, 0.033065, 0.109609, 0.035095], [0.010793, 0.011117, 0.021055, 0.008376]]},
    'santa-prop': {'nll': [[6.874446, 6.794028, 7.262927, 7.267117], [7.127836, 4.158264, 4.840336, 7.169822], [6.307724, 5.95568, 6.239319, 5.922791]], 'kl': [[0.048191, 0.065495, 0.024031, 0.135809], [0.084351, 0.079396, 0.052434, 0.03717], [0.021958, 0.018552, 0.042034, 0.023429]]},
    'santa-flash': {'nll': [[7.317242, 6.971422, 7.02602, 8.148334], [6.689059, 4.378819, 5.506495, 7.076692], [6.315955, 6.029282, 6.330643, 5.788786]], 'kl': [[0.032308, 0.048323, 0.045444, 0.076665], [0.067595, 0.066595, 0.082522, 0.04414], [0.029317, 0.015957, 0.064378, 0.026772]]},
}


def cut(rows, n):
    return [row[:n] for row in rows]


@pytest.mark.parametrize("layer_budgets", [None, {1: 4}], ids=["S", "lb"])
# weights-only is santa bench e2e's now: tests/bench/test_bench_e2e.py checks its pinned tokens through the plug-in
@pytest.mark.parametrize("backend", ["sdpa", "iid", "stratified", "systematic", "topk", *KERNEL_BACKENDS])
def test_generate_draws_the_tokens_it_drew_before_the_engine(tiny_transformer, backend, layer_budgets):
    if backend in KERNEL_BACKENDS and INTERPRETED and layer_budgets is None:
        pytest.skip("one kernel case per backend under the interpreter (the layer-budget one)")
    n = KERNEL_TOKENS if backend in KERNEL_BACKENDS else 10
    if backend == "sdpa" and layer_budgets:  # dense reads every key: a schedule would be ignored, so it is refused
        with pytest.raises(ValueError, match="layer_budgets sets samples per layer for a sampling backend; backend 'sdpa'"):
            generate(tiny_transformer, TINY_PROMPTS, n, backend=backend, layer_budgets=layer_budgets)
        return
    rows = generate(tiny_transformer, TINY_PROMPTS, n, backend=backend, budget=8, seed=3, stop_tokens=[TINY_STOP], layer_budgets=layer_budgets)
    assert [r.tolist() for r in rows] == cut(GENERATE[f"{backend}/{'lb' if layer_budgets else 'S'}"], n)


@pytest.mark.parametrize("layer_budgets", [None, {0: 3}], ids=["S", "lb"])
@pytest.mark.parametrize("backend", ["sdpa", "iid", "stratified", "systematic", "topk", *KERNEL_BACKENDS])
def test_engine_decode_draws_the_tokens_fast_decode_drew(tiny_transformer, backend, layer_budgets):
    if backend in KERNEL_BACKENDS and INTERPRETED and (layer_budgets is None) == (backend == "santa-prop"):
        pytest.skip("one kernel case per backend under the interpreter")
    pre = engine.prefill(tiny_transformer, TINY_PROMPTS, 12)
    assert pre.first[:, 0].tolist() == [207, 112, 196]
    budget = 0 if backend == "sdpa" else 8  # a dense job's budget: 0
    if layer_budgets is None:
        n = KERNEL_TOKENS if backend in KERNEL_BACKENDS else 10
        rows, seconds, _ = engine.decode(tiny_transformer, pre, n, backend=backend, budget=budget, seed=5, stop_tokens={TINY_STOP, 7})
        assert rows == cut(DECODE[backend], n) and seconds >= 0
    else:
        n = min(KERNEL_TOKENS, 6) if backend in KERNEL_BACKENDS else 6
        if backend == "sdpa":  # refused: a schedule for dense, which reads every key
            with pytest.raises(ValueError, match="layer_budgets sets samples per layer for a sampling backend"):
                engine.decode(tiny_transformer, pre, n, backend=backend, budget=budget, seed=5, stop_tokens=set(),
                              layer_budgets=layer_budgets)
            return
        rows = engine.decode(tiny_transformer, pre, n, backend=backend, budget=budget, seed=5, stop_tokens=set(),
                             layer_budgets=layer_budgets).rows
        assert rows == cut(DECODE[backend + "/lb"], n)


def assert_pinned(values, pinned, steps):
    """[B, steps] float32 against the pinned values (rounded to 1e-6; the interpreter's kernels differ by ~1e-6)."""
    torch.testing.assert_close(values, torch.tensor(cut(pinned, steps)), atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["iid", "stratified", "systematic", "topk", *KERNEL_BACKENDS])
def test_teacher_forced_scores_what_it_scored_before_the_engine(tiny_transformer, backend):
    steps = 2 if backend in KERNEL_BACKENDS and INTERPRETED else 4  # the first steps of the pinned 4
    pre = engine.prefill(tiny_transformer, [t[:-5] for t in TEXTS], 5)
    continuation = torch.tensor([t[-5:] for t in TEXTS])[:, : steps + 1]  # [B, steps + 1]
    dense = engine.teacher_forced(tiny_transformer, pre, continuation, backend="sdpa")
    assert dense.kl is None and dense.logprobs.shape == (3, steps, CONFIGS["tiny"].vocab_size)
    assert_pinned(dense.nll, TEACHER_FORCED["sdpa"]["nll"], steps)
    run = engine.teacher_forced(tiny_transformer, pre, continuation, backend=backend, budget=8, seed=2, layer_budgets={1: 3},
                                reference=dense.logprobs)
    assert run.logprobs is None
    assert_pinned(run.nll, TEACHER_FORCED[backend]["nll"], steps)
    assert_pinned(run.kl, TEACHER_FORCED[backend]["kl"], steps)


def test_generate_and_the_engine_run_one_loop(tiny_transformer, monkeypatch):
    """santa.model.generate and santa.engine.decode both decode through santa.model.decode_tokens."""
    calls = []
    loop = santa.model.decode_tokens
    monkeypatch.setattr(santa.model, "decode_tokens", lambda *a, **k: calls.append(a[1].backend) or loop(*a, **k))
    generate(tiny_transformer, TINY_PROMPTS, 3, backend="topk", budget=8)
    engine.decode(tiny_transformer, engine.prefill(tiny_transformer, TINY_PROMPTS, 3), 3, backend="iid", budget=8, seed=0, stop_tokens=())
    assert calls == ["topk", "iid"]


@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_the_model_runs_its_own_decode_plans_not_the_eager_decode(tiny_transformer, backend, monkeypatch):
    """One DecodePlan per distinct budget, made (with its workspace) by make_context, outside any CUDA
    graph; santa.decode() and its module-level call cache are not used on the model path."""
    decode_module = importlib.import_module("santa.kernels.eager")

    def eager(*args, **kwargs):
        raise AssertionError("santa.model called the eager santa.kernels.decode()")

    monkeypatch.setattr(santa.kernels, "decode", eager)
    monkeypatch.setattr(decode_module, "decode", eager)
    calls_before = dict(decode_module._CALLS)
    tiny_transformer.setup_caches(3, 30)
    ctx = make_context(tiny_transformer, backend, prompt_len=[5, 23, 12], budget=8, layer_budgets={0: 3, 1: 8})
    assert sorted(ctx.plans) == [3, 8]
    assert all(isinstance(p, santa.kernels.DecodePlan) and p.budget == s and p._workspace is not None for s, p in ctx.plans.items())
    assert ctx.plan_of(0, None, None) is ctx.plans[3] and ctx.plan_of(1, None, None) is ctx.plans[8]
    generate(tiny_transformer, TINY_PROMPTS, 2, backend=backend, budget=8, layer_budgets={0: 3})
    assert dict(decode_module._CALLS) == calls_before


def test_a_context_built_by_hand_plans_on_first_use(tiny_transformer):
    tiny_transformer.setup_caches(2, 30)
    cache = tiny_transformer.layers[0].attention.kv_cache
    ctx = santa.model.DecodeContext(backend="santa-prop", seq_lens=torch.tensor([4, 9], dtype=torch.int32), budget=5)
    q = torch.randn(2, 4, 16)
    plan = ctx.plan_of(0, q, cache.k_cache)
    assert ctx.plans == {5: plan} and ctx.plan_of(1, q, cache.k_cache) is plan
    assert (plan.shape.batch, plan.shape.heads, plan.shape.kv_heads, plan.shape.n_keys) == (2, 4, 2, cache.k_cache.shape[1])


def sdpa_over_visible_keys(calls):
    def attention(q, k_cache, v_cache, ctx, layer):
        calls.append(layer)
        visible = torch.arange(k_cache.shape[1]) < ctx.seq_lens.unsqueeze(-1)  # [B, L_max]
        y = torch.nn.functional.scaled_dot_product_attention(
            q.unsqueeze(2), k_cache.transpose(1, 2), v_cache.transpose(1, 2), attn_mask=visible[:, None, None], enable_gqa=True)
        return y.squeeze(2)

    return attention


def test_a_plugged_in_attention_runs_in_every_layer_of_every_step(tiny_transformer):
    calls = []
    pre = engine.prefill(tiny_transformer, TINY_PROMPTS, 6)
    ctx = make_context(tiny_transformer, "my-sdpa", prompt_len=pre.lengths, attention=sdpa_over_visible_keys(calls))
    stops = torch.tensor([], dtype=torch.long)
    with torch.inference_mode():  # the caches were written in inference mode
        rows = santa.model.decode_tokens(tiny_transformer, ctx, pre.first, pre.lengths, 6, stop_tokens=stops, cuda_graph=False)
    assert rows == cut(DECODE["sdpa/no-stops"], 6)  # what santa's own sdpa backend decodes (6 tokens, no stops)
    assert calls == [0, 1] * 5  # 2 layers, 5 decode steps


@pytest.mark.parametrize("backend", ["weights-only", "flashinfer"])
def test_a_plugged_in_attention_wins_over_a_built_in_benchmark_backend(tiny_transformer, backend):
    calls = []
    tiny_transformer.setup_caches(3, 30)
    ctx = make_context(tiny_transformer, backend, prompt_len=[5, 23, 12], attention=sdpa_over_visible_keys(calls))
    assert not hasattr(ctx, "flashinfer")  # santa.model builds no FlashInfer wrapper (santa bench e2e does)
    token = torch.zeros(3, 1, dtype=torch.long)
    with torch.inference_mode():
        santa.model.greedy_step(tiny_transformer, ctx, token, torch.tensor([5, 23, 12]))()
    assert calls == [0, 1]


@pytest.mark.parametrize(("backend", "attention", "error", "message"), [
    ("sdpa", sdpa_over_visible_keys([]), ValueError, "not one of santa's backends"),
    ("santa-prop", sdpa_over_visible_keys([]), ValueError, "not one of santa's backends"),
    ("iid", sdpa_over_visible_keys([]), ValueError, "not one of santa's backends"),
    ("", sdpa_over_visible_keys([]), ValueError, "backend names a plugged-in attention"),
    ("mine", "sdpa", TypeError, "attention must be a callable"),
    ("mine", None, ValueError, "backend must be one of"),
])
def test_make_context_refuses_an_ambiguous_plug_in(tiny_transformer, backend, attention, error, message):
    tiny_transformer.setup_caches(1, 8)
    with pytest.raises(error, match=message):
        make_context(tiny_transformer, backend, prompt_len=4, attention=attention)


@pytest.mark.parametrize("backend", [m.model_backend for m in methods.METHODS.values()])
def test_the_cuda_graph_rule_reads_the_registry(tiny_transformer, backend):
    assert santa.model.capturable(tiny_transformer, backend) is False  # a CPU model is never captured
    method = methods.by_model_backend(backend)
    cuda = type("CudaModel", (), {"output": type("W", (), {"weight": torch.empty(0, device="meta")})()})()
    cuda.output.weight = type("T", (), {"device": torch.device("cuda")})()
    assert santa.model.capturable(cuda, backend) is method.capturable
    assert santa.model.capturable(cuda, backend, "torch") is (method.capturable and method.kernel is None)


@needs_cuda
@pytest.mark.parametrize("backend", ["sdpa", *KERNEL_BACKENDS])
def test_on_cuda_the_captured_loop_draws_the_eager_loops_tokens(backend):
    model = Transformer.random(CONFIGS["tiny"], dtype=torch.float32, seed=0, device="cuda").eval()
    eager = generate(model, TINY_PROMPTS, 12, backend=backend, budget=8, seed=3, cuda_graph=False)
    graph = generate(model, TINY_PROMPTS, 12, backend=backend, budget=8, seed=3, cuda_graph=True)
    assert [r.tolist() for r in graph] == [r.tolist() for r in eager]


# --- the path rules ----------------------------------------------------------------------------


@pytest.mark.parametrize(("sampler", "kernel", "backend"), [
    ("systematic", None, "santa-prop"), ("systematic", "flash", "santa-flash"), ("iid", None, "iid"), ("dense", None, "sdpa"),
    ("topk", None, "topk"), ("stratified", None, "stratified"),
])
def test_fast_method_runs_systematic_on_a_kernel_and_the_others_as_themselves(sampler, kernel, backend):
    assert engine.fast_method(sampler, kernel).model_backend == backend


def test_the_fast_backends_are_the_registrys():
    assert engine.FAST_BACKENDS == {m.name: m.model_backend for m in methods.METHODS.values()}
    assert engine.FAST_ONLY == methods.names(kernels=True)


@pytest.mark.parametrize(("backend", "label"), [("sdpa", "santa.model/sdpa"), ("iid", "santa.model/reference"),
                                                ("topk", "santa.model/reference")])
def test_path_label_names_what_ran(backend, label):
    assert engine.path_label(backend, "cpu") == label


@pytest.mark.parametrize("bad", [0, 13])
def test_decode_refuses_more_tokens_than_the_cache_has_room_for(tiny_transformer, bad):
    pre = engine.prefill(tiny_transformer, TINY_PROMPTS, 12)
    with pytest.raises(ValueError, match=r"max_new_tokens must be in \[1, 12\]"):
        engine.decode(tiny_transformer, pre, bad, backend="sdpa", budget=0, seed=0, stop_tokens=())


@pytest.mark.parametrize("length", [1, 7])
def test_teacher_forced_refuses_a_continuation_without_room(tiny_transformer, length):
    pre = engine.prefill(tiny_transformer, TINY_PROMPTS, 5)
    with pytest.raises(ValueError, match="continuation must be 2 to 6 tokens"):
        engine.teacher_forced(tiny_transformer, pre, torch.zeros(3, length, dtype=torch.long), backend="sdpa")


def test_the_systematic_reference_and_the_prop_kernel_draw_alike():
    """One definition of the draws: the spec sampler (santa.sampled_attention, systematic) and the prop
    kernel path take the same request-keyed uniforms, so their pinned tokens coincide."""
    for key in ("S", "lb"):
        assert GENERATE[f"systematic/{key}"] == GENERATE[f"santa-prop/{key}"]
    assert DECODE["systematic"] == DECODE["santa-prop"] and DECODE["systematic/lb"] == DECODE["santa-prop/lb"]
    for score in ("nll", "kl"):  # the same samples; the values' arithmetic differs in the last digit
        assert_pinned(torch.tensor(TEACHER_FORCED["systematic"][score]), TEACHER_FORCED["santa-prop"][score], 4)


def test_an_error_targets_reads_are_counted_by_the_kernels(tiny_transformer):
    """With a cap below the pilot (S = 8 < 16) every sampled head draws 16 + 8 rows whatever its pilot says, so the
    measured share is exact: min(24, v) of v visible rows per step once v > 8, all v rows before (covered)."""
    pre = engine.prefill(tiny_transformer, TINY_PROMPTS, 6)
    decoded = engine.decode(tiny_transformer, pre, 6, backend="santa-prop", budget=8, seed=5, stop_tokens=(), error_target=0.3)
    want = []
    for prompt in TINY_PROMPTS:
        visible = [len(prompt) + 1 + i for i in range(5)]  # 6 tokens: the prefill's and 5 decode steps
        want.append(sum(v if v <= 8 else min(24, v) for v in visible) / sum(visible))
    assert decoded.v_rows_read == pytest.approx(want) and want[1] < 1 and len(decoded.rows[0]) == 6
    assert engine.decode(tiny_transformer, pre, 6, backend="santa-prop", budget=8, seed=5, stop_tokens=()).v_rows_read is None


def test_decode_times_its_steps_at_the_pace_of_those_after_the_first(tiny_transformer, monkeypatch):
    """Step 1 captures the CUDA graph (a warm-up call cannot keep that out: the graph belongs to the call's buffers), so
    the clock starts once it has run and the steps run are charged at the later steps' pace: a fake clock where step 1
    takes 10 s and steps 2–4 one second each gives 4 s for the 4 steps; one step alone is timed whole."""
    pre = engine.prefill(tiny_transformer, TINY_PROMPTS, 12)
    now = {"t": 0.0}
    monkeypatch.setattr(engine.time, "perf_counter", lambda: now["t"])

    def fake_loop(steps):
        def loop(*args, on_step, **kwargs):
            for i in range(1, steps + 1):
                now["t"] += 10.0 if i == 1 else 1.0
                on_step(i)
            return [[1]] * len(TINY_PROMPTS)
        return loop

    monkeypatch.setattr(engine.santa.model, "decode_tokens", fake_loop(4))
    assert engine.decode(tiny_transformer, pre, 5, backend="sdpa", budget=0, seed=0, stop_tokens=set()).seconds == 4.0
    now["t"] = 0.0
    monkeypatch.setattr(engine.santa.model, "decode_tokens", fake_loop(1))
    assert engine.decode(tiny_transformer, pre, 2, backend="sdpa", budget=0, seed=0, stop_tokens=set()).seconds == 10.0


def test_the_decode_loop_calls_its_step_hook_once_per_step_it_runs(tiny_transformer):
    """engine.decode's clock rests on decode_tokens calling on_step(i) after each step i it runs: 1 … n − 1 for n
    tokens (the first comes from the prefill)."""
    pre = engine.prefill(tiny_transformer, TINY_PROMPTS, 12)
    ctx = engine.decode_context(tiny_transformer, pre, "sdpa", 0, 0, None)
    steps = []
    with torch.inference_mode():  # as engine.decode runs it
        santa.model.decode_tokens(tiny_transformer, ctx, pre.first, pre.lengths, 5,
                                  stop_tokens=torch.tensor([], dtype=torch.long), cuda_graph=False, on_step=steps.append)
    assert steps == [1, 2, 3, 4]
