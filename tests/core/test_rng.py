"""santa.rng: one seed range for every entry point, and seed → Philox key/counter and generators.

The hf paths draw what they drew before issue 23 (the mixer's values are pinned from the old
``santa.hf.stream_id``); santa.model now keys layers on ``rng.layer_key`` so that every seed in
[0, 2**63) is legal there too (it used to stop near 2**63 / 1000003, after the model had prefilled).
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

import santa
import santa.hf
from helpers import refusal
from santa import cliargs, rng
from santa.model import CONFIGS, generate, make_context, prefill

GOOD_SEEDS = [0, 1, 10**13, 2**62, 2**63 - 1]
BAD_SEEDS = [(2**63, ValueError), (-1, ValueError), (1.0, TypeError)]
TINY = CONFIGS["tiny"]

# santa.hf.stream_id(seed, layer, n_keys, n_queries) as computed by the code before santa.rng
OLD_STREAM_IDS = {
    (0, 0, 1, 1): 1995974887614534117,
    (0, 3, 130, 1): 8319272725285627301,
    (7, 1, 64, 8): 911640930741845515,
    (10**13, 2, 4096, 1): 985193076618885442,
    (2**63 - 1, 31, 100000, 1): 905061942560572970,
    (0, 5, 17, 1): 6593161946788189138,
}


# ---- the mixer and the keys ------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "expected"), OLD_STREAM_IDS.items())
def test_the_hf_streams_are_those_of_the_old_stream_id(args, expected):
    assert rng.hf_stream_id(*args) == expected
    assert rng.mix(*args) == expected


def test_the_hf_reference_generator_is_seeded_with_the_stream():
    assert rng.hf_reference_generator(7, 1, 64, 8, "cpu").initial_seed() == OLD_STREAM_IDS[(7, 1, 64, 8)]


@pytest.mark.parametrize("seed", GOOD_SEEDS)
def test_every_layer_key_is_a_legal_philox_key_and_distinct_seeds_stay_distinct(seed):
    keys = [rng.layer_key(seed, layer) for layer in range(64)]
    assert all(0 <= key < rng.MAX_SEED for key in keys)
    assert len(set(keys)) == len(keys)
    for other in {0, 1, seed ^ 1, rng.MAX_SEED - 1 - seed} - {seed}:
        assert rng.layer_key(other, 3) != rng.layer_key(seed, 3)  # a bijection of the seed per layer


def test_santa_model_no_longer_keys_on_seed_times_1000003():
    """The stated behaviour change: santa.model's per-layer key is rng.layer_key, not seed·1000003 + layer."""
    assert [rng.layer_key(3, layer) for layer in range(4)] == [rng.mix(3, layer) for layer in range(4)]
    assert rng.layer_key(3, 0) != 3 * 1000003


# ---- one range, checked by every entry point ----------------------------------------------------


@pytest.mark.parametrize("seed", [*GOOD_SEEDS, np.int64(5), np.uint64(2**63 - 1)])
def test_check_seed_takes_the_whole_range(seed):
    assert rng.check_seed(seed) == int(seed) and type(rng.check_seed(seed)) is int


@pytest.mark.parametrize(("seed", "error"), [*BAD_SEEDS, (True, TypeError), ("3", TypeError), (None, TypeError), (2**70, ValueError)])
def test_check_seed_refuses_by_name(seed, error):
    with pytest.raises(error, match="my_seed must be an int"):
        rng.check_seed(seed, "my_seed")


def test_one_seed_constant():
    import santa.eval.runner

    assert cliargs.MAX_SEED is santa.hf.MAX_SEED is santa.eval.runner.MAX_SEED is rng.MAX_SEED == 2**63


def seed_flags():
    """The type functions of every seed flag, by command (the parsers are built without running them)."""
    from benchmarks.bench import real

    from santa.budgets import ablate_cli, tune_cli
    from santa.cli import build_parser as santa_parser
    from santa.eval.cli import build_parser as eval_parser

    return {
        "santa generate --seed": _flag(santa_parser(), "generate", "--seed"),
        "santa eval run --seeds": _flag(eval_parser(), "run", "--seeds"),
        "santa ablate layers --seeds": _flag(ablate_cli.build_parser(), "layers", "--seeds"),
        "santa tune evaluate --seeds": _flag(tune_cli.build_parser(), "evaluate", "--seeds"),
        "santa bench real --seed": _flag(real.build_parser(), None, "--seed"),
    }


