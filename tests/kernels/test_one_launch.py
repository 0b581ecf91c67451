"""santa.kernels.one_launch: the one-launch CUDA prop (Hopper). On the CPU: the shipped module is the one its source
builds, the plan rule picks the plans measured fastest, and nothing else takes the path. On an sm_90 GPU: the kernel
against the reference samplers (the same tests as the Triton prop's, on the shapes it serves), its NaN semantics,
every form of the draw, and CUDA-graph replay with lengths that change on the device."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import make_inputs, to_paged
from santa.kernels import Tuning, decode, philox_uniforms, plan_decode
from santa.kernels import one_launch as ol
from santa.kernels.one_launch_schedule import live_schedule
from santa.kernels.reference import sampler_uniforms
from test_kernels import assert_counts_match_systematic, dense_probs

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the one-launch prop runs on sm_90 GPUs")


def test_the_shipped_module_is_built_from_this_source():
    """CI has no nvcc: the module travels in the package, and its build record names the source it was built from."""
    record = ol.BUILD_RECORD.read_text()
    assert record.startswith(ol.build_record(ol.source_digest())), \
        "one_launch.cu changed: rebuild one_launch.fatbin with santa.kernels.one_launch.build_module()"


def module_functions() -> set[str]:
    """The functions of the shipped (compressed) fatbin, as the cuobjdump that Triton ships lists them."""
    import shutil
    import subprocess
    from pathlib import Path

    triton = pytest.importorskip("triton")
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    tool = str(tool) if tool.exists() else shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("no cuobjdump (Triton's NVIDIA backend ships one)")
    listing = subprocess.run([tool, "--dump-resource-usage", str(ol.MODULE)], capture_output=True, text=True, check=True).stdout
    return {line.split("Function ", 1)[1].rstrip(":").strip() for line in listing.splitlines() if "Function " in line}


def test_the_module_holds_all_twelve_kernels_of_every_served_shape():
    functions = module_functions()
    kinds = (dict(), dict(fp8=True), dict(f16=True))  # bf16, e4m3 and fp16 caches
    expected = {ol.kernel_name(dim, group_size, paged=paged, live=live, **kind) for dim, group_size in ol.SHAPES
                for paged in (False, True) for kind in kinds for live in (False, True)}
    assert expected == functions, f"missing: {sorted(expected - functions)}; unserved: {sorted(functions - expected)}"


def h200_per_sm(shared: int) -> int:
    """CTAs of a prop1_* kernel per H200 SM: at most two (128 registers × 256 threads), and as many as 228 KB of shared
    memory hold with 1 KB reserved per CTA."""
    return 0 if shared > ol.SHARED_LIMIT else min(2, 228 * 1024 // (shared + 1024))


@pytest.mark.parametrize("batch,kv_heads,group_size,dim,n,budget,want", [
    (1, 8, 4, 128, 8192, 128, "C33"),  # Llama 8k: one wave, the most slices
    (1, 8, 4, 128, 131072, 128, "C33"),
    (4, 8, 4, 128, 32768, 128, "C8"),  # Llama B = 4: one wave still has 8 slices each
    (6, 8, 4, 128, 30080, 128, "C8s"),  # Llama B = 6 × 30k: 5 slices fit one wave; rounds of 4k-key slices, staggered
    (32, 8, 4, 128, 32768, 128, "C8s"),
    (1, 2, 7, 64, 32768, 128, "C66"),  # Qwen 32k: 132 slices halved
    (16, 2, 7, 64, 32768, 128, "C16"),  # Qwen B = 16: no one-wave plan fits; 2k-key slices in step
    (1, 3, 3, 64, 8192, 128, "C44"),  # SmolLM2 8k: 88 slices halved
    (16, 3, 3, 64, 8192, 64, "C5"),
    (64, 3, 3, 64, 8192, 128, "C4s"),
    (64, 3, 3, 64, 8192, 64, None),  # the two launches are faster there (S = 64: 78.7 µs against 83.4)
    (64, 8, 4, 128, 32768, 128, "C8s"),  # a 32k plan on vLLM's pages: 250.6 µs against 387.8 on 2k-key sequences
    (64, 8, 4, 128, 2048, 128, None),  # C2s: one CTA per SM (the gather's rows), 291.2 against 211.1 (paged)
    (16, 8, 4, 128, 4096, 128, None),  # C2s: 110.6 against 83.8
    (64, 8, 4, 128, 131072, 128, None),  # C16s: 31 rounds of short slices on 2k-key sequences, 629.0 against 426.8
    (64, 2, 7, 64, 2048, 128, "C2"),  # Qwen's shape: the one launch wins batched short sequences (44.9 against 86.1)
    (16, 8, 4, 128, 33024, 128, "C8s"),  # a server's 33,024 keys: 8 slices of 4,128 (H100: 224.3 against Triton's 267.3)
    (64, 8, 4, 128, 36864, 128, "C8s"),  # the last length 8 slices of 4,608 keys cover
    (64, 8, 4, 128, 36865, 128, None),  # 9 slices: the two launches
    (16, 2, 7, 64, 131072, 128, None),  # Qwen 128k: one CTA per SM (C18; C19 on pages: 314.5 against 284.2, H100)
    (16, 2, 7, 64, 65536, 128, None),  # Qwen 64k: the same branch (4k-key slices at one CTA per SM), not timed
    (16, 2, 7, 64, 32768, 128, "C16"),  # 16 slices of 2,048 keys cover 32k: unchanged
    (16, 2, 7, 64, 32769, 2048, "C19"),  # one CTA per SM set by the gather's rows of S = 2048, not long slices: kept
])
def test_the_plan_rule_picks_the_plans_measured_fastest(batch, kv_heads, group_size, dim, n, budget, want):
    """The H200 tables of issue 24 (benchmarks/RESULTS.md, 2026-12-03): the rule's plan is the fastest candidate."""
    plan = ol.choose_plan(batch=batch, kv_heads=kv_heads, group_size=group_size, dim=dim, n=n, budget=budget, sms=132,
                          per_sm=h200_per_sm)
    if want is None:
        assert plan is None
        return
    assert plan.name == want
    assert plan.shared(group_size=group_size, dim=dim, budget=budget) <= ol.SHARED_LIMIT
    assert plan.grid <= 2 * 132 and all(w.slices * (-(-n // w.slices)) >= n for w in plan.works)


def test_the_plan_rule_takes_more_slices_where_the_gather_needs_them_and_none_past_shared_memory():
    big = ol.choose_plan(batch=16, kv_heads=2, group_size=7, dim=64, n=32768, budget=2048, sms=132, per_sm=h200_per_sm)
    assert big is not None and big.slots > 16  # 2,048 rows of 8 floats per owned vector: more slices, fewer vectors each
    # Llama's shape takes at most 8 slices in rounds: there the two launches serve it
    assert ol.choose_plan(batch=8, kv_heads=8, group_size=4, dim=128, n=32768, budget=2048, sms=132, per_sm=h200_per_sm) is None
    assert ol.choose_plan(batch=1, kv_heads=8, group_size=4, dim=128, n=8192, budget=1 << 20, sms=132, per_sm=h200_per_sm) is None
    assert ol.choose_plan(batch=1, kv_heads=8, group_size=9, dim=128, n=8192, budget=128, sms=132, per_sm=h200_per_sm) is None


@pytest.mark.parametrize(("group_size", "dim", "budget", "page_size", "n", "want"), [
    (4, 128, 128, None, 32768, (4096, 264)),  # Llama S = 128: the design note's L = 4,096, P = 264
    (4, 128, 128, 16, 131072, (4096, 264)),  # on vLLM's pages of 16 keys (258 page ids more)
    (4, 128, 128, None, 262144, (4096, 264)),
    (7, 64, 128, None, 32768, (2048, 264)),  # Qwen: 64,736 B of kept scores
    (4, 128, 256, None, 32768, (4096, 264)),  # more rows per vector: the gather takes more chunks, not more slices
    (4, 128, 1024, None, 32768, (4096, 264)),
    (8, 128, 128, 16, 131072, (2048, 264)),  # 4,096-key slices would leave one CTA per SM: halved, two
    (7, 128, 128, None, 8192, (2048, 264)),
    (8, 128, 128, 16, 131073, (4096, 132)),  # 64 halved slices would not hold the plan: full ones, one CTA per SM
    (8, 128, 1536, None, 32768, (4096, 132)),  # halved slices' memory would not hold one vector's gather: full ones
])
def test_the_live_schedules_limits_follow_the_kernels_shared_memory(group_size, dim, budget, page_size, n, want):
    limits = ol.live_limits(group_size=group_size, dim=dim, budget=budget, sms=132, per_sm=h200_per_sm, n=n,
                            page_size=page_size)
    assert (limits.slice_cap, limits.ctas) == want and (limits.min_slices, limits.max_slices) == (1, ol.LIVE_MAX_SLICES)
    assert n <= limits.max_slices * limits.slice_cap
    # a live CTA gathers in chunks of the vectors whose S rows fit its shared memory beside every sample's resolved
    # row: at least one
    assert 4 * 8 * budget + 4 * group_size * budget <= limits.shared
    # the limits make a schedule, and Llama 64 × 2k takes two rounds (one slice a group) on any capacity
    if (group_size, budget, page_size) == (4, 128, None):
        fields = dict(slice_cap=limits.slice_cap, min_slices=limits.min_slices, max_slices=limits.max_slices, ctas=limits.ctas)
        assert {live_schedule([2048] * 64, n=n, kv_heads=8, **fields).rounds for n in (2048, 32768, 131072)} == {2}


def test_no_live_limits_where_the_gather_cannot_fit_or_the_shape_has_no_kernel():
    def limits(**change):
        return ol.live_limits(**dict(dict(group_size=4, dim=128, budget=128, sms=132, per_sm=h200_per_sm, n=32768), **change))

    assert limits(budget=1 << 16) is None  # one vector: 2 MiB
    # one vector's 2,000 rows fit (64,000 B of 75,904), not beside their 32,000 B of resolved rows; 1,536 fit beside theirs
    assert limits(budget=2000) is None
    assert limits(budget=1536) is not None
    assert limits(group_size=9) is None
    assert limits(sms=16) is None  # 32 CTAs < 64 slots


def test_a_long_contiguous_plan_whose_slices_fit_one_cta_per_sm_takes_the_triton_prop():
    def limits(group_size, n):
        return ol.live_limits(group_size=group_size, dim=128, budget=128, sms=132, per_sm=h200_per_sm, n=n)

    def pays(group_size, n, paged=False):
        chosen = limits(group_size, n)
        return ol.live_pays(paged=paged, per_sm=h200_per_sm(chosen.shared), n=n)

    full = {g: h200_per_sm(ol.live_limits(group_size=g, dim=128, budget=128, sms=132, per_sm=h200_per_sm, n=32768,
                                           slice_cap=4096).shared) for g in (4, 7, 8)}
    assert full == {4: 2, 7: 1, 8: 1}  # the kept scores of 4,096-key slices at G = 7 and 8: one CTA per SM
    # halved (two CTAs per SM): 0.915-0.943x the contiguous Triton prop's time at B = 16 x 32k, 0.987-0.997x at 4 x 128k
    assert pays(7, 32768) and pays(8, 131072)
    assert not pays(8, 262144)  # full slices over 128k keys, one CTA per SM: 1.05-1.08x at 16 x 32k
    assert pays(8, 8192) and pays(8, ol.LIVE_ONE_CTA_KEYS)  # B = 8 x 8k: halved slices win
    assert pays(4, 131072) and pays(4, 262144)  # two CTAs per SM on full slices
    assert pays(8, 131072, paged=True) and pays(8, 262144, paged=True)  # a paged plan's capacity is not its live keys


def test_slices_of_any_length_for_the_benchmarks():
    def limits(group_size, **extra):
        return ol.live_limits(group_size=group_size, dim=128, budget=128, sms=132, per_sm=h200_per_sm, page_size=16,
                              n=131072, **extra)

    for group_size in (7, 8):
        full, half = limits(group_size, slice_cap=4096), limits(group_size, slice_cap=2048)
        assert (full.ctas, half.ctas) == (132, 264) and half.slice_cap == 2048 and half.shared < full.shared
        assert half == limits(group_size)  # the default
    assert limits(4, slice_cap=1024).slice_cap == 1024
    for bad in (0, 1000, 8192, 2048.0):
        with pytest.raises(ValueError, match="slice_cap must be a multiple of 256 keys up to 4096"):
            limits(8, slice_cap=bad)


@pytest.mark.parametrize("change", [dict(kernel="flash"), dict(dtype=torch.float16, kv_dtype=torch.bfloat16),
                                    dict(kv_dtype=torch.float16), dict(dtype=torch.float32, kv_dtype=torch.float32),
                                    dict(dtype=torch.float16, kv_dtype=torch.float8_e4m3fn), dict(kv_layout="BHND"), dict(page_size=12),
                                    dict(page_size=48, kv_layout="HND"),
                                    dict(head_dim=96), dict(group_size=9), dict(head_dim=64, group_size=9)])
def test_only_bf16_or_fp16_prop_of_the_served_shapes_nhd_or_hnd_pages_of_a_power_of_two_is_eligible(change):
    kwargs = dict(device=torch.device("cuda", 0), kernel="prop", dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                  kv_layout="NHD", page_size=None, head_dim=128, group_size=4)
    assert not ol.eligible(**{**kwargs, **change})


def test_a_servers_33024_key_plan_on_vllms_pages_takes_eight_slices():
    """The plan of `vllm serve` at max_model_len 33,024 (16-key pages): C8s, timed 0.79–0.88× the Triton prop (H100)."""
    for batch in (8, 16, 64, 256):
        plan = ol.choose_plan(batch=batch, kv_heads=8, group_size=4, dim=128, n=33024, budget=128, sms=132,
                              per_sm=h200_per_sm, page_size=16)
        assert plan is not None and plan.name == "C8s" and min(w.slices for w in plan.works) == 8  # staggered: a first half-round of 16
        assert plan.shared(group_size=4, dim=128, budget=128, page_size=16) <= ol.SHARED_LIMIT


def test_a_paged_plan_counts_its_slices_pages_in_shared_memory():
    contiguous = ol.choose_plan(batch=2, kv_heads=8, group_size=4, dim=128, n=32768, budget=128, sms=132, per_sm=h200_per_sm)
    paged = ol.choose_plan(batch=2, kv_heads=8, group_size=4, dim=128, n=32768, budget=128, sms=132, per_sm=h200_per_sm,
                           page_size=16)
    assert paged.kernel == "prop1p_d128_g4" and contiguous.kernel == "prop1_d128_g4" and paged.name == contiguous.name
    slice_len = paged.works[0].slice_len
    grows = (paged.shared(group_size=4, dim=128, budget=128, page_size=16)
             - contiguous.shared(group_size=4, dim=128, budget=128))
    assert grows == 4 * (-(-slice_len // 16) + 1)  # a slice's keys can straddle one page more than they fill


def test_buffers_hold_a_plan_only_if_its_groups_heads_and_slices_fit():
    buffers = ol.Buffers.allocate(batch=4, heads=32, kv_heads=8, budget=128, slots=66, device=torch.device("cpu"))
    assert buffers.slots == 66 and buffers.stats.shape == (32, 4, 66, 2) and buffers.epoch.eq(0).all()
    assert buffers.fits(batch=3, heads=32, kv_heads=8, budget=128, slots=33)
    assert not buffers.fits(batch=5, heads=32, kv_heads=8, budget=128, slots=33)  # more groups than rows
    assert not buffers.fits(batch=4, heads=32, kv_heads=8, budget=128, slots=67)
    assert not buffers.fits(batch=4, heads=32, kv_heads=8, budget=64, slots=8)  # the sampled words' rows are S long
    assert not buffers.fits(batch=4, heads=28, kv_heads=4, budget=128, slots=8)


def test_cache_strides_address_nhd_hnd_and_vllms_packed_rows_and_refuse_what_16_byte_loads_cannot_read():
    k = torch.zeros(10, 16, 8, 128, dtype=torch.bfloat16)
    assert ol.cache_strides(k, k.clone(), "NHD") == (16 * 8 * 128, 8 * 128, 128)
    hnd = torch.zeros(10, 8, 16, 128, dtype=torch.bfloat16)
    assert ol.cache_strides(hnd, hnd.clone(), "HND") == (8 * 16 * 128, 128, 16 * 128)
    packed = torch.zeros(10, 16, 8, 256, dtype=torch.bfloat16)  # vLLM: K and V halves of one row
    assert ol.cache_strides(packed[..., :128], packed[..., 128:], "NHD") == (16 * 8 * 256, 8 * 256, 256)
    assert ol.cache_strides(k, torch.zeros(10, 16, 8, 136, dtype=torch.bfloat16)[..., :128], "NHD") is None  # strides differ
    odd = torch.zeros(10, 16, 8, 132, dtype=torch.bfloat16)[..., :128]
    assert ol.cache_strides(odd, odd, "NHD") is None  # a head stride of 132 elements: loads off 16 bytes
    shifted = torch.zeros(10 * 16 * 8 * 128 + 4, dtype=torch.bfloat16)[4:].view(10, 16, 8, 128)
    assert ol.cache_strides(shifted, shifted, "NHD") is None  # an 8-byte aligned base


class FakeDriver:
    """libcuda's three calls that :meth:`one_launch.CudaModule.resident_per_sm` makes, recording each function's
    dynamic shared memory limit (cuFuncSetAttribute 8) and answering occupancy from it: 0 CTAs where a launch's
    shared memory is past the limit (the driver's answer that made vLLM's cooperative launch fail with 720)."""

    STATIC = 616  # the prop1_* kernels' static shared memory, about

    def __init__(self):
        self.limit, self.sets = 48 * 1024 - self.STATIC, []

    def cuModuleGetFunction(self, fn, module, name):
        return 0

    def cuFuncGetAttribute(self, value, attribute, fn):
        assert attribute == 1
        value._obj.value = self.STATIC
        return 0

    def cuFuncSetAttribute(self, fn, attribute, value):
        assert attribute == 8
        self.limit = value
        self.sets.append(value)
        return 0

    def cuOccupancyMaxActiveBlocksPerMultiprocessor(self, blocks, fn, threads, shared):
        blocks._obj.value = 0 if shared.value > self.limit else 228 * 1024 // (shared.value + 1024)
        return 0


def fake_module() -> ol.CudaModule:
    """A CudaModule over :class:`FakeDriver` (no module loaded)."""
    module = object.__new__(ol.CudaModule)
    module.cuda, module.module, module.functions, module.shared_allowed = FakeDriver(), None, {}, {}
    return module


def test_a_function_s_shared_memory_limit_only_rises_so_an_earlier_plan_still_launches():
    """vLLM's engine makes every captured batch size's plan first; a larger batch's plan probes smaller slices (less
    shared memory) after a batch-4 plan was made. The limit must stay where the batch-4 plan needs it."""
    module = fake_module()
    name = ol.kernel_name(128, 4, paged=True)
    assert module.resident_per_sm(name, 75_724) == 3  # the batch-4 plan (C8 of 33024 keys)
    assert module.resident_per_sm(name, 66_000) == 3  # a batch-64 plan's probe: smaller, the limit stays
    assert module.resident_per_sm(name, 40_000) == 5  # under 48 KB: no call
    assert module.cuda.sets == [75_724] and module.shared_allowed == {name: 75_724}
    assert module.resident_per_sm(name, 90_000) == 2 and module.cuda.sets == [75_724, 90_000]
    assert module.resident_per_sm(name, 75_724) == 3  # the batch-4 launch: still fits
    assert module.resident_per_sm(name, ol.SHARED_LIMIT + 1) == 0 and module.cuda.sets[-1] == 90_000
    # static and dynamic together: past 227 KB no probe asks the driver (it would refuse the attribute)
    assert module.resident_per_sm(name, ol.SHARED_LIMIT - 100) == 0 and module.cuda.sets[-1] == 90_000


def test_the_default_limit_counts_the_static_shared_memory():
    """48 KB of dynamic shared memory is past a function's default limit when it has static shared memory too: the
    limit is raised for it, so the answer does not depend on an earlier plan having raised it."""
    module = fake_module()
    name = ol.kernel_name(64, 7)
    assert module.resident_per_sm(name, 40_000) == 5 and module.cuda.sets == []
    assert module.resident_per_sm(name, 48 * 1024) == 4 and module.cuda.sets == [48 * 1024]


def test_a_cpu_plan_has_no_one_launch_and_tuning_checks_the_switch():
    plan = plan_decode(batch=1, heads=32, kv_heads=8, head_dim=128, n_keys=256, budget=16, dtype=torch.bfloat16, device="cpu")
    assert plan.one_launch is None
    with pytest.raises(TypeError, match="Tuning.one_launch must be None or a bool"):
        plan_decode(batch=1, heads=32, kv_heads=8, head_dim=128, n_keys=256, budget=16, dtype=torch.bfloat16, device="cpu",
                    tuning=Tuning(one_launch="yes"))


# --------------------------------------------------------------------------- on an sm_90 GPU

SHAPES = [(2, 32, 8, 128, 3000, 128), (3, 14, 2, 64, 5000, 128), (4, 9, 3, 64, 2100, 64), (1, 32, 8, 128, 300, 256)]


def hopper_plan(batch, heads, kv_heads, dim, n_keys, budget, **kwargs):
    plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                       dtype=torch.bfloat16, device="cuda", **kwargs)
    assert plan.one_launch is not None
    return plan


@needs_hopper
@pytest.mark.parametrize("batch,heads,kv_heads,dim,n_keys,budget", SHAPES)
def test_counts_equal_the_systematic_reference_and_the_output_is_their_mean(batch, heads, kv_heads, dim, n_keys, budget):
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=n_keys, q_scale=3.0)
    seq_lens = torch.tensor([max(1, n_keys - 97 * b) for b in range(batch)], dtype=torch.int32, device="cuda")
    plan = hopper_plan(batch, heads, kv_heads, dim, n_keys, budget)
    counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
    out = plan.run(q, k, v, seq_lens=seq_lens, seed=11, offset=7, counts=counts)
    assert_counts_match_systematic(counts, dense_probs(q, k, seq_lens), budget, philox_uniforms(11, 7, torch.arange(batch * heads).reshape(batch, heads)))
    expected = torch.einsum("bhl,blhd->bhd", counts.double(), v.double().repeat_interleave(heads // kv_heads, dim=2)) / budget
    torch.testing.assert_close(out.double(), expected, rtol=8e-3, atol=8e-3)
    again = plan.run(q, k, v, seq_lens=seq_lens, seed=11, offset=7)
    assert torch.equal(out, again), "bitwise repeatable"


@needs_hopper
@pytest.mark.parametrize("dim,heads,kv_heads", [(128, 32, 8), (64, 14, 2), (64, 9, 3)])
def test_sequences_the_budget_covers_are_exact_inside_the_one_launch(dim, heads, kv_heads):
    """santa's one rule (S ≥ a sequence's live keys: exact attention, each live V row read once) inside the one
    launch, beside sampled sequences of the same batch: what the Triton path's covered-sequence launch computes."""
    batch, n_keys, budget = 4, 1000, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=21, q_scale=3.0)
    seq_lens = torch.tensor([1000, 128, 37, 129], dtype=torch.int32, device="cuda")  # sampled, covered, covered, sampled
    outs, counts = {}, {}
    for name, tuning in (("one launch", None), ("two launches", Tuning(one_launch=False))):
        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                           dtype=torch.bfloat16, device="cuda", tuning=tuning)
        assert (plan.one_launch is not None) == (tuning is None)
        counts[name] = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
        outs[name] = plan.run(q, k, v, seq_lens=seq_lens, seed=4, offset=1, counts=counts[name])
    group = heads // kv_heads
    for b in (1, 2):
        n = int(seq_lens[b])
        kk, vv = (x[b, :n].double().repeat_interleave(group, dim=1) for x in (k, v))
        p = torch.softmax(torch.einsum("hd,lhd->hl", q[b].double(), kk) / dim**0.5, dim=-1)
        exact = torch.einsum("hl,lhd->hd", p, vv)
        torch.testing.assert_close(outs["one launch"][b].double(), exact, rtol=2e-2, atol=2e-2)  # bf16 output
        assert counts["one launch"][b, :, :n].eq(1).all() and counts["one launch"][b, :, n:].eq(0).all()
    assert torch.equal(counts["one launch"][1:3], counts["two launches"][1:3])
    for b in (0, 3):  # sampled (the two paths' samples agree up to float32 CDF rounding: tested above)
        assert counts["one launch"][b].sum(-1).eq(budget).all()
    torch.testing.assert_close(outs["one launch"][1:3].float(), outs["two launches"][1:3].float(), rtol=2e-2, atol=2e-2)


@needs_hopper
@pytest.mark.parametrize("form", ["offset in memory", "a key per sequence", "positions int64", "positions int32"])
def test_every_form_of_the_draw_gives_the_triton_props_samples(form):
    batch, heads, kv_heads, dim, n_keys, budget = 3, 14, 2, 64, 1500, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=5, q_scale=3.0)
    seeds = torch.tensor([3, 2**40 + 1, 2**62 + 9], dtype=torch.int64, device="cuda")
    args = {"offset in memory": dict(seed=5, offset=torch.tensor([2**35 + 3], dtype=torch.int64, device="cuda")),
            "a key per sequence": dict(seed=seeds, offset=4),
            "positions int64": dict(seed=seeds, positions=torch.tensor([0, 7, 2**33], dtype=torch.int64, device="cuda")),
            "positions int32": dict(seed=seeds, positions=torch.tensor([0, 7, 1499], dtype=torch.int32, device="cuda"))}[form]
    counts = {}
    for name, tuning in (("one launch", None), ("two launches", Tuning(one_launch=False))):
        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                           dtype=torch.bfloat16, device="cuda", tuning=tuning)
        assert (plan.one_launch is None) == (tuning is not None)
        counts[name] = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
        plan.run(q, k, v, counts=counts[name], **args)
    if "positions" in args:
        uniforms = sampler_uniforms(seeds.cpu(), args["positions"].cpu().long().unsqueeze(1), heads, "systematic", budget)
        uniforms = uniforms.reshape(batch, heads)
    else:
        seed, offset = args["seed"], args["offset"]
        offset = int(offset.item()) if isinstance(offset, torch.Tensor) else offset
        rows = torch.arange(batch * heads).reshape(batch, heads)
        uniforms = (torch.stack([philox_uniforms(int(s), offset, rows[b]) for b, s in enumerate(seed.tolist())])
                    if isinstance(seed, torch.Tensor) else philox_uniforms(seed, offset, rows))
    for name in counts:
        assert_counts_match_systematic(counts[name], dense_probs(q, k), budget, uniforms)


@needs_hopper
def test_bad_lengths_and_poisoned_scores_give_nan_and_draw_nothing():
    """As the Triton prop: a length outside [0, n_keys] is clamped and its sequence's output is NaN; NaN or +inf scores
    make their heads NaN; a length of 0 gives zeros; the other sequences are untouched."""
    batch, heads, kv_heads, dim, n_keys, budget = 4, 32, 8, 128, 600, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=3)
    k[3, 17, 5] = float("nan")  # KV head 5 of sequence 3: its 4 query heads score NaN
    seq_lens = torch.tensor([n_keys + 5, -1, 0, n_keys], dtype=torch.int32, device="cuda")
    plan = hopper_plan(batch, heads, kv_heads, dim, n_keys, budget)
    counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
    out = plan.run(q, k, v, seq_lens=seq_lens, seed=1, counts=counts)
    assert out[:2].isnan().all() and counts[:2].sum() == 0
    assert torch.equal(out[2], torch.zeros_like(out[2])) and counts[2].sum() == 0
    poisoned = torch.zeros(heads, dtype=torch.bool, device="cuda")
    poisoned[20:24] = True
    assert out[3, poisoned].isnan().all() and counts[3, poisoned].sum() == 0
    assert not out[3, ~poisoned].isnan().any() and bool((counts[3, ~poisoned].sum(-1) == budget).all())


