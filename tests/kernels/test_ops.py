"""santa.kernels.ops: the decode kernels as torch custom ops (torch.ops.santa.decode, decode_counts).

opcheck on both kernels and on contiguous (NHD, HND) and paged caches; the fake implementation's
metadata against the real output's; torch.compile(fullgraph=True) of a module that calls
santa.decode against eager, bit for bit. On the CPU the ops run the torch fallback (the test unsets
TRITON_INTERPRET); on a CUDA machine the same tests run the kernels through a DecodePlan, plus a
mode="reduce-overhead" capture at the bottom.
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import santa
from helpers import DEVICE, KERNELS, make_inputs, needs_cuda, to_paged
from santa.kernels import ops

CACHES = ("contiguous", "paged", "hnd")
OPS = {"decode": torch.ops.santa.decode.default, "decode_counts": torch.ops.santa.decode_counts.default}


# CPU calls run the torch fallback (the ops' CPU implementation), also under TRITON_INTERPRET=1: the
# fixture (tests/conftest.py) unsets the variable after tests/kernels/conftest.py's autouse fixture set it.
pytestmark = pytest.mark.usefixtures("torch_fallback")


def op_args(cache: str, kernel: str, *, dtype=torch.float32) -> tuple:
    """Positional arguments of torch.ops.santa.decode for a tiny call (GQA 2, two sequences of other lengths)."""
    layout = "HND" if cache == "hnd" else "NHD"
    q, k, v = make_inputs(2, 4, 2, 16, 40, dtype, seed=7, layout=layout)
    seq_lens = torch.tensor([40, 17], dtype=torch.int32, device=DEVICE)
    if cache == "paged":  # with the offset as a device tensor and an explicit scale
        k, block_table = to_paged(k, 8, seed=1)
        v, _ = to_paged(v, 8, seed=1)  # the same seed: the same block table
        offset_tensor = torch.tensor([9], dtype=torch.int64, device=DEVICE)
        return (q, k, v, seq_lens, block_table, offset_tensor, None, None, None, 16, kernel, "NHD", 0.3, 5, 0)
    if cache == "hnd":  # every key visible
        return (q, k, v, None, None, None, None, None, None, 24, kernel, "HND", None, 2**62 + 1, 2**40)
    # per-sequence keys and positions (request-keyed draws)
    seeds = torch.tensor([5, 2**62 + 3], dtype=torch.int64, device=DEVICE)
    positions = seq_lens.long() - 1
    starts = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE) if kernel == "prop" else None  # a left-padded first sequence
    return (q, k, v, seq_lens, None, None, seeds, positions, starts, 16, kernel, "NHD", None, 0, 0)


def eager_decode(args: tuple, **extra):
    """santa.decode with the op's positional arguments."""
    q, k, v, seq_lens, block_table, offset_tensor, seeds, positions, starts, budget, kernel, kv_layout, scale, seed, offset = args
    return santa.decode(q, k, v, budget, kernel=kernel, seq_lens=seq_lens, block_table=block_table, kv_layout=kv_layout,
                        scale=scale, seed=seed if seeds is None else seeds,
                        offset=offset if offset_tensor is None else offset_tensor, positions=positions, starts=starts, **extra)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_opcheck_passes_every_test_util(kernel, cache, op):
    results = torch.library.opcheck(OPS[op], op_args(cache, kernel), raise_exception=False)
    assert set(results) == {"test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"}
    assert all(result == "SUCCESS" for result in results.values()), results