def _flag(parser: argparse.ArgumentParser, command: str | None, flag: str):
    if command is not None:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[command]
    return parser._option_string_actions[flag].type


@pytest.mark.parametrize("flag", sorted(seed_flags()))
def test_every_seed_flag_takes_the_whole_range(flag):
    parse = seed_flags()[flag]
    for seed in GOOD_SEEDS:
        value = parse(str(seed))
        assert value == seed or value == [seed]


@pytest.mark.parametrize("flag", sorted(seed_flags()))
@pytest.mark.parametrize("text", [str(2**63), "-1", "1.0"])
def test_every_seed_flag_refuses_outside_the_range(flag, text):
    with pytest.raises(argparse.ArgumentTypeError):
        seed_flags()[flag](text)


@pytest.mark.parametrize("argv", [["--seed", str(2**63)], ["--seed", "-1"], ["--seed", "1.0"]])
def test_bench_e2e_refuses_a_seed_outside_the_range_before_any_work(argv, capsys):
    from benchmarks.bench import e2e

    assert "argument --seed" in refusal(e2e.main, argv, capsys)


@pytest.mark.parametrize("seed", GOOD_SEEDS)
def test_santa_config_takes_the_whole_range(seed):
    assert santa.hf.SantaConfig(seed=seed).seed == seed


@pytest.mark.parametrize(("seed", "error"), BAD_SEEDS)
def test_santa_config_refuses_outside_the_range(seed, error):
    with pytest.raises(error, match="seed must be an int"):
        santa.hf.SantaConfig(seed=seed)


def _decode_inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(1, 2, 16, generator=g), torch.randn(1, 20, 1, 16, generator=g), torch.randn(1, 20, 1, 16, generator=g)


def _plan_run(seed):
    from santa.kernels import plan_decode

    q, k, v = _decode_inputs()
    plan = plan_decode(batch=1, heads=2, kv_heads=1, head_dim=16, n_keys=20, budget=8, dtype=torch.float32, device="cpu", kernel="prop")
    return plan.run(q, k, v, seed=seed, offset=2)


def _decode(seed):
    q, k, v = _decode_inputs()
    return santa.decode(q, k, v, 8, seed=seed, offset=2)


def _grid(seed):
    from santa.eval.runner import grid

    return grid(models=["m"], tasks=["niah_single"], lengths=[512], methods=["systematic"], budgets=[16], prompts=[0], seeds=[seed])


def _layer_cells(seed):
    from santa.budgets.ablate import layer_cells

    return layer_cells(n_layers=2, base=4, seeds=[seed])


LIBRARY_CALLS = {"santa.decode": _decode, "DecodePlan.run": _plan_run, "eval grid seeds": _grid, "ablate layer_cells seeds": _layer_cells}


def _spec_decode(seed):
    """``ô = (1/8) Σ_j c_j v_j``, c the systematic counts (:func:`santa.sample_counts`) of ``softmax(q·kᵀ/√d)``
    on the Philox uniforms keyed on the whole ``seed`` (offset 2): what _decode and _plan_run must return."""
    from santa.kernels.reference import call_uniforms

    q, k, v = _decode_inputs()  # one KV head for both query heads, d = 16
    probs = torch.softmax(torch.einsum("bhd,bld->bhl", q.double(), k[:, :, 0].double()) / 4, dim=-1)
    counts = santa.sample_counts(probs, 8, "systematic", uniforms=call_uniforms(seed, 2, None, 1, 2))
    return (torch.einsum("bhl,bld->bhd", counts.double(), v[:, :, 0].double()) / 8).float()


def _check_entry_point(call, seed, result):
    """The seed reached the call whole: the Philox key of the draws, or the seed of every job or cell."""
    if call in ("santa.decode", "DecodePlan.run"):
        torch.testing.assert_close(result, _spec_decode(seed))
    else:
        assert result and all(item.seed == seed and type(item.seed) is int for item in result), result