@needs_hopper
def test_a_captured_graph_follows_lengths_and_positions_that_change_on_the_device():
    batch, heads, kv_heads, dim, n_keys, budget = 2, 9, 3, 64, 4096, 64
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=9, q_scale=2.0)
    plan = hopper_plan(batch, heads, kv_heads, dim, n_keys, budget)
    seeds = torch.tensor([5, 6], dtype=torch.int64, device="cuda")
    seq_lens = torch.tensor([1000, 2000], dtype=torch.int32, device="cuda")
    positions = (seq_lens - 1).long()
    out = torch.empty_like(q)
    plan.run(q, k, v, seq_lens=seq_lens, seed=seeds, positions=positions, out=out)  # warm (outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, seq_lens=seq_lens, seed=seeds, positions=positions, out=out)
    for step in range(3):
        seq_lens.copy_(torch.tensor([1000 + 700 * step, 4096 - step], dtype=torch.int32))
        positions.copy_(seq_lens - 1)
        graph.replay()
        eager = plan.run(q, k, v, seq_lens=seq_lens.clone(), seed=seeds, positions=positions.clone())
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@needs_hopper
@pytest.mark.parametrize("paged", [False, True])
def test_a_captured_graph_runs_or_skips_the_one_launch_by_its_gate(paged):
    """DecodePlan.run's gate in the one launch: open, the ungated call bit for bit (counts too); closed, nothing written;
    flipped on the device between replays of one graph (santa.vllm's short steps), each replay follows it."""
    batch, heads, kv_heads, dim, n_keys, budget = 2, 32, 8, 128, 4096, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=21)
    tables = {}
    if paged:
        k, table = to_paged(k, 16, seed=3)
        v, _ = to_paged(v, 16, seed=3)
        tables = dict(block_table=table)
    plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                       dtype=torch.bfloat16, device="cuda", page_size=16 if paged else None)
    assert plan.one_launch is not None
    seq_lens = torch.tensor([4096, 2500], dtype=torch.int32, device="cuda")
    call = dict(seq_lens=seq_lens, seed=7, positions=(seq_lens - 1).long(), **tables)
    want_counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
    want = plan.run(q, k, v, counts=want_counts, out=torch.empty_like(q), **call).clone()
    enabled = torch.ones(1, dtype=torch.int32, device="cuda")
    out, counts = torch.empty_like(q), torch.zeros_like(want_counts)
    plan.run(q, k, v, out=out, counts=counts, enabled=enabled, **call)
    torch.cuda.synchronize()
    assert torch.equal(out, want) and torch.equal(counts, want_counts)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, out=out, enabled=enabled, **call)
    for value in (0, 1, 0, 1):
        enabled.fill_(value)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert out.isnan().all() if value == 0 else torch.equal(out, want), value