@pytest.mark.parametrize("kernel", KERNELS)
def test_opcheck_passes_through_a_decode_plan(kernel, monkeypatch):
    """The kernels' path of the ops (a cached DecodePlan and its run): on the CPU in Triton's interpreter."""
    from santa.kernels.plan import kernels_on_cpu

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if DEVICE.type == "cpu" and not kernels_on_cpu():
        pytest.skip("the kernels were defined without TRITON_INTERPRET=1")
    results = torch.library.opcheck(OPS["decode_counts"], op_args("paged", kernel), raise_exception=False)
    assert all(result == "SUCCESS" for result in results.values()), results


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_the_ops_give_what_santa_decode_gives(kernel, cache):
    args = op_args(cache, kernel)
    want_out, want_counts = eager_decode(args, return_counts=True)
    assert torch.equal(torch.ops.santa.decode(*args), want_out)
    out, counts = torch.ops.santa.decode_counts(*args)
    assert torch.equal(out, want_out) and torch.equal(counts, want_counts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("q_layout", ["contiguous", "strided"])
@pytest.mark.parametrize("cache", ["contiguous", "paged"])
def test_fake_outputs_have_the_real_outputs_metadata(cache, q_layout, dtype):
    args = op_args(cache, "prop", dtype=dtype)
    if q_layout == "strided":  # heads interleaved with another tensor: q.stride() is not contiguous
        q = args[0]
        args = (torch.stack([q, q], dim=2)[:, :, 0],) + args[1:]
        assert not args[0].is_contiguous()
    real = ops.decode_counts(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        fake = ops.decode_counts(*fake_args)
    for r, f in zip(real, fake, strict=True):
        assert (f.shape, f.dtype, f.stride(), f.device) == (r.shape, r.dtype, r.stride(), r.device)
    assert real[0].is_contiguous() and real[1].shape == (2, 4, 40)


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_a_non_finite_scale_is_a_value_error_naming_it(op, scale):
    """scale=nan used to be a TypeError ("scale must be a finite float or None"), where every other bad value is a ValueError."""
    args = op_args("contiguous", "prop")
    args = args[:12] + (scale,) + args[13:]
    with pytest.raises(ValueError, match="scale must be finite, got"):
        OPS[op](*args)
    with FakeTensorMode() as mode:  # the fake implementation (torch.compile's tracing) refuses it too
        fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        with pytest.raises(ValueError, match="scale must be finite, got"):
            OPS[op](*fake_args)


FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("scales", [dict(), dict(k_scale=0.5, v_scale_tensor=torch.tensor([0.25, 2.0], device=DEVICE))])
def test_the_ops_take_fp8_caches_and_their_scales_as_santa_decode(scales):
    q, k, v, *rest = op_args("contiguous", "prop")
    args = (q, k.to(FP8), v.to(FP8), *rest)
    want_out, want_counts = eager_decode(args, return_counts=True, k_scale=scales.get("k_scale"),
                                         v_scale=scales.get("v_scale_tensor"))
    out, counts = torch.ops.santa.decode_counts(*args, **scales)
    assert torch.equal(out, want_out) and torch.equal(counts, want_counts)
    assert torch.equal(torch.ops.santa.decode(*args, **scales), want_out)
    if scales:  # the scales are used: other ones give another output
        assert not torch.equal(torch.ops.santa.decode(*args), want_out)


@pytest.mark.parametrize("fp8, scales, message", [
    (True, dict(k_scale=0.5, k_scale_tensor=torch.ones(2)), "pass k_scale .* or k_scale_tensor .*, not both"),
    (True, dict(v_scale_tensor=torch.ones(4)), r"v_scale as a tensor must be float32 \[H_kv=2\]"),
    (True, dict(k_scale=0.0), "k_scale must be a finite scale > 0"),
    (False, dict(v_scale=0.5), "v_scale dequantises a float8_e4m3fn cache"),
])
def test_the_ops_refuse_bad_cache_scales_eagerly_and_in_the_fake(fp8, scales, message):
    q, k, v, *rest = op_args("contiguous", "prop")
    args = (q, k.to(FP8), v.to(FP8), *rest) if fp8 else (q, k, v, *rest)
    scales = {name: x.to(DEVICE) if isinstance(x, torch.Tensor) else x for name, x in scales.items()}
    with pytest.raises(ValueError, match=message):
        torch.ops.santa.decode(*args, **scales)
    with FakeTensorMode() as mode:
        fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        fake_scales = {name: mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for name, x in scales.items()}
        with pytest.raises(ValueError, match=message):
            torch.ops.santa.decode(*fake, **fake_scales)


class TinyAttention(torch.nn.Module):
    """q projection → santa.decode over a given cache → output projection (one decode step)."""

    def __init__(self, dim=16, heads=4, kernel="prop"):
        super().__init__()
        self.heads, self.kernel = heads, kernel
        self.q_proj = torch.nn.Linear(dim, heads * dim, bias=False)
        self.o_proj = torch.nn.Linear(heads * dim, dim, bias=False)

    def forward(self, x, k_cache, v_cache, seq_lens, offset):
        q = self.q_proj(x).view(x.shape[0], self.heads, -1)  # [B, H, d]
        o = santa.decode(q, k_cache, v_cache, 16, kernel=self.kernel, seq_lens=seq_lens, seed=11, offset=offset)
        return self.o_proj(o.flatten(1))


def test_compiled_fullgraph_module_equals_eager_bit_for_bit():
    torch.manual_seed(0)
    model = TinyAttention().to(DEVICE)
    _, k, v = make_inputs(2, 4, 2, 16, 40, seed=3)
    x = torch.randn(2, 16, device=DEVICE)
    seq_lens = torch.tensor([40, 23], dtype=torch.int32, device=DEVICE)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        for offset in (0, 1, torch.tensor([5], device=DEVICE)):  # ints (the second one as a SymInt), then a tensor
            assert torch.equal(compiled(x, k, v, seq_lens, offset), model(x, k, v, seq_lens, offset))


@pytest.mark.parametrize("kernel", KERNELS)
def test_compiled_decode_fills_out_and_returns_counts_as_eager(kernel):
    args = op_args("paged", kernel)
    q, k, v, seq_lens, block_table, offset_tensor = args[:6]

    def step(q, k, v, seq_lens, block_table, offset, out):
        return santa.decode(q, k, v, 16, kernel=kernel, seq_lens=seq_lens, block_table=block_table, scale=0.3, seed=5,
                            offset=offset, out=out, return_counts=True)

    out = torch.empty_like(q)
    result, counts = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, seq_lens, block_table, offset_tensor, out)
    want_out, want_counts = step(q, k, v, seq_lens, block_table, offset_tensor, None)
    assert torch.equal(out, want_out) and torch.equal(result, want_out) and torch.equal(counts, want_counts)


@pytest.mark.parametrize("change,message", [
    (dict(budget=0), "budget must be ≥ 1"),
    (dict(kernel="dense"), "kernel must be one of"),
    (dict(seed=-1), "seed must be an int"),
    (dict(seq_lens=torch.tensor([40, 17])), "seq_lens must be an int32 tensor"),
])
def test_compiled_decode_refuses_what_eager_refuses(change, message):
    q, k, v = make_inputs(2, 4, 2, 16, 40, seed=7)
    kwargs = dict(budget=16, kernel="prop", seq_lens=None, seed=0)
    kwargs.update(change)

    def step(q, k, v):
        return santa.decode(q, k, v, **kwargs)

    torch._dynamo.reset()  # dynamo caches per code object: no earlier case's graph break
    with pytest.raises((ValueError, TypeError), match=message):  # eager
        step(q, k, v)
    with pytest.raises(torch._dynamo.exc.Unsupported, match=message):  # fullgraph: dynamo's error, quoting it
        torch.compile(step, backend="eager", fullgraph=True)(q, k, v)
    with pytest.raises((ValueError, TypeError), match=message):  # a graph break: the frame runs eagerly
        torch.compile(step, backend="eager")(q, k, v)


@needs_cuda
@pytest.mark.parametrize("kernel", KERNELS)
def test_reduce_overhead_captures_decode_in_a_cuda_graph(kernel, monkeypatch):
    """After warm-up and recording, steps replay the graph: the op's implementation no longer runs,
    and each replay reads the offset tensor's new value, as eager does."""
    ops_module = importlib.import_module("santa.kernels.ops")
    calls = []
    real_eager = ops_module._eager
    monkeypatch.setattr(ops_module, "_eager", lambda *a: calls.append(1) or real_eager(*a))
    torch.manual_seed(0)
    model = TinyAttention(kernel=kernel).to(DEVICE)
    _, k, v = make_inputs(2, 4, 2, 16, 40, seed=3)
    x = torch.randn(2, 16, device=DEVICE)
    seq_lens = torch.tensor([40, 23], dtype=torch.int32, device=DEVICE)
    offset = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(6):
            if step == 3:
                calls_before_replays = len(calls)
            offset.fill_(step)
            got = compiled(x, k, v, seq_lens, offset).clone()
            assert torch.equal(got, model(x, k, v, seq_lens, offset)), step
    assert calls and len(calls) == calls_before_replays  # eager santa.decode does not go through the op


def test_a_plan_made_outside_graph_pools_is_made_on_another_thread_whose_errors_are_raised_here():
    """cudagraph trees route the allocations of the thread that warms a graph up into their pool: the op makes the
    plans it keeps on a helper thread, and a plan that cannot be made fails the call as it would on this thread."""
    import threading

    assert ops._made_outside_graph_pools(threading.get_ident, torch.device("cpu")) != threading.get_ident()

    def refuse():
        raise ValueError("no plan fits")

    with pytest.raises(ValueError, match="no plan fits"):
        ops._made_outside_graph_pools(refuse, torch.device("cpu"))


def test_the_op_keeps_only_plans_whose_one_launch_a_graph_may_replay(monkeypatch):
    """A CPU plan (no one launch) is made as eager makes it and not kept; the op's decode still matches eager's."""
    monkeypatch.setattr(ops, "_LENT", {})
    shape = dict(batch=2, heads=4, kv_heads=2, head_dim=16, n_keys=40, budget=16, dtype=torch.float32,
                 device=torch.device("cpu"), kernel="prop", kv_layout="NHD", page_size=None, scale=None,
                 kv_dtype=torch.float32, error_target=None, pilot=16)
    plan = ops._op_plan(tuple(shape.values()), shape)
    assert plan.one_launch is None and ops._LENT == {}
    q, k, v = make_inputs(2, 4, 2, 16, 40, seed=11)
    assert torch.equal(torch.ops.santa.decode(q, k, v, None, None, None, None, None, None, 16, "prop", "NHD", None, 3, 0),
                       santa.decode(q, k, v, 16, kernel="prop", seed=3))
    assert ops._LENT == {}


def test_past_the_kept_plans_the_op_plans_the_triton_prop_on_this_thread(monkeypatch):
    """With _LENT_MAX plans kept, a new CUDA call shape is planned with BATCH_INVARIANT (no one launch), on the calling
    thread and not kept: a one launch made there during a graph's warm-up would leave its schedule and counters in the
    graph's pool (main at 07db016)."""
    import threading

    from santa.kernels import BATCH_INVARIANT

    monkeypatch.setattr(ops, "_LENT", {("held", i): object() for i in range(ops._LENT_MAX)})
    made = []
    monkeypatch.setattr(ops, "plan_decode", lambda **shape: made.append((shape, threading.get_ident())) or "plan")
    shape = dict(batch=2, heads=4, kv_heads=2, head_dim=16, n_keys=40, device=torch.device("cuda"), tuning=None)
    assert ops._op_plan(("new",), shape) == "plan"
    assert made == [(dict(shape, tuning=BATCH_INVARIANT), threading.get_ident())]
    assert len(ops._LENT) == ops._LENT_MAX and ("new",) not in ops._LENT


@pytest.mark.parametrize("op", sorted(OPS))
def test_the_ops_and_their_fakes_take_batch_invariant(op):
    """The ops' trailing ``batch_invariant`` (schema default False): opcheck passes with it, the op gives what
    santa.decode(batch_invariant=True) gives (on the CPU what the default gives: no one launch), and the fake returns
    the real output's metadata."""
    args = op_args("contiguous", "prop")
    results = torch.library.opcheck(OPS[op], args, {"batch_invariant": True}, raise_exception=False)
    assert all(result == "SUCCESS" for result in results.values()), results
    last = OPS[op]._schema.arguments[-1]  # the trailing argument, so every earlier call's arguments mean the same
    assert (last.name, str(last.type), last.default_value) == ("batch_invariant", "bool", False)
    want_out, want_counts = eager_decode(args, return_counts=True, batch_invariant=True)
    real = OPS[op](*args, batch_invariant=True)
    assert torch.equal(real[0] if op == "decode_counts" else real, want_out)
    if op == "decode_counts":
        assert torch.equal(real[1], want_counts)
    assert torch.equal(want_out, eager_decode(args))
    with FakeTensorMode() as mode:
        fake_args = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
        fake = OPS[op](*fake_args, batch_invariant=True)
    for r, f in zip(real if op == "decode_counts" else (real,), fake if op == "decode_counts" else (fake,), strict=True):
        assert (f.shape, f.dtype, f.stride(), f.device) == (r.shape, r.dtype, r.stride(), r.device)


def test_compiled_decode_passes_batch_invariant_to_the_op_and_its_plan(monkeypatch):
    """santa.decode(batch_invariant=True) under torch.compile(fullgraph=True) reaches the op, whose plan (here the
    interpreter's kernels) is made with santa.kernels.BATCH_INVARIANT, has no one launch and is not kept in _LENT."""
    from santa.kernels.plan import kernels_on_cpu

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    if DEVICE.type == "cpu" and not kernels_on_cpu():
        pytest.skip("the kernels were defined without TRITON_INTERPRET=1")
    monkeypatch.setattr(ops, "_LENT", {})
    eager_module = importlib.import_module("santa.kernels.eager")
    args = op_args("paged", "prop")
    q, k, v, seq_lens, block_table, offset_tensor = args[:6]

    def step(q, k, v, seq_lens, block_table, offset):
        return santa.decode(q, k, v, 16, kernel="prop", seq_lens=seq_lens, block_table=block_table, scale=0.3, seed=5,
                            offset=offset, return_counts=True, batch_invariant=True)

    torch._dynamo.reset()
    eager_module._CALLS.clear()
    out, counts = torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, seq_lens, block_table, offset_tensor)
    plans = [call.plan for call in eager_module._CALLS.values()]
    assert plans and all(plan.tuning.one_launch is False and plan.one_launch is None for plan in plans)
    assert ops._LENT == {}
    want_out, want_counts = step(q, k, v, seq_lens, block_table, offset_tensor)
    assert torch.equal(out, want_out) and torch.equal(counts, want_counts)


HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not HOPPER, reason="the one-launch prop runs on sm_90 GPUs")
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_reduce_overhead_runs_the_one_launch_on_two_graph_paths_as_eager_does(monkeypatch, layout):
    """Two batch sizes alternately under cudagraph trees (two graph paths, each replayed after the other ran): every
    step's output is eager santa.decode's bit for bit (the same plan, the same one launch), and the op kept one plan
    per shape, each with its one launch, made outside the trees' pool. HND with starts is santa.hf's call (its plan
    made in a graph's warm-up on main left the one launch's tensors in the graph's pool, 2026-12-07)."""
    monkeypatch.setattr(ops, "_LENT", {})
    torch._dynamo.reset()
    heads, kv_heads, dim, n_keys = 8, 2, 128, 4096

    def step(q, k, v, seq_lens, offset, starts):
        return santa.decode(q, k, v, 128, kernel="prop", seq_lens=seq_lens, offset=offset, kv_layout=layout,
                            starts=starts)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    cases = {}
    for batch in (2, 3):
        q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, seed=batch, layout=layout)
        q, k, v = (x.to(DEVICE, torch.bfloat16) for x in (q, k, v))
        seq_lens = torch.tensor([4096, 1500, 90][:batch], dtype=torch.int32, device=DEVICE)
        starts = torch.tensor([0, 37, 5][:batch], dtype=torch.int32, device=DEVICE) if layout == "HND" else None
        cases[batch] = (q, k, v, seq_lens, torch.zeros(1, dtype=torch.int64, device=DEVICE), starts)
    with torch.no_grad():
        for round_ in range(4):
            for batch, (q, k, v, seq_lens, offset, starts) in cases.items():
                offset.fill_(round_)
                got = compiled(q, k, v, seq_lens, offset, starts).clone()
                assert torch.equal(got, step(q, k, v, seq_lens, offset, starts)), (round_, batch)
    assert sorted(key[0] for key in ops._LENT) == [2, 3]
    assert all(plan.one_launch is not None for plan in ops._LENT.values())


