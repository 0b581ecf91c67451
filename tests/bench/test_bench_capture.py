"""CPU checks of the real-attention benchmark inputs: capture from SmolLM2 and the accuracy path."""

from __future__ import annotations

import pytest
import torch
from benchmarks.bench import capture as cap_mod
from benchmarks.bench import kernels as kb

from helpers import refusal


def test_capture_and_real_accuracy(tmp_path):
    from santa.assets import load_model

    model, _ = load_model("smollm2-135m")
    torch.manual_seed(0)
    ids = torch.randint(0, 1000, (1, 40))
    cap = cap_mod.capture(model, ids, [0, 29])
    assert model.config._attn_implementation == "sdpa"  # restored
    assert set(cap["layers"]) == {0, 29}
    t = cap["layers"][29]
    assert t["q"].shape == (1, 9, 64) and t["k"].shape == (1, 40, 3, 64) and t["v"].shape == (1, 40, 3, 64)
    assert t["q"].dtype == torch.bfloat16 and abs(cap["scale"] - 0.125) < 1e-9

    # the captured cache is the model's own cache (post-RoPE K), and q reproduces the step's attention
    with torch.inference_mode():
        out = model(ids, use_cache=True)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    keys = cache.layers[29].keys if hasattr(cache, "layers") else cache[29][0]
    assert torch.allclose(keys.transpose(1, 2).to(torch.bfloat16).float(), t["k"].float())

    path = tmp_path / "cap.pt"
    torch.save(cap, path)
    loaded = kb.load_capture(str(path))
    q, k, v = kb.real_inputs(loaded, 29, 100, torch.device("cpu"))  # tiled past the 40 captured keys
    assert k.shape == (1, 100, 3, 64) and torch.equal(k[:, 40:80], k[:, :40])
    qg, kg, _ = kb.real_inputs(loaded, "gaussian", 64, torch.device("cpu"))
    assert qg.shape == (1, 9, 64) and kg.shape == (1, 64, 3, 64)

    configs = [("prop", 8), ("flash", 128)]
    acc = kb.real_accuracy(q, k, v, configs, seeds=range(2), scale=loaded["scale"])
    for a in acc.values():
        assert 0 <= a["rel_error_median"] < 2 and 1 <= a["unique_v_rows_per_kv_head"] <= 100
    assert acc["prop_S8"]["unique_v_rows_per_kv_head"] <= 3 * 8  # at most G·S rows per KV head
    # flash with S ≥ n_keys per tile: every key gets ⌊S·p⌋ or more; budget covering → near-exact
    exact = kb.real_accuracy(q[:, :, :], k[:, :40], v[:, :40], [("prop", 4096)], seeds=range(1), scale=loaded["scale"])
    assert exact["prop_S4096"]["rel_error_median"] < 0.05
    prof = kb.attention_profile(q, k, loaded["scale"])
    assert 1 <= prof["perplexity_median"] <= 100 and 1 <= prof["keys_90pct_median"] <= 100


def test_bench_cli_lists_capture():
    from benchmarks.bench import cli

    assert "capture" in cli.COMMANDS and "capture" in cli.build_parser().format_help()


def test_bench_real_times_a_pair_again_when_its_difference_is_noise(monkeypatch, capsys):
    """A (short, long) pair whose long run took no longer is timed again; after PAIR_ATTEMPTS such
    pairs the last one is kept with a warning on stderr."""
    from benchmarks.bench import real

    from santa.eval import tasks

    class Tokenizer:
        def __call__(self, text, add_special_tokens):
            return {"input_ids": [1, 2, 3]}

        def decode(self, ids, skip_special_tokens):
            return "1234567"

    monkeypatch.setattr(tasks, "needle_prompt", lambda tokenizer, n, seed: tasks.Prompt(task="needle", text="x", answers=("1234567",), n_tokens=3, seed=seed))
    for durations, per_token, warned in (
        ([1.0, 5.0, 0.5, 1.0, 3.0], 1000.0, False),  # warm-up, a noisy pair (5.0 then 0.5), then 1.0 → 3.0 over 2 tokens
        ([1.0] + [2.0, 1.0] * real.PAIR_ATTEMPTS, -500.0, True),  # never longer: the last pair is kept
    ):
        calls = iter(durations)
        monkeypatch.setattr(real, "_timed_generate", lambda model, ids, tokens, calls=calls, **kw: (next(calls), [torch.tensor([1])]))
        case = real.bench_case(None, Tokenizer(), length=8, batch=1, backends=["sdpa"], budget=4, new_tokens=4,
                               warm_tokens=2, repeats=1, seed=0)
        assert next(calls, None) is None  # every timing was used, no more
        row = case["backends"]["sdpa"]
        assert row["ms_per_token_all"] == [pytest.approx(per_token)] and row["found"] == 1.0
        assert ("below the noise" in capsys.readouterr().err) is warned


@pytest.mark.slow
def test_bench_real_times_and_grades_every_backend_on_the_bundled_model(tmp_path, torch_fallback):
    """santa bench real on CPU, tiny settings: one record per backend with a time and a needle score. The script's
    records are what this checks, so santa-prop runs the torch fallback of its kernels (31 s; in Triton's interpreter
    835 s, a quarter of CI's suite, 2026-12-05); the kernels are checked against the reference in tests/kernels."""
    import json

    from benchmarks.bench.real import main

    rc = main(["--device", "cpu", "--dtype", "float32", "--lengths", "256", "--batches", "2", "--new-tokens", "4",
               "--warm-tokens", "2", "--repeats", "1", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "real.json").read_text())
    (case,) = report["cases"]
    assert set(case["backends"]) == {"sdpa", "santa-prop"} and len(case["prompt_tokens"]) == 2
    for row in case["backends"].values():
        assert row["ms_per_token_median"] > 0 and 0.0 <= row["found"] <= 1.0
    assert case["backends"]["santa-prop"]["share_of_v_read"] == min(1.0, 64 / min(case["prompt_tokens"]))


def test_bench_real_refuses_warm_tokens_not_below_new_tokens(capsys):
    from benchmarks.bench.real import main

    err = refusal(main, ["--new-tokens", "4", "--warm-tokens", "4", "--device", "cpu"], capsys)
    assert "--warm-tokens (4) must be below --new-tokens (4)" in err