@needs_hopper
def test_a_captured_graph_advances_with_an_offset_in_device_memory():
    q, k, v = make_inputs(2, 32, 8, 128, 5000, torch.bfloat16, seed=13)
    seq_lens = torch.tensor([5000, 3001], dtype=torch.int32, device="cuda")
    plan = hopper_plan(2, 32, 8, 128, 5000, 128)
    out, offset = torch.empty_like(q), torch.tensor([0], dtype=torch.int64, device="cuda")
    plan.run(q, k, v, seq_lens=seq_lens, offset=offset, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, k, v, seq_lens=seq_lens, offset=offset, out=out)
    for step in (3, 4):
        offset.fill_(step)
        graph.replay()
        eager = plan.run(q, k, v, seq_lens=seq_lens, offset=step)
        torch.cuda.synchronize()
        assert torch.equal(out, eager), step
    first = out.clone()
    offset.fill_(3)
    graph.replay()
    assert not torch.equal(first, out)


@needs_hopper
def test_a_call_the_one_launch_kernel_cannot_serve_takes_the_triton_prop():
    """A caller's workspace without one-launch buffers: the two-launch prop, same samples (a bf16 cache takes no
    scales: refused by name)."""
    batch, heads, kv_heads, dim, n_keys, budget = 2, 32, 8, 128, 700, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=4, q_scale=3.0)
    plan = hopper_plan(batch, heads, kv_heads, dim, n_keys, budget)
    uniforms = philox_uniforms(2, 0, torch.arange(batch * heads).reshape(batch, heads))
    for kwargs in (dict(workspace=plan.workspace),):
        counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
        plan.run(q, k, v, seed=2, counts=counts, **kwargs)
        assert_counts_match_systematic(counts, dense_probs(q, k), budget, uniforms)
    with pytest.raises(ValueError, match="k_scale dequantises a float8_e4m3fn cache"):
        plan.run(q, k, v, seed=2, k_scale=torch.ones(kv_heads, device="cuda"))