@pytest.mark.skipif(not HOPPER, reason="the one-launch prop runs on sm_90 GPUs")
def test_reduce_overhead_with_batch_invariant_keeps_no_plan_and_runs_as_eager(monkeypatch):
    """batch_invariant=True under cudagraph trees: the op's plan has no one launch (the Triton prop, its state all in
    the call's scratch), so _LENT keeps nothing, and every replayed step is eager santa.decode's bit for bit, at the
    shape whose default plan the previous test runs on the one launch."""
    monkeypatch.setattr(ops, "_LENT", {})
    torch._dynamo.reset()

    def step(q, k, v, seq_lens, offset):
        return santa.decode(q, k, v, 128, kernel="prop", seq_lens=seq_lens, offset=offset, batch_invariant=True)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    q, k, v = make_inputs(2, 8, 2, 128, 4096, seed=2)
    q, k, v = (x.to(DEVICE, torch.bfloat16) for x in (q, k, v))
    seq_lens = torch.tensor([4096, 1500], dtype=torch.int32, device=DEVICE)
    offset = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    with torch.no_grad():
        for round_ in range(4):
            offset.fill_(round_)
            assert torch.equal(compiled(q, k, v, seq_lens, offset).clone(), step(q, k, v, seq_lens, offset)), round_
    assert ops._LENT == {}