@pytest.mark.parametrize("call", sorted(LIBRARY_CALLS))
@pytest.mark.parametrize("seed", GOOD_SEEDS)
def test_library_entry_points_take_the_whole_range(torch_fallback, call, seed):
    """Each call accepts every seed in [0, 2**63) and uses it as given (no wrap, no truncation)."""
    _check_entry_point(call, seed, LIBRARY_CALLS[call](seed))


@pytest.mark.parametrize("call", ["santa.decode", "DecodePlan.run", "ablate layer_cells seeds"])
@pytest.mark.parametrize(("seed", "error"), BAD_SEEDS)
def test_library_entry_points_refuse_outside_the_range(torch_fallback, call, seed, error):
    with pytest.raises(error, match="seed"):
        LIBRARY_CALLS[call](seed)


@pytest.mark.parametrize("seed", [2**63, -1, 1.0])
def test_the_eval_grid_refuses_outside_the_range(seed):
    with pytest.raises(ValueError, match="seeds must be integers"):  # the grid's own convention: ValueError
        _grid(seed)


# ---- santa.model: every seed, every sampled backend ----------------------------------------------


@pytest.mark.parametrize("backend", ["systematic", "santa-prop"])
@pytest.mark.parametrize("seed", GOOD_SEEDS)
def test_make_context_takes_the_whole_range_and_decodes(torch_fallback, tiny_transformer, backend, seed):
    tiny_transformer.setup_caches(1, 12)
    prefill(tiny_transformer, torch.arange(1, 9).unsqueeze(0))
    ctx = make_context(tiny_transformer, backend, prompt_len=8, budget=4, seed=seed)
    assert ctx.seed == seed
    assert ctx.layer_keys[:, 0].tolist() == [rng.layer_key(seed, i) for i in range(TINY.n_layer)]
    attn, cache = tiny_transformer.layers[0].attention, tiny_transformer.layers[0].attention.kv_cache
    ctx.prepare(torch.tensor([8]))
    q = torch.randn(1, TINY.n_head, TINY.head_dim)
    with torch.inference_mode():
        out = ctx.attend(q, cache.k_cache, cache.v_cache, ctx, attn.layer_id)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("backend", ["systematic", "santa-prop"])
@pytest.mark.parametrize(("seed", "error"), BAD_SEEDS)
def test_make_context_refuses_outside_the_range(tiny_transformer, backend, seed, error):
    tiny_transformer.setup_caches(1, 12)
    with pytest.raises(error, match="seed must be an int"):
        make_context(tiny_transformer, backend, prompt_len=8, budget=4, seed=seed)


@pytest.mark.parametrize(("seed", "error"), BAD_SEEDS)
def test_generate_refuses_outside_the_range_before_any_work(tiny_transformer, monkeypatch, seed, error):
    def no_caches(*args, **kwargs):
        raise AssertionError("work started before the seed was checked")

    monkeypatch.setattr(tiny_transformer, "setup_caches", no_caches)
    with pytest.raises(error, match="seed must be an int"):
        generate(tiny_transformer, [[1, 2, 3]], 2, backend="santa-prop", seed=seed, cuda_graph=False)


@pytest.mark.parametrize("backend", ["santa-prop", "systematic"])
def test_a_seed_of_10_13_runs_end_to_end_and_is_repeatable(torch_fallback, tiny_transformer, backend):
    """``--seed 10**13 --path fast`` used to be refused after the model had loaded and prefilled."""
    runs = [generate(tiny_transformer, [[1, 2, 3, 4, 5], [6, 7]], 3, backend=backend, budget=2, seed=10**13, cuda_graph=False) for _ in range(2)]
    assert [r.tolist() for r in runs[0]] == [r.tolist() for r in runs[1]]
    assert [len(r) for r in runs[0]] == [3, 3]


def test_generate_run_refuses_a_bad_seed_before_loading_the_model(monkeypatch):
    import santa.generate

    def refuse(*args, **kwargs):
        raise AssertionError("the model loaded before the seed was checked")

    monkeypatch.setattr(santa.generate, "load_model", refuse)
    for seed, error in BAD_SEEDS:
        for path in ("hf", "fast"):
            with pytest.raises(error, match="seed must be an int"):
                santa.generate.run(seed=seed, path=path)