def run_probs(q, k, starts, seq_lens):
    """float64 softmax weights [B, H, L] of each sequence's run of keys [starts[b], seq_lens[b]) (zero elsewhere)."""
    heads, kv_heads = q.shape[1], k.shape[2]
    s = torch.einsum("bhd,blhd->bhl", q.double(), k.double().repeat_interleave(heads // kv_heads, dim=2)) / math.sqrt(q.shape[-1])
    keys = torch.arange(k.shape[1], device=k.device)
    visible = (keys >= starts.long().unsqueeze(-1)) & (keys < seq_lens.long().unsqueeze(-1))
    return torch.softmax(s.masked_fill(~visible.unsqueeze(1), -math.inf), dim=-1).nan_to_num(0.0)


def assert_runs_0_1_sampled_and_run_2_exact(out, counts, q, k, v, starts, seq_lens, budget: int, seed: int):
    """Sequences 0 and 1 (sampled runs): the systematic sampler's counts over each run on the request uniforms of
    ``seed``, and the output their mean; sequence 2 (a run the budget covers): the output is exact attention over it.
    k, v: NHD ``[B, L, H_kv, d]``."""
    batch, heads = q.shape[:2]
    group = heads // k.shape[2]
    probs = run_probs(q, k, starts, seq_lens)
    uniforms = philox_uniforms(seed, 0, torch.arange(batch * heads).reshape(batch, heads))
    assert_counts_match_systematic(counts[:2], probs[:2], budget, uniforms[:2])
    expected = torch.einsum("bhl,blhd->bhd", counts.double(), v.double().repeat_interleave(group, dim=2)) / budget
    torch.testing.assert_close(out[:2].double(), expected[:2], rtol=8e-3, atol=8e-3)
    exact = torch.einsum("hl,lhd->hd", probs[2], v[2].double().repeat_interleave(group, dim=1))
    torch.testing.assert_close(out[2].double(), exact, rtol=2e-2, atol=2e-2)


@needs_hopper
@pytest.mark.parametrize("paged,live", [(False, False), (False, True), (True, False), (True, True)])
def test_starts_shift_each_run_in_the_one_launch(paged, live):
    """``starts`` (left padding: santa.hf passes them with every attention mask): sequence b's keys are
    ``[starts[b], seq_lens[b])``. The one launch, contiguous or on vLLM's packed pages, host rounds or live, draws the
    systematic sampler's counts over each run (up to float32 CDF rounding), a run the budget covers is exact (each of
    its keys once, whatever its length), and a first key past the length gives NaN and no samples, as the Triton prop."""
    batch, heads, kv_heads, dim, n_keys, budget = 4, 32, 8, 128, 2048, 128
    q, k, v, k_pages, v_pages, table, _ = paged_case("packed", batch=batch, heads=heads, kv_heads=kv_heads, dim=dim,
                                                     n_keys=n_keys)
    seq_lens = torch.tensor([2048, 1900, 1000, 700], dtype=torch.int32, device="cuda")
    starts = torch.tensor([0, 333, 900, 701], dtype=torch.int32, device="cuda")  # sampled ×2, covered (100 keys), bad
    launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                          scale=dim**-0.5, device=torch.device("cuda"), page_size=16 if paged else None, live=live)
    assert (launch.plan.name == "live") == live
    k_c, v_c = (k_pages, v_pages) if paged else (k, v)
    counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
    out = launch.run(q, k_c, v_c, out=torch.empty_like(q), strides=ol.cache_strides(k_c, v_c, "NHD"), seq_lens=seq_lens,
                     starts=starts, block_table=table if paged else None, seed=13, counts=counts)
    assert_runs_0_1_sampled_and_run_2_exact(out, counts, q, k, v, starts, seq_lens, budget, seed=13)
    assert counts[1, :, :333].eq(0).all(), "nothing sampled before the first key"
    assert counts[2, :, 900:1000].eq(1).all() and counts[2].sum() == heads * 100, "a covered run: each key once"
    assert out[3].isnan().all() and counts[3].sum() == 0


@needs_hopper
def test_a_plans_call_with_starts_runs_the_one_launch(monkeypatch):
    """``plan.run(starts=…)`` takes the one launch (no Triton launcher is built) and draws the run's samples."""
    batch, heads, kv_heads, dim, n_keys, budget = 2, 32, 8, 128, 700, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=4, q_scale=3.0)
    plan = hopper_plan(batch, heads, kv_heads, dim, n_keys, budget)

    def no_triton(*args, **kwargs):
        raise AssertionError("the call took the Triton prop")

    monkeypatch.setattr(plan, "_launchers_for", no_triton)
    starts = torch.tensor([0, 123], dtype=torch.int32, device="cuda")
    seq_lens = torch.full((batch,), n_keys, dtype=torch.int32, device="cuda")
    counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
    plan.run(q, k, v, seq_lens=seq_lens, starts=starts, seed=2, counts=counts)
    uniforms = philox_uniforms(2, 0, torch.arange(batch * heads).reshape(batch, heads))
    assert_counts_match_systematic(counts, run_probs(q, k, starts, seq_lens), budget, uniforms)


@needs_hopper
@pytest.mark.parametrize("n_keys", [700, 3000])
def test_a_contiguous_hnd_plan_runs_the_contiguous_one_launch_in_place_with_starts(n_keys, monkeypatch):
    """transformers' static cache (contiguous HND ``[B, H_kv, L, D]``, santa.hf's call with lengths and ``starts``): the
    plan takes the contiguous kernels, which read its rows in place through its row and head strides, and draws the
    systematic sampler's counts over each run, a covered run exact; no Triton launcher is built."""
    batch, heads, kv_heads, dim, budget = 3, 32, 8, 128, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=8, q_scale=3.0)
    plan = hopper_plan(batch, heads, kv_heads, dim, n_keys, budget, kv_layout="HND")
    assert plan.one_launch.kernel.startswith(("prop1_", "prop1l_"))
    monkeypatch.setattr(plan, "_launchers_for", lambda *args, **kwargs: pytest.fail("the call took the Triton prop"))
    seq_lens = torch.tensor([n_keys, n_keys - 5, 650], dtype=torch.int32, device="cuda")
    starts = torch.tensor([0, 41, 600], dtype=torch.int32, device="cuda")  # sampled, sampled, covered (50 keys)
    counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
    out = plan.run(q, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), seq_lens=seq_lens, starts=starts,
                   seed=5, counts=counts)
    assert_runs_0_1_sampled_and_run_2_exact(out, counts, q, k, v, starts, seq_lens, budget, seed=5)
    assert counts[2, :, 600:650].eq(1).all() and counts[2].sum() == heads * 50


HND_CASES = [  # (batch, heads, kv_heads, dim, n_keys, kv dtype): host rounds at Llama's and Qwen's shapes, the live
    # schedule (Llama 64 × 2k: no host rounds fit), fp16 and fp8 caches
    (3, 32, 8, 128, 3000, torch.bfloat16), (1, 14, 2, 64, 4096, torch.bfloat16), (16, 14, 2, 64, 2048, torch.bfloat16),
    (64, 32, 8, 128, 2048, torch.bfloat16), (3, 32, 8, 128, 3000, torch.float16), (3, 32, 8, 128, 3000, torch.float8_e4m3fn),
]


