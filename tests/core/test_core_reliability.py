"""Issue 22 (core API): decode plans on the CPU, the kernels' budget on the torch fallback, and one
convention for integer arguments across the public functions.

- A CPU plan runs what santa.decode runs for CPU tensors (the kernels under TRITON_INTERPRET=1, the
  torch fallback otherwise); an unsupported or absent device is a ValueError at plan time.
- The torch fallback takes every budget the kernels take (MAX_BUDGET per head): it draws a block of
  rows at a time, with the counts of one call.
- Every integer argument takes a numpy int with the result of the Python int; a float, a bool or a
  string is a TypeError naming the argument.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch

import santa
from helpers import CUDA, KERNELS, kernel_reference, make_inputs, qkv, random_probs
from santa import sampling
from santa.kernels import (
    Tuning,
    decode,
    flash_reference,
    make_workspace,
    philox_uniforms,
    plan_decode,
    prop_reference,
    workspace_bytes,
)
from santa.kernels.plan import kernels_on_cpu
from santa.kernels.reference import systematic_counts


def cpu_plan(q, k, budget, kernel, **kw):
    batch, heads, dim = q.shape
    return plan_decode(batch=batch, heads=heads, kv_heads=k.shape[2], head_dim=dim, n_keys=k.shape[1], budget=budget,
                       dtype=q.dtype, device="cpu", kernel=kernel, **kw)


# ---- item 1: plans on the CPU, and devices a plan cannot run on -----------------------------------


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("budget, n_keys, seq_lens", [(8, 40, None), (64, 40, [40, 17]), (3, 200, [1, 0])])
def test_a_cpu_plan_runs_the_torch_fallback_as_decode_does(torch_fallback, kernel, budget, n_keys, seq_lens):
    """A CPU plan used to fail inside Triton ("0 active drivers") without TRITON_INTERPRET."""
    q, k, v = make_inputs(n_keys=n_keys, seed=budget, device="cpu")
    lens = None if seq_lens is None else torch.tensor(seq_lens, dtype=torch.int32)
    plan = cpu_plan(q, k, budget, kernel)
    counts = torch.zeros(q.shape[0], q.shape[1], n_keys, dtype=torch.int32)
    out = torch.empty_like(q)
    got = plan.run(q, k, v, seq_lens=lens, seed=5, offset=2, out=out, counts=counts)
    assert got is out
    want, want_counts = decode(q, k, v, budget, kernel=kernel, seq_lens=lens, seed=5, offset=2, return_counts=True)
    assert torch.equal(out, want) and torch.equal(counts, want_counts)
    ref_out, ref_counts = kernel_reference(kernel, q, k, v, budget, seq_lens=lens, seed=5, offset=2)
    assert torch.equal(out, ref_out) and torch.equal(counts, ref_counts.to(torch.int32))
    assert torch.equal(plan.run(q, k, v, seq_lens=lens, seed=5, offset=torch.tensor([2])), want)  # offset as a tensor


def test_a_paged_cpu_plan_runs_and_checks_its_tables(torch_fallback):
    q, k, v = make_inputs(batch=2, n_keys=32, device="cpu")
    pages_k, pages_v = k.reshape(8, 8, 2, 16), v.reshape(8, 8, 2, 16)  # 4 pages of 8 keys per sequence
    table = torch.arange(8, dtype=torch.int32).reshape(2, 4)
    lens = torch.tensor([32, 20], dtype=torch.int32)
    plan = plan_decode(batch=2, heads=4, kv_heads=2, head_dim=16, n_keys=32, budget=12, dtype=q.dtype, device="cpu",
                       page_size=8)
    got = plan.run(q, pages_k, pages_v, seq_lens=lens, block_table=table, seed=1)
    assert torch.equal(got, decode(q, pages_k, pages_v, 12, seq_lens=lens, block_table=table, seed=1))
    assert torch.equal(got, decode(q, k, v, 12, seq_lens=lens, seed=1))  # the same keys, contiguous
    with pytest.raises(ValueError, match=r"block_table\[1, 2\] = -1"):
        plan.run(q, pages_k, pages_v, seq_lens=lens, block_table=torch.tensor([[0, 1, 2, 3], [4, 5, -1, -1]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 33"):
        plan.run(q, pages_k, pages_v, seq_lens=torch.tensor([33, 1], dtype=torch.int32), block_table=table)
    with pytest.raises(ValueError, match="stages"):
        plan.stages(q, pages_k, pages_v, seq_lens=lens, block_table=table)


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_cpu_plan_under_the_interpreter_runs_what_decode_runs(monkeypatch, kernel):
    """Under TRITON_INTERPRET=1 a CPU plan and santa.decode take one path (the interpreted kernels where
    they can be, else the fallback): the same output, close to the reference."""
    if importlib.util.find_spec("triton") is None:  # (no import here: triton reads TRITON_INTERPRET when imported)
        pytest.skip("needs triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = make_inputs(batch=1, heads=2, kv_heads=1, n_keys=48, seed=3, device="cpu")
    plan = cpu_plan(q, k, 16, kernel)
    got = plan.run(q, k, v, seed=4)
    assert torch.equal(got, decode(q, k, v, 16, kernel=kernel, seed=4))
    torch.testing.assert_close(got, kernel_reference(kernel, q, k, v, 16, seed=4)[0], rtol=1e-4, atol=1e-4)


def test_decode_on_the_cpu_with_triton_interpret_set_after_the_kernels_were_defined_for_the_gpu():
    """Triton reads TRITON_INTERPRET when it defines a kernel: set afterwards, CPU calls used to reach
    the GPU launcher ("0 active drivers"); they now run the torch fallback, for decode and a CPU plan."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("needs triton")
    script = """
import os
import torch
os.environ.pop("TRITON_INTERPRET", None)
import santa.kernels._common, santa.kernels.prop, santa.kernels.flash  # defined for the GPU
from santa.kernels import decode, plan_decode
from santa.kernels.plan import kernels_on_cpu
os.environ["TRITON_INTERPRET"] = "1"
assert not kernels_on_cpu()
q, k = torch.randn(1, 2, 16), torch.randn(1, 32, 1, 16)
for kernel in ("prop", "flash"):
    out = decode(q, k, k, 8, kernel=kernel, seed=1)
    plan = plan_decode(batch=1, heads=2, kv_heads=1, head_dim=16, n_keys=32, budget=8, dtype=q.dtype, device="cpu", kernel=kernel)
    assert torch.equal(plan.run(q, k, k, seed=1), out)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_kernels_on_cpu_follows_the_variable_and_the_defined_kernels(monkeypatch):
    class Defined:  # stands for a module whose jit functions Triton defined for the GPU
        tile_scores = max = type("JITFunction", (), {})()

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not kernels_on_cpu()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for module in ("triton.language.standard", "santa.kernels._common"):
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, module, Defined)
            assert not kernels_on_cpu()


ABSENT_CUDA = [] if CUDA else ["cuda", "cuda:0", "cuda:7", torch.device("cuda", 1)]


@pytest.mark.parametrize("device", ["meta", "mps", "xla", "foo", "cuda:99", *ABSENT_CUDA])
def test_plan_decode_refuses_a_device_it_cannot_run_on(device):
    """cuda without CUDA used to raise AssertionError, meta/mps were accepted and failed in run."""
    with pytest.raises(ValueError, match=r"device"):
        plan_decode(batch=1, heads=2, kv_heads=1, head_dim=16, n_keys=32, budget=8, dtype=torch.float32, device=device)


@pytest.mark.parametrize("device", [0, None, 1.5, ["cpu"]])
def test_plan_decode_refuses_a_device_of_the_wrong_type(device):
    with pytest.raises(TypeError, match=r"device must be a str or torch.device"):
        plan_decode(batch=1, heads=2, kv_heads=1, head_dim=16, n_keys=32, budget=8, dtype=torch.float32, device=device)


@pytest.mark.parametrize("device", ["cpu", "cpu:0", torch.device("cpu"), *(["cuda", torch.device("cuda", 0)] if CUDA else [])])
def test_plan_decode_takes_a_device_it_can_run_on(device):
    q, k, _ = make_inputs(batch=1, heads=2, kv_heads=1, n_keys=32, device="cpu")
    workspace = make_workspace(q.to(torch.device(device)), k.to(torch.device(device)), 8)
    plan = plan_decode(batch=1, heads=2, kv_heads=1, head_dim=16, n_keys=32, budget=8, dtype=torch.float32, device=device,
                       workspace=workspace)
    assert plan.workspace is workspace


@pytest.mark.parametrize("kernel", KERNELS)
def test_decode_refuses_tensors_on_a_device_it_does_not_support(kernel):
    """meta tensors used to reach the fallback and fail there (``Tensor.item() cannot be called``)."""
    q, k, v = (x.to("meta") for x in make_inputs(device="cpu"))
    with pytest.raises(ValueError, match=r"CPU or a CUDA device, got meta"):
        decode(q, k, v, 8, kernel=kernel)
    with pytest.raises(ValueError, match=r"device"):
        make_workspace(q, k, 8, kernel=kernel)


# ---- item 2: the kernels' budget on the torch fallback -------------------------------------------


@pytest.mark.parametrize("shape, budget, max_draws", [
    ((3, 4, 7), 50, 64), ((2, 5, 3), 1000, 1), ((12, 9), 9, 20), ((4, 2, 30), 31, 10**6), ((1, 1, 2), 7, 6),
])
def test_systematic_counts_in_row_blocks_equal_one_call(shape, budget, max_draws):
    g = torch.Generator().manual_seed(budget)
    probs = torch.softmax(torch.randn(shape, generator=g, dtype=torch.float64) * 3, dim=-1)
    probs[..., -1, :] = 0.0  # an empty row
    uniforms = torch.rand(shape[:-1], generator=g, dtype=torch.float64)
    got = systematic_counts(probs, budget, uniforms, max_draws=max_draws)
    assert torch.equal(got, santa.sample_counts(probs, budget, "systematic", uniforms=uniforms))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("heads, budget", [(4, 96), (8, 64), (2, 300)])
def test_the_torch_fallback_takes_budgets_whose_draws_pass_max_draws(torch_fallback, monkeypatch, kernel, heads, budget):
    """The kernels take S ≤ MAX_BUDGET per head; the fallback used to refuse B·H·S > MAX_DRAWS (e.g.
    128 heads × 2**20). Shown here with MAX_DRAWS lowered (the documented knob): the counts are the
    ones drawn in a single call."""
    q, k, v = make_inputs(batch=2, heads=heads, kv_heads=2, n_keys=budget + 40, seed=heads, device="cpu")  # keys > S: sampled
    want, want_counts = decode(q, k, v, budget, kernel=kernel, seed=3, return_counts=True)
    monkeypatch.setattr(sampling, "MAX_DRAWS", budget + 1)  # one row per call: more than one row refused
    got, counts = decode(q, k, v, budget, kernel=kernel, seed=3, return_counts=True)
    assert torch.equal(counts, want_counts) and torch.equal(got, want)
    if kernel == "prop":
        assert (counts.sum(-1) == budget).all()
    assert torch.equal(cpu_plan(q, k, budget, kernel).run(q, k, v, seed=3), want)


# ---- item 3: integer arguments ---------------------------------------------------------------------


def _gen():
    return torch.Generator().manual_seed(0)


def _sampled_attention(**kw):
    q, k, v = qkv(b=1, hq=4, lq=3, lk=12, d=8, seed=1)
    args = dict(budget=6, score_samples=None) | kw
    return santa.sampled_attention(q, k, v, args.pop("budget"), enable_gqa=True, generator=_gen(), **args)


def _decode(**kw):
    q, k, v = make_inputs(batch=1, heads=2, kv_heads=1, n_keys=20, device="cpu")
    args = dict(budget=8, seed=1, offset=2) | kw
    return decode(q, k, v, args.pop("budget"), **args)


def _plan(**kw):
    args = dict(batch=1, heads=2, kv_heads=1, head_dim=16, n_keys=32, budget=8, dtype=torch.float32, device="cpu") | kw
    plan = plan_decode(**args)
    return plan.shape, plan.budget, plan.workspace_key, plan.tuning


def _plan_run(**kw):
    q, k, v = make_inputs(batch=1, heads=2, kv_heads=1, n_keys=20, device="cpu")
    return cpu_plan(q, k, 8, "prop").run(q, k, v, **(dict(seed=1, offset=2) | kw))


def _make_workspace(budget):
    q, k, _ = make_inputs(batch=1, heads=2, kv_heads=1, n_keys=20, device="cpu")
    return make_workspace(q, k, budget).key


def _workspace_bytes(**kw):
    return workspace_bytes(**(dict(batch=1, heads=2, dim=16, n_keys=32, budget=8) | kw))


def _reference(kernel, **kw):
    q, k, v = make_inputs(batch=1, heads=2, kv_heads=1, n_keys=20, device="cpu")
    args = dict(budget=8, seed=1, offset=2) | kw
    if kernel == "prop":
        return prop_reference(q, k, v, args.pop("budget"), **args)
    return flash_reference(q, k, v, args.pop("budget"), **(dict(tile=16) | args))


def _bernoulli(**kw):
    q = qkv(b=1, hq=4, lq=3, lk=12, d=8, seed=1)[0]
    args = dict(samples=4, kv_heads=2) | kw
    return santa.bernoulli_query(q, args.pop("samples"), generator=_gen(), **args).query


# (id, the argument's valid int value, a call taking the value)
INTEGER_ARGUMENTS = [
    ("sampled_attention.budget", 6, lambda x: _sampled_attention(budget=x)),
    ("sampled_attention.score_samples", 3, lambda x: _sampled_attention(score_samples=x)),
    ("sample_counts.budget", 7, lambda x: santa.sample_counts(random_probs((2, 3, 10), dtype=torch.float32), x, "iid", generator=_gen())),
    ("sample_indices.budget", 7, lambda x: santa.sample_indices(random_probs((2, 3, 10), dtype=torch.float32), x, "systematic", uniforms=torch.full((2, 3), 0.3, dtype=torch.float64))),
    ("variance_trace.budget", 5, lambda x: santa.variance_trace(random_probs((2, 3, 10), dtype=torch.float32), torch.ones(2, 3, 10, 4), x, "stratified")),
    ("variance_trace.replicates", 3, lambda x: santa.variance_trace(random_probs((2, 3, 10), dtype=torch.float32), torch.ones(2, 3, 10, 4), 5, "systematic", replicates=x, generator=_gen())),
    ("unique_keys.group_size", 2, lambda x: santa.unique_keys(torch.eye(4, dtype=torch.int64), group_size=x)),
    ("value_stage_cost.n_keys", 100, lambda x: santa.value_stage_cost(x, 4, budget=8)),
    ("value_stage_cost.head_dim", 4, lambda x: santa.value_stage_cost(100, x, budget=8)),
    ("value_stage_cost.budget", 8, lambda x: santa.value_stage_cost(100, 4, budget=x)),
    ("value_stage_cost.unique_rows", 5, lambda x: santa.value_stage_cost(100, 4, budget=8, unique_rows=x)),
    ("prefill_cost.n_queries", 3, lambda x: santa.prefill_cost(x, 100, 4, budget=8)),
    ("prefill_cost.n_keys", 100, lambda x: santa.prefill_cost(3, x, 4, budget=8)),
    ("prefill_cost.head_dim", 4, lambda x: santa.prefill_cost(3, 100, x, budget=8)),
    ("prefill_cost.budget", 8, lambda x: santa.prefill_cost(3, 100, 4, budget=x)),
    ("bernoulli_query.samples", 4, lambda x: _bernoulli(samples=x)),
    ("bernoulli_query.kv_heads", 2, lambda x: _bernoulli(kv_heads=x)),
    ("decode.budget", 8, lambda x: _decode(budget=x)),
    ("decode.seed", 1, lambda x: _decode(seed=x)),
    ("decode.offset", 2, lambda x: _decode(offset=x)),
    *((f"plan_decode.{name}", value, lambda x, name=name: _plan(**{name: x}))
      for name, value in (("batch", 1), ("heads", 2), ("kv_heads", 1), ("head_dim", 16), ("n_keys", 32), ("budget", 8),
                          ("page_size", 4))),
    *((f"Tuning.{name}", value, lambda x, name=name: _plan(tuning=Tuning(**{name: x})))
      for name, value in (("block_n", 32), ("warps_pass1", 4), ("warps_pass2", 2), ("stages_pass1", 2),
                          ("samples_per_program", 16))),
    ("DecodePlan.run.seed", 1, lambda x: _plan_run(seed=x)),
    ("DecodePlan.run.offset", 2, lambda x: _plan_run(offset=x)),
    ("make_workspace.budget", 8, _make_workspace),
    *((f"workspace_bytes.{name}", value, lambda x, name=name: _workspace_bytes(**{name: x}))
      for name, value in (("batch", 1), ("heads", 2), ("dim", 16), ("n_keys", 32), ("budget", 8))),
    ("philox_uniforms.seed", 1, lambda x: philox_uniforms(x, 2, torch.arange(4))),
    ("philox_uniforms.offset", 2, lambda x: philox_uniforms(1, x, torch.arange(4))),
    ("prop_reference.budget", 8, lambda x: _reference("prop", budget=x)),
    ("flash_reference.budget", 8, lambda x: _reference("flash", budget=x)),
    ("flash_reference.tile", 16, lambda x: _reference("flash", tile=x)),
]
IDS = [name for name, _, _ in INTEGER_ARGUMENTS]
NONE_IS_THE_DEFAULT = {"sampled_attention.score_samples", "value_stage_cost.unique_rows", "plan_decode.page_size",
                       "bernoulli_query.kv_heads"}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name, value, call", INTEGER_ARGUMENTS, ids=IDS)
@pytest.mark.parametrize("to_numpy", [np.int64, np.int32], ids=["int64", "int32"])
def test_a_numpy_integer_is_taken_as_the_int(torch_fallback, name, value, call, to_numpy):
    """numpy ints used to be refused by plan_decode, Tuning and bernoulli_query's kv_heads."""
    assert _same(call(to_numpy(value)), call(value))