@needs_hopper
@pytest.mark.parametrize("batch,heads,kv_heads,dim,n_keys,kv_dtype", HND_CASES)
def test_a_contiguous_hnd_cache_gives_what_the_same_keys_in_nhd_give_bit_for_bit(batch, heads, kv_heads, dim, n_keys,
                                                                                  kv_dtype, monkeypatch):
    """The contiguous kernels read an HND cache through its row and head strides (the sequence at b·n·H_kv·D): the
    same keys as NHD run the same kernel on the same schedule, so the outputs and counts are equal bit for bit, with
    lengths and ``starts``; and the NHD call is the one the reference tests check."""
    q_dtype = torch.float16 if kv_dtype == torch.float16 else torch.bfloat16
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, q_dtype, seed=batch + dim, q_scale=3.0)
    k, v = k.to(kv_dtype), v.to(kv_dtype)
    common = dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=128, dtype=q_dtype,
                  kv_dtype=kv_dtype, device="cuda")
    nhd, hnd = plan_decode(**common), plan_decode(kv_layout="HND", **common)
    assert nhd.one_launch is not None and hnd.one_launch is not None
    assert hnd.implementation == nhd.implementation and hnd.one_launch.kernel == nhd.one_launch.kernel
    assert not nhd.one_launch.kernel.startswith(("prop1p", "prop1lp"))
    if batch == 64:  # no host rounds fit Llama 64 × 2k
        assert nhd.implementation == "one launch, live schedule"
    for plan in (nhd, hnd):  # a call that fell back to the Triton prop would make both sides equal without the one launch
        monkeypatch.setattr(plan, "_launchers_for", lambda *args, **kwargs: pytest.fail("the call took the Triton prop"))
    g = torch.Generator().manual_seed(batch)
    seq_lens = torch.randint(n_keys // 2, n_keys + 1, (batch,), generator=g).to(torch.int32).cuda()
    starts = (torch.randint(0, 200, (batch,), generator=g).to(torch.int32).cuda()).minimum(seq_lens)
    outs, counts = {}, {}
    for name, plan, kk, vv in (("nhd", nhd, k, v), ("hnd", hnd, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())):
        counts[name] = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
        scales = dict(k_scale=0.5, v_scale=2.0) if kv_dtype == torch.float8_e4m3fn else {}
        outs[name] = plan.run(q, kk, vv, seq_lens=seq_lens, starts=starts, seed=9, counts=counts[name], **scales)
    assert torch.equal(counts["hnd"], counts["nhd"])
    assert torch.equal(outs["hnd"], outs["nhd"])
    drawn = counts["nhd"].sum(-1)  # [B, H]: S per head, or a covered run's length
    assert (drawn.eq(128) | drawn.eq((seq_lens - starts).unsqueeze(1))).all()


@needs_hopper
def test_decode_runs_the_one_launch_prop_on_served_shapes():
    q, k, v = make_inputs(1, 32, 8, 128, 2048, torch.bfloat16, seed=6, q_scale=3.0)
    out, counts = decode(q, k, v, 128, kernel="prop", seed=3, return_counts=True)
    assert_counts_match_systematic(counts, dense_probs(q, k), 128, philox_uniforms(3, 0, torch.arange(32).reshape(1, 32)))
    assert math.isfinite(float(out.float().abs().max()))


# --------------------------------------------------------------------------- paged caches on an sm_90 GPU


def paged_case(layout: str, *, batch=3, heads=32, kv_heads=8, dim=128, n_keys=2048, page_size=16, seed=31):
    """q, the contiguous NHD K and V, and the same keys in shuffled pages: santa's NHD / HND pages, or vLLM's packed
    rows (K and V halves of one [pages, P, H_kv, 2·D] tensor, strided views)."""
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=seed, q_scale=3.0)
    k_pages, table = to_paged(k, page_size, seed=seed)
    v_pages, _ = to_paged(v, page_size, seed=seed)  # the same permutation: one table
    if layout == "packed":
        packed = torch.cat([k_pages, v_pages], dim=-1)
        k_pages, v_pages, layout = packed[..., :dim], packed[..., dim:], "NHD"
    elif layout == "HND":
        k_pages, v_pages = (x.transpose(1, 2).contiguous() for x in (k_pages, v_pages))
    return q, k, v, k_pages, v_pages, table, layout


@needs_hopper
@pytest.mark.parametrize("layout,dim,heads,kv_heads,page_size", [
    ("NHD", 128, 32, 8, 16), ("HND", 128, 32, 8, 32), ("packed", 128, 32, 8, 16), ("packed", 64, 14, 2, 64),
    ("NHD", 64, 9, 3, 1)])
def test_paged_caches_draw_the_triton_props_samples_in_one_launch(layout, dim, heads, kv_heads, page_size):
    """Paged K/V read through the block table on the device: the same samples as the Triton prop (up to float32 CDF
    rounding) and as the reference on the contiguous cache, covered sequences exact, a head offset drawn as there."""
    batch, n_keys, budget = 3, 2048, 128
    q, k, v, k_pages, v_pages, table, kv_layout = paged_case(layout, heads=heads, kv_heads=kv_heads, dim=dim,
                                                             n_keys=n_keys, page_size=page_size)
    seq_lens = torch.tensor([2048, 1001, 77], dtype=torch.int32, device="cuda")  # sampled, sampled, covered
    positions = (seq_lens - 1).long()
    seeds = torch.tensor([7, 8, 9], dtype=torch.int64, device="cuda")
    counts, outs = {}, {}
    for name, tuning in (("one launch", None), ("two launches", Tuning(one_launch=False))):
        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                           dtype=torch.bfloat16, device="cuda", kv_layout=kv_layout, page_size=page_size, tuning=tuning)
        assert (plan.one_launch is not None) == (tuning is None)
        counts[name] = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
        outs[name] = plan.run(q, k_pages, v_pages, seq_lens=seq_lens, block_table=table, seed=seeds, positions=positions,
                              head_offset=heads, counts=counts[name])
    uniforms = sampler_uniforms(seeds.cpu(), positions.cpu().unsqueeze(1), 2 * heads, "systematic", budget)
    uniforms = uniforms.reshape(batch, 2 * heads)[:, heads:]  # the global heads heads … 2·heads − 1
    for name in counts:
        assert_counts_match_systematic(counts[name][:2], dense_probs(q, k, seq_lens)[:2], budget, uniforms[:2])
    got = counts["one launch"]
    expected = torch.einsum("bhl,blhd->bhd", got.double(), v.double().repeat_interleave(heads // kv_heads, dim=2)) / budget
    covered = got[2, :, :77].eq(1).all() and got[2, :, 77:].eq(0).all()
    assert covered, "a sequence the budget covers is exact: each live key once"
    p = dense_probs(q, k, seq_lens)[2]
    exact = torch.einsum("hl,lhd->hd", p, v[2].double().repeat_interleave(heads // kv_heads, dim=1))
    torch.testing.assert_close(outs["one launch"][:2].double(), expected[:2], rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(outs["one launch"][2].double(), exact, rtol=2e-2, atol=2e-2)


def test_kernel_names_say_the_cache_type_and_refuse_fp8_with_fp16():
    assert ol.kernel_name(128, 4) == "prop1_d128_g4" and ol.kernel_name(64, 7, paged=True, f16=True, live=True) == "prop1lph_d64_g7"
    assert ol.kernel_name(128, 8, paged=True, fp8=True) == "prop1pf_d128_g8"
    with pytest.raises(ValueError, match="fp8 and f16"):
        ol.kernel_name(128, 4, fp8=True, f16=True)


@needs_hopper
@pytest.mark.parametrize("layout,dim,heads,kv_heads", [("contiguous", 128, 32, 8), ("packed", 128, 32, 8), ("packed", 64, 14, 2),
                                                       ("contiguous", 64, 9, 3)])
def test_fp16_plans_run_the_one_launch_and_draw_the_triton_props_samples(layout, dim, heads, kv_heads):
    """fp16 q, out and caches (a model served in half precision): the plan runs the one launch's fp16 kernel; its counts
    are the systematic sampler's and the Triton prop's on the same draws (up to float32 CDF rounding), a covered
    sequence is exact, the output is fp16 and the counts' mean."""
    batch, n_keys, budget = 3, 2048, 128
    q, k, v, k_pages, v_pages, table, _ = paged_case("packed", heads=heads, kv_heads=kv_heads, dim=dim, n_keys=n_keys)
    q, k, v, k_pages, v_pages = (x.to(torch.float16) for x in (q, k, v, k_pages, v_pages))
    page_size = 16 if layout == "packed" else None
    if page_size is None:
        k_pages, v_pages, table = k, v, None
    seq_lens = torch.tensor([2048, 1001, 77], dtype=torch.int32, device="cuda")  # sampled, sampled, covered
    counts, outs = {}, {}
    for name, tuning in (("one launch", None), ("two launches", Tuning(one_launch=False))):
        plan = plan_decode(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                           dtype=torch.float16, device="cuda", page_size=page_size, tuning=tuning)
        if tuning is None:
            assert plan.one_launch is not None and "h_d" in plan.one_launch.kernel
        counts[name] = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
        outs[name] = plan.run(q, k_pages, v_pages, seq_lens=seq_lens, block_table=table, seed=13, counts=counts[name])
    torch.cuda.synchronize()
    uniforms = philox_uniforms(13, 0, torch.arange(batch * heads).reshape(batch, heads))
    for name in counts:
        assert_counts_match_systematic(counts[name][:2], dense_probs(q, k, seq_lens)[:2], budget, uniforms[:2])
    got = counts["one launch"]
    assert got[2, :, :77].eq(1).all() and got[2, :, 77:].eq(0).all()
    assert outs["one launch"].dtype == torch.float16
    expected = torch.einsum("bhl,blhd->bhd", got.double(), v.double().repeat_interleave(heads // kv_heads, dim=2)) / budget
    torch.testing.assert_close(outs["one launch"][:2].double(), expected[:2], rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(outs["one launch"].float(), outs["two launches"].float(), rtol=0.1, atol=0.25)


@needs_hopper
def test_a_page_id_outside_the_pool_is_never_followed_and_poisons_only_its_sequence():
    q, k, v, k_pages, v_pages, table, _ = paged_case("packed", n_keys=1024)
    seq_lens = torch.tensor([1024, 1024, 500], dtype=torch.int32, device="cuda")
    table = table.clone()
    table[1, 7] = k_pages.shape[0] + 1000  # a live page of sequence 1: past the pool
    table[2, 40] = -5  # past sequence 2's 500 keys: never read
    plan = plan_decode(batch=3, heads=32, kv_heads=8, head_dim=128, n_keys=1024, budget=128, dtype=torch.bfloat16,
                       device="cuda", page_size=16)
    assert plan.one_launch is not None
    counts = torch.zeros(3, 32, 1024, dtype=torch.int32, device="cuda")
    out = plan.run(q, k_pages, v_pages, seq_lens=seq_lens, block_table=table, seed=3, counts=counts)
    torch.cuda.synchronize()
    assert out[1].isnan().all() and counts[1].sum() == 0
    assert not out[[0, 2]].isnan().any() and bool((counts[[0, 2]].sum(-1) == 128).all())


@needs_hopper
def test_plans_of_several_batch_sizes_share_one_set_of_buffers_through_their_workspaces():
    """As vLLM's backend runs them (one PagedDecoder, one plan per batch size, CUDA graphs): every plan's words are tagged
    with its groups' epochs, so calls that alternate between plans over one set of buffers draw what fresh buffers draw."""
    from santa.kernels import Workspace
    q, _, _, k_pages, v_pages, table, _ = paged_case("packed", batch=4, n_keys=4096)
    seq_lens = torch.tensor([4096, 3000, 2000, 1000], dtype=torch.int32, device="cuda")
    shared = ol.Buffers.allocate(batch=4, heads=32, kv_heads=8, budget=128, slots=ol.MAX_ONE_WAVE_SLICES,
                                 device=torch.device("cuda"))
    runs = []
    for batch in (4, 1, 2, 4, 1, 2):
        plan = plan_decode(batch=batch, heads=32, kv_heads=8, head_dim=128, n_keys=4096, budget=128, dtype=torch.bfloat16,
                           device="cuda", page_size=16)
        workspace = Workspace.within(plan.workspace_key, scratch=plan.workspace.buffer,
                                     semaphores=torch.zeros(batch * 32, dtype=torch.int32, device="cuda"),
                                     one_launch_buffers=shared)
        args = (q[:batch], k_pages, v_pages)
        kwargs = dict(seq_lens=seq_lens[:batch], block_table=table[:batch], seed=5, offset=len(runs))
        out = plan.run(*args, **kwargs, workspace=workspace)
        fresh = plan.run(*args, **kwargs)  # the plan's own buffers
        runs.append(bool(torch.equal(out, fresh)))
    assert all(runs)


@needs_hopper
def test_a_plan_still_launches_after_later_plans_probed_smaller_shared_memory():
    """vLLM's order (2026-12-05, `vllm serve` at max_model_len 33024): every captured batch size's plan is made first,
    ascending; batch 4 takes a one-launch plan, a later probe asks for less shared memory; then batch 4 runs. Its
    cooperative launch failed with CUresult 720 while each plan set the function's limit to its own."""
    n_keys = 33024
    q, _, _, k_pages, v_pages, table, _ = paged_case("packed", batch=4, n_keys=n_keys)
    plans = {batch: plan_decode(batch=batch, heads=32, kv_heads=8, head_dim=128, n_keys=n_keys, budget=128,
                                dtype=torch.bfloat16, device="cuda", page_size=16) for batch in (1, 2, 4, 8, 64, 512)}
    launch = plans[4].one_launch
    assert launch is not None
    # then a probe of less shared memory on the same function, as a later plan's smaller slices probe it (since
    # 69f8430 the batches above keep batch 4's 8 slices at this length, so the loop above no longer does it alone)
    assert launch.module.resident_per_sm(launch.kernel, 1024) > 0
    assert launch.module.shared_allowed[launch.kernel] >= launch.shared
    seq_lens = torch.full((4,), n_keys, dtype=torch.int32, device="cuda")
    out = plans[4].run(q, k_pages, v_pages, seq_lens=seq_lens, block_table=table, seed=7)
    torch.cuda.synchronize()
    assert out.isfinite().all()


# --------------------------------------------------------------------------- fp8 (e4m3) caches on an sm_90 GPU

FP8 = torch.float8_e4m3fn


@needs_hopper
@pytest.mark.parametrize("dim,heads,kv_heads", [(128, 32, 8), (64, 14, 2), (64, 9, 3)])
@pytest.mark.parametrize("layout", ["contiguous", "packed"])
@pytest.mark.parametrize("scale_kind", ["scalar", "per head"])
@pytest.mark.parametrize("q_range", [1.0, 2.0**60])
def test_fp8_caches_draw_the_dequantised_caches_samples_in_one_launch(dim, heads, kv_heads, layout, scale_kind, q_range):
    """e4m3 K and V with their scales: K read as float16 and q as float16 times a power of two (the Triton prop's
    products, also for queries far outside float16's range), V rows dequantised as gathered: the systematic
    sampler's counts on the dequantised keys (up to float32 CDF rounding) and their mean of the dequantised values,
    as the Triton prop draws them; a covered sequence exact."""
    batch, n_keys, budget = 3, 1536, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.float32, seed=41, q_scale=3.0)
    q = (q * q_range).to(torch.bfloat16)
    per_head = torch.tensor([0.5, 0.25, 1.0, 0.125, 2.0, 0.5, 0.25, 1.0][:kv_heads], device="cuda")
    k_arg, v_arg = (0.25, 0.5) if scale_kind == "scalar" else (per_head, per_head.flip(0).contiguous())
    k_values = torch.full((kv_heads,), k_arg, device="cuda") if scale_kind == "scalar" else k_arg
    v_values = torch.full((kv_heads,), v_arg, device="cuda") if scale_kind == "scalar" else v_arg
    k8, v8 = (k / k_values.view(1, 1, -1, 1)).to(FP8), (v / v_values.view(1, 1, -1, 1)).to(FP8)
    k_deq, v_deq = k8.float() * k_values.view(1, 1, -1, 1), v8.float() * v_values.view(1, 1, -1, 1)
    seq_lens = torch.tensor([1536, 700, 90], dtype=torch.int32, device="cuda")  # sampled, sampled, covered
    kwargs = dict(seq_lens=seq_lens, seed=6, offset=3, k_scale=k_arg, v_scale=v_arg)
    plan_kwargs = dict(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                       dtype=torch.bfloat16, kv_dtype=FP8, device="cuda")
    if layout == "packed":  # vLLM's uint8 cache, K|V halves of one row, viewed as e4m3
        k_pages, table = to_paged(k8.view(torch.uint8), 16, seed=4)
        v_pages, _ = to_paged(v8.view(torch.uint8), 16, seed=4)
        rows = torch.cat([k_pages, v_pages], dim=-1).view(FP8)
        k_cache, v_cache, kwargs["block_table"], plan_kwargs["page_size"] = rows[..., :dim], rows[..., dim:], table, 16
    else:
        k_cache, v_cache = k8, v8
    counts, outs = {}, {}
    for name, tuning in (("one launch", None), ("two launches", Tuning(one_launch=False))):
        plan = plan_decode(**plan_kwargs, tuning=tuning)
        assert (plan.one_launch is not None) == (tuning is None)
        counts[name] = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
        outs[name] = plan.run(q, k_cache, v_cache, counts=counts[name], **kwargs)
    probs = dense_probs(q, k_deq, seq_lens)
    uniforms = philox_uniforms(6, 3, torch.arange(batch * heads).reshape(batch, heads))
    for name in counts:
        assert_counts_match_systematic(counts[name][:2], probs[:2], budget, uniforms[:2])
    got = counts["one launch"]
    group = heads // kv_heads
    expected = torch.einsum("bhl,blhd->bhd", got.double(), v_deq.double().repeat_interleave(group, dim=2)) / budget
    torch.testing.assert_close(outs["one launch"][:2].double(), expected[:2], rtol=8e-3, atol=8e-3)
    assert got[2, :, :90].eq(1).all() and got[2, :, 90:].eq(0).all()
    exact = torch.einsum("hl,lhd->hd", probs[2], v_deq[2].double().repeat_interleave(group, dim=1))
    torch.testing.assert_close(outs["one launch"][2].double(), exact, rtol=2e-2, atol=2e-2)


@needs_hopper
def test_an_e4m3_nan_byte_poisons_its_kv_heads_in_the_one_launch():
    q, k, v = make_inputs(2, 32, 8, 128, 600, torch.float32, seed=12)
    k8, v8 = k.to(FP8), v.to(FP8)
    k8.view(torch.uint8)[1, 5, 3, 7] = 0x7F  # sequence 1, key 5, KV head 3: query heads 12–15
    plan = plan_decode(batch=2, heads=32, kv_heads=8, head_dim=128, n_keys=600, budget=128, dtype=torch.bfloat16,
                       kv_dtype=FP8, device="cuda")
    assert plan.one_launch is not None
    out = plan.run(q.bfloat16(), k8, v8, seq_lens=torch.tensor([600, 600], dtype=torch.int32, device="cuda"), k_scale=0.5)
    poisoned = torch.zeros(32, dtype=torch.bool, device="cuda")
    poisoned[12:16] = True
    assert out[1, poisoned].isnan().all() and torch.isfinite(out[1, ~poisoned]).all() and torch.isfinite(out[0]).all()


# --------------------------------------------------------------------------- the live schedule (issue 39), on an sm_90 GPU

def live_run(launch, q, k_pages, v_pages, table, seq_lens, *, seed=13, counts=None):
    out = torch.empty_like(q)
    return launch.run(q, k_pages, v_pages, out=out, strides=ol.cache_strides(k_pages, v_pages, "NHD"), seq_lens=seq_lens,
                      block_table=table, seed=seed, counts=counts)


@needs_hopper
@pytest.mark.parametrize("dim,heads,kv_heads,fp8", [(128, 32, 8, False), (64, 14, 2, False), (128, 32, 8, True),
                                                     (128, 64, 8, False), (128, 64, 8, True)])
def test_the_live_schedule_draws_the_systematic_samples_and_the_same_on_every_capacity(dim, heads, kv_heads, fp8):
    """A live launch derives its work from seq_lens: on vLLM's packed pages its counts are the systematic sampler's
    (up to float32 CDF rounding), covered sequences exact, and plans of 4k, 32k and 128k keys give the same bits; also
    on the halved slices of G = 8 (2,048 keys: two CTAs per SM where 4,096-key slices leave one)."""
    batch, n_keys, budget = 4, 4096, 128
    q, k, v, k_pages, v_pages, table, _ = paged_case("packed", batch=batch, heads=heads, kv_heads=kv_heads, dim=dim,
                                                     n_keys=n_keys)
    if fp8:
        k_pages, v_pages = k_pages.to(ol.FP8), v_pages.to(ol.FP8)
        k, v = k.to(ol.FP8).to(torch.bfloat16), v.to(ol.FP8).to(torch.bfloat16)
    seq_lens = torch.tensor([4096, 2500, 1001, 77], dtype=torch.int32, device="cuda")  # sampled ×3, covered
    outs, counts = [], []
    for capacity in (4096, 32768, 131072):
        launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=capacity, budget=budget,
                              scale=dim**-0.5, device=torch.device("cuda"), page_size=16, fp8=fp8, live=True)
        assert launch.plan.name == "live" and launch.kernel.startswith("prop1lp")
        assert heads // kv_heads < 7 or (launch.per_sm, launch.plan.limits.slice_cap) == (2, 2048)
        count = torch.zeros(batch, heads, capacity, dtype=torch.int32, device="cuda")  # counts are [B, H, capacity]
        outs.append(live_run(launch, q, k_pages, v_pages, table, seq_lens, counts=count))
        assert count[..., n_keys:].eq(0).all()
        counts.append(count[..., :n_keys])
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:]) and all(torch.equal(counts[0], c) for c in counts[1:])
    probs = dense_probs(q, k, seq_lens)
    assert_counts_match_systematic(counts[0][:3], probs[:3], budget,
                                   philox_uniforms(13, 0, torch.arange(batch * heads).reshape(batch, heads))[:3])
    assert counts[0][3, :, :77].eq(1).all() and counts[0][3, :, 77:].eq(0).all()
    expected = torch.einsum("bhl,blhd->bhd", counts[0].double(), v.double().repeat_interleave(heads // kv_heads, dim=2)) / budget
    torch.testing.assert_close(outs[0][:3].double(), expected[:3], rtol=8e-3, atol=8e-3)


@needs_hopper
@pytest.mark.parametrize("dim,heads,kv_heads,fp8", [(128, 32, 8, False), (64, 14, 2, True)])
def test_a_contiguous_live_launch_draws_the_systematic_samples_on_every_capacity(dim, heads, kv_heads, fp8):
    """A contiguous cache (HF's static cache: ``[B, capacity, H_kv, D]``) on the live schedule: the systematic
    sampler's counts (up to float32 CDF rounding), covered sequences exact, the same bits on caches of 4k, 32k and 128k
    keys whose first 4k hold the same keys, and the host-built rounds' output on the same draws (up to that rounding)."""
    batch, n_keys, budget = 4, 4096, 128
    q, k, v = make_inputs(batch, heads, kv_heads, dim, n_keys, torch.bfloat16, seed=31, q_scale=3.0)
    if fp8:
        k, v = k.to(ol.FP8), v.to(ol.FP8)
    seq_lens = torch.tensor([4096, 2500, 1001, 77], dtype=torch.int32, device="cuda")  # sampled ×3, covered
    outs, counts = [], []
    for capacity in (4096, 32768, 131072):
        k_c, v_c = (torch.zeros(batch, capacity, kv_heads, dim, dtype=x.dtype, device="cuda") for x in (k, v))
        k_c[:, :n_keys], v_c[:, :n_keys] = k, v
        launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=capacity, budget=budget,
                              scale=dim**-0.5, device=torch.device("cuda"), fp8=fp8, live=True)
        assert launch.plan.name == "live" and launch.kernel == ol.kernel_name(dim, heads // kv_heads, fp8=fp8, live=True)
        count = torch.zeros(batch, heads, capacity, dtype=torch.int32, device="cuda")
        outs.append(launch.run(q, k_c, v_c, out=torch.empty_like(q), strides=ol.cache_strides(k_c, v_c, "NHD"),
                               seq_lens=seq_lens, seed=13, counts=count))
        assert count[..., n_keys:].eq(0).all()
        counts.append(count[..., :n_keys])
    rounds = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                          scale=dim**-0.5, device=torch.device("cuda"), fp8=fp8)
    rounds_out = rounds.run(q, k, v, out=torch.empty_like(q), strides=ol.cache_strides(k, v, "NHD"), seq_lens=seq_lens,
                            seed=13)
    torch.cuda.synchronize()
    assert all(torch.equal(outs[0], o) for o in outs[1:]) and all(torch.equal(counts[0], c) for c in counts[1:])
    k_ref, v_ref = (x.to(torch.bfloat16) for x in (k, v))
    uniforms = philox_uniforms(13, 0, torch.arange(batch * heads).reshape(batch, heads))
    assert_counts_match_systematic(counts[0][:3], dense_probs(q, k_ref, seq_lens)[:3], budget, uniforms[:3])
    assert counts[0][3, :, :77].eq(1).all() and counts[0][3, :, 77:].eq(0).all()
    expected = torch.einsum("bhl,blhd->bhd", counts[0].double(), v_ref.double().repeat_interleave(heads // kv_heads, dim=2)) / budget
    torch.testing.assert_close(outs[0][:3].double(), expected[:3], rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(outs[0].float(), rounds_out.float(), rtol=0.1, atol=0.25)


@needs_hopper
@pytest.mark.parametrize("dim,group_size", sorted(ol.SHAPES))
@pytest.mark.parametrize("paged,fp8,live", [(False, False, False), (False, True, True), (True, False, True),
                                            (True, True, False)])
def test_every_served_head_shape_draws_the_systematic_samples(dim, group_size, paged, fp8, live):
    """Each (d, G) of SHAPES in four of its eight kernels (contiguous or vLLM's packed pages, bf16 or e4m3, host-built
    rounds or the live schedule; the other four differ from these only in those same template switches): the
    systematic sampler's counts (up to float32 CDF rounding), a covered sequence exact, the output the counts' mean."""
    batch, kv_heads, n_keys, budget = 3, 2, 3000, 128
    heads = kv_heads * group_size
    q, k, v, k_pages, v_pages, table, _ = paged_case("packed", batch=batch, heads=heads, kv_heads=kv_heads, dim=dim,
                                                     n_keys=n_keys, seed=group_size)
    if not paged:
        k_pages, v_pages, table = k, v, None
    if fp8:
        k_pages, v_pages = k_pages.to(ol.FP8), v_pages.to(ol.FP8)
        k, v = k.to(ol.FP8).to(torch.bfloat16), v.to(ol.FP8).to(torch.bfloat16)
    seq_lens = torch.tensor([3000, 1777, 100], dtype=torch.int32, device="cuda")  # sampled, sampled, covered
    launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                          scale=dim**-0.5, device=torch.device("cuda"), page_size=16 if paged else None, fp8=fp8, live=live)
    assert launch.kernel == ol.kernel_name(dim, group_size, paged=paged, fp8=fp8, live=live)
    counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
    out = launch.run(q, k_pages, v_pages, out=torch.empty_like(q), strides=ol.cache_strides(k_pages, v_pages, "NHD"),
                     seq_lens=seq_lens, block_table=table, seed=13, counts=counts)
    uniforms = philox_uniforms(13, 0, torch.arange(batch * heads).reshape(batch, heads))
    assert_counts_match_systematic(counts[:2], dense_probs(q, k, seq_lens)[:2], budget, uniforms[:2])
    assert counts[2, :, :100].eq(1).all() and counts[2, :, 100:].eq(0).all()
    expected = torch.einsum("bhl,blhd->bhd", counts.double(), v.double().repeat_interleave(group_size, dim=2)) / budget
    torch.testing.assert_close(out[:2].double(), expected[:2], rtol=8e-3, atol=8e-3)


@needs_hopper
def test_a_live_launch_mixes_slice_counts_and_rounds():
    """Lengths that take three slice-count classes (Llama, at least 4 slices a sequence: 4, 8 and 16 slices of up to
    4,096 keys) and two rounds on the grid: the schedule's order across classes, each class's first item and the item
    search, on the device."""
    batch, heads, kv_heads, dim, n_keys, budget = 6, 32, 8, 128, 40960, 128
    q, k, v, k_pages, v_pages, table, _ = paged_case("packed", batch=batch, n_keys=n_keys)
    lengths = [0, 77, 5000, 17000, 40000, 40960]
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                          scale=dim**-0.5, device=torch.device("cuda"), page_size=16, live=True, min_slices=4)
    limits = launch.plan.limits
    schedule = live_schedule(lengths, n=n_keys, kv_heads=kv_heads, slice_cap=limits.slice_cap, min_slices=limits.min_slices,
                             max_slices=limits.max_slices, ctas=limits.ctas)
    assert len(set(schedule.slices)) == 3 and schedule.rounds == 2, (schedule.slices, schedule.rounds)
    counts = torch.zeros(batch, heads, n_keys, dtype=torch.int32, device="cuda")
    out = live_run(launch, q, k_pages, v_pages, table, seq_lens, counts=counts)
    torch.cuda.synchronize()
    sampled = [2, 3, 4, 5]
    uniforms = philox_uniforms(13, 0, torch.arange(batch * heads).reshape(batch, heads))
    assert_counts_match_systematic(counts[sampled], dense_probs(q, k, seq_lens)[sampled], budget, uniforms[sampled])
    assert counts[1, :, :77].eq(1).all() and counts[1, :, 77:].eq(0).all() and counts[0].eq(0).all()
    expected = torch.einsum("bhl,blhd->bhd", counts.double(), v.double().repeat_interleave(heads // kv_heads, dim=2)) / budget
    torch.testing.assert_close(out[sampled].double(), expected[sampled], rtol=8e-3, atol=8e-3)


@needs_hopper
def test_a_live_launch_writes_the_same_bits_into_an_out_at_any_element_offset():
    """The live gather stores each output vector's 8 values in one 16-byte store where ``out`` allows it, element by
    element where a contiguous view starts off a 16-byte boundary: the same bits either way."""
    batch, heads, kv_heads, dim, n_keys, budget = 8, 32, 8, 128, 2048, 128
    q, _, _, k_pages, v_pages, table, _ = paged_case("packed", batch=batch, n_keys=n_keys)
    seq_lens = torch.tensor([2048, 1500, 700, 2048, 300, 1024, 2000, 129], dtype=torch.int32, device="cuda")
    launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=n_keys, budget=budget,
                          scale=dim**-0.5, device=torch.device("cuda"), page_size=16, live=True)
    strides = ol.cache_strides(k_pages, v_pages, "NHD")
    aligned = launch.run(q, k_pages, v_pages, out=torch.empty_like(q), strides=strides, seq_lens=seq_lens,
                         block_table=table, seed=13)
    storage = torch.full((q.numel() + 1,), float("nan"), dtype=q.dtype, device="cuda")
    shifted = storage[1:].view_as(q)  # contiguous, 2 bytes past a 16-byte boundary
    launch.run(q, k_pages, v_pages, out=shifted, strides=strides, seq_lens=seq_lens, block_table=table, seed=13)
    torch.cuda.synchronize()
    assert shifted.data_ptr() % 16 == 2 and torch.equal(shifted, aligned) and storage[0].isnan()


@needs_hopper
@pytest.mark.parametrize("batch,heads,kv_heads,dim", [(48, 32, 8, 128), (160, 14, 2, 64)])
def test_a_live_launch_of_one_slice_a_group_gathers_its_vectors_in_chunks(batch, heads, kv_heads, dim):
    """More groups than the grid holds: every sequence in one slice (C_b = 1, two rounds), so one CTA owns all of a
    group's output vectors (Llama 64, Qwen 56) and gathers them in chunks of what its shared memory holds beside the
    resolved rows (Qwen 15, Llama 18; the last chunk shorter): the systematic counts and the counts' mean of the V rows, bitwise the same on a 32k plan."""
    n_keys, budget = 4096, 128
    q, k, v, k_pages, v_pages, table, _ = paged_case("packed", batch=batch, heads=heads, kv_heads=kv_heads, dim=dim,
                                                     n_keys=n_keys)
    slice_cap = ol.ROUNDS_SLICE_KEYS[dim]  # live slices hold at most this many keys (Qwen: 2,048): one slice a sequence
    lengths = torch.randint(200, slice_cap + 1, (batch,), generator=torch.Generator().manual_seed(5)).tolist()
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    outs, counts = [], []
    for capacity in (n_keys, 32768):
        launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=capacity, budget=budget,
                              scale=dim**-0.5, device=torch.device("cuda"), page_size=16, live=True)
        limits = launch.plan.limits
        schedule = live_schedule(lengths, n=capacity, kv_heads=kv_heads, slice_cap=limits.slice_cap,
                                 min_slices=limits.min_slices, max_slices=limits.max_slices, ctas=limits.ctas)
        assert set(schedule.slices) == {1} and schedule.rounds == 2, (set(schedule.slices), schedule.rounds)
        count = torch.zeros(batch, heads, capacity, dtype=torch.int32, device="cuda")
        outs.append(live_run(launch, q, k_pages, v_pages, table, seq_lens, counts=count))
        counts.append(count[..., :n_keys])
    torch.cuda.synchronize()
    assert torch.equal(outs[0], outs[1]) and torch.equal(counts[0], counts[1])
    uniforms = philox_uniforms(13, 0, torch.arange(batch * heads).reshape(batch, heads))
    assert_counts_match_systematic(counts[0], dense_probs(q, k, seq_lens), budget, uniforms)
    expected = torch.einsum("bhl,blhd->bhd", counts[0].double(), v.double().repeat_interleave(heads // kv_heads, dim=2)) / budget
    torch.testing.assert_close(outs[0].double(), expected, rtol=8e-3, atol=8e-3)


@needs_hopper
def test_paged_plans_choose_the_live_schedule_and_say_so():
    """plan_decode picks the one launch's kernels once: a paged plan whose host-built rounds exceed one wave or cut a group
    in at most 2 slices the live schedule (whatever its capacity), one whose rounds fit one wave in more slices those
    rounds (they follow the live keys already), a contiguous one host-built rounds of more than 2 slices a group where
    they fit and the live schedule otherwise, Tuning(one_launch=False) the Triton prop; past a live launch's 1,024
    sequences, host-built rounds or the Triton prop."""
    common = dict(heads=32, kv_heads=8, head_dim=128, budget=128, dtype=torch.bfloat16, device="cuda")
    for capacity in (2048, 131072):
        plan = plan_decode(batch=64, n_keys=capacity, page_size=16, **common)
        assert plan.implementation == "one launch, live schedule" and plan.one_launch.kernel == "prop1lp_d128_g4"
    for capacity in (8192, 131072):  # one sequence: one wave of host-built slices
        plan = plan_decode(batch=1, n_keys=capacity, page_size=16, **common)
        assert plan.implementation.startswith("one launch, host rounds C") and len(plan.one_launch.plan.rounds) == 1
    # Qwen's shape: 16 sequences take one wave of 8 slices a group, 64 one of 2 slices, which the live kernel serves
    qwen = dict(common, heads=14, kv_heads=2, head_dim=64)
    assert plan_decode(batch=16, n_keys=2048, page_size=16, **qwen).implementation == "one launch, host rounds C8"
    assert plan_decode(batch=64, n_keys=2048, page_size=16, **qwen).implementation == "one launch, live schedule"
    assert plan_decode(batch=1, n_keys=8192, **common).implementation.startswith("one launch, host rounds C")
    # contiguous: host-built rounds of more than 2 slices a group where they fit (a static cache is mostly full), the
    # live schedule where they cut a group in 1 or 2 slices (Qwen 64 and 256 sequences) or none fits
    assert plan_decode(batch=8, n_keys=32768, **common).implementation.startswith("one launch, host rounds C")
    assert plan_decode(batch=16, n_keys=2048, **qwen).implementation == "one launch, host rounds C8"
    for batch in (64, 256):
        assert plan_decode(batch=batch, n_keys=2048, **qwen).implementation == "one launch, live schedule"
    plan = plan_decode(batch=64, n_keys=2048, **common)
    assert plan.implementation == "one launch, live schedule" and plan.one_launch.kernel == "prop1l_d128_g4"
    assert plan_decode(batch=64, n_keys=2048, page_size=16, tuning=Tuning(one_launch=False), **common).implementation == "triton"
    assert "live" not in plan_decode(batch=1025, n_keys=2048, page_size=16, **common).implementation


@needs_hopper
def test_a_captured_live_launch_follows_lengths_that_change_on_the_device():
    """One graph, replayed as the step's lengths change (many short sequences, one long, all at the capacity, empty
    ones): each replay gives what an eager launch of those lengths gives, bit for bit."""
    batch, heads, kv_heads, dim, n_keys = 64, 32, 8, 128, 4096
    q, _, _, k_pages, v_pages, table, _ = paged_case("packed", batch=batch, n_keys=n_keys)
    launch = ol.OneLaunch(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=dim, n_keys=32768, budget=128,
                          scale=dim**-0.5, device=torch.device("cuda"), page_size=16, live=True)
    seq_lens = torch.full((batch,), 2048, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    strides = ol.cache_strides(k_pages, v_pages, "NHD")
    call = dict(out=out, strides=strides, seq_lens=seq_lens, block_table=table, seed=3)
    launch.run(q, k_pages, v_pages, **call)  # its own buffers, before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.run(q, k_pages, v_pages, **call)
    for lengths in ([2048] * 64, [300] * 63 + [4096], [4096] * 64, [0, 1, 129, 4095] * 16):
        seq_lens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        replayed = out.clone()
        eager = live_run(launch, q, k_pages, v_pages, table, seq_lens.clone(), seed=3)
        torch.cuda.synchronize()
        torch.testing.assert_close(replayed, eager, rtol=0, atol=0, equal_nan=True, msg=lambda m, at=lengths: f"{at[:4]}…: {m}")


def test_a_live_launch_refuses_what_its_kernels_do_not_serve():
    """Host checks before any device work (a stand-in module: no GPU needed)."""
    class Module:
        def resident_per_sm(self, name, shared):
            return 2

    launch = ol.OneLaunch.__new__(ol.OneLaunch)
    launch.module = Module()
    kwargs = dict(name="prop1lp_d128_g4", group_size=4, head_dim=128, budget=128, sms=132)
    contiguous = launch._live_plan(batch=4, n_keys=4096, page_size=None, **dict(kwargs, name="prop1l_d128_g4"))
    assert contiguous.limits.shared < launch._live_plan(batch=4, n_keys=4096, page_size=16, **kwargs).limits.shared
    with pytest.raises(ValueError, match="at most 1024 sequences"):
        launch._live_plan(batch=1025, n_keys=4096, page_size=16, **kwargs)
    with pytest.raises(ValueError, match="at most 262144 keys"):
        launch._live_plan(batch=4, n_keys=262145, page_size=16, **kwargs)
    plan = launch._live_plan(batch=4, n_keys=131072, page_size=16, **kwargs)
    assert (plan.grid, plan.slots, plan.limits.min_slices) == (264, 64, 1)
    assert [v.value for v in launch.live_values] == [4, 4096, 0, 6]
    for bad in (0, 3, 128, 2.0):
        with pytest.raises(ValueError, match="min_slices must be a power of two in"):
            launch._live_plan(batch=4, n_keys=4096, page_size=16, min_slices=bad, **kwargs)
    launch._live_plan(batch=4, n_keys=4096, page_size=16, min_slices=4, **kwargs)
    assert [v.value for v in launch.live_values] == [4, 4096, 2, 6]
    launch.plan, launch.page_size, launch.kv_heads, launch.shape = plan, 16, 8, dict(batch=4)
    x = torch.zeros(1)
    # a live launch's marks: as many slots as any lengths can take (4 × 8 groups in 64 slices over 256 lanes: 8 rounds)
    assert launch.marks_slots() == 264 * 8
    for marks in (torch.zeros(264 * 8 - 1, 9, 2, dtype=torch.int64), torch.zeros(264 * 8, 9, 2, dtype=torch.int32),
                  torch.zeros(264 * 8, 18, dtype=torch.int64)):
        with pytest.raises(ValueError, match=r"marks: a contiguous int64 \[≥ 2112, 9, 2\]"):
            launch.run(x, x, x, out=x, strides=(8, 8, 8), marks=marks)
    pool = torch.zeros(1).expand(2**27)  # 2**27 pages of 16 keys: 2**31 rows, past the gather's int32 rows
    with pytest.raises(ValueError, match="k: a live launch takes pools of fewer than 2\\*\\*31 rows"):
        launch.run(x, pool, pool, out=x, strides=(8, 8, 8))