@pytest.mark.parametrize("name, value, call", INTEGER_ARGUMENTS, ids=IDS)
@pytest.mark.parametrize("wrong", [float, lambda v: True, str, lambda v: None, np.float64],
                         ids=["float", "bool", "str", "None", "np.float64"])
def test_a_non_integer_is_a_type_error_naming_the_argument(torch_fallback, name, value, call, wrong):
    """A float where an int is expected used to be a ValueError in plan_decode, Tuning, decode's seed
    and offset and bernoulli_query's kv_heads, and was silently truncated by DecodePlan.run,
    philox_uniforms and flash_reference."""
    bad = wrong(value)
    if bad is None and (name in NONE_IS_THE_DEFAULT or name.startswith("Tuning.")):
        pytest.skip("None is this argument's default")
    with pytest.raises(TypeError, match=name.split(".")[-1]):
        call(bad)


@pytest.mark.parametrize("call, match", [
    (lambda: _plan(batch=0), "batch must be an int ≥ 1, got 0"),
    (lambda: _plan(head_dim=np.int64(-1)), "head_dim must be an int ≥ 1, got -1"),
    (lambda: _decode(seed=-1), r"seed must be an int in \[0, 2\*\*63\), got -1"),  # santa.rng.check_seed
    (lambda: _decode(offset=np.int64(-3)), r"offset must be an int in \[0, 9223372036854775808\), got -3"),
    (lambda: _plan_run(seed=2**63), "seed must be an int in"),
    (lambda: _plan(tuning=Tuning(block_n=np.int64(100))), r"Tuning.block_n must be None or a power of two in \[16, 512\], got 100"),
    (lambda: _bernoulli(kv_heads=3), "kv_heads must be an int ≥ 1 dividing the 4 query heads, got 3"),
    (lambda: _workspace_bytes(n_keys=0), "n_keys must be an int ≥ 1, got 0"),
    (lambda: philox_uniforms(-1, 0, torch.arange(2)), "seed"),
])
def test_an_integer_out_of_range_is_a_value_error_naming_the_argument(torch_fallback, call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("reference_fn", ["prop_reference", "flash_reference"])
@pytest.mark.parametrize("budget", [2**20 + 1, 2**70])
def test_the_kernel_references_refuse_budgets_past_max_budget(reference_fn, budget):
    """flash_reference raised OverflowError on 2**70; both references take the kernels' limit."""
    from santa.kernels import MAX_BUDGET, reference

    q, k, v = torch.randn(1, 2, 8), torch.randn(1, 4, 1, 8), torch.randn(1, 4, 1, 8)  # NHD, one KV head
    extra = {"tile": 2} if reference_fn == "flash_reference" else {}
    with pytest.raises(ValueError, match=rf"budget must lie in \[1, {MAX_BUDGET}\]"):
        getattr(reference, reference_fn)(q, k, v, budget, seed=0, **extra)
