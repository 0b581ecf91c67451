"""CPU checks of the real-attention benchmark inputs: capture from SmolLM2 and the accuracy path."""

from __future__ import annotations

import torch

from santa.bench import capture as cap_mod
from santa.bench import kernels as kb


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
    from santa.bench import cli

    assert "capture" in cli.COMMANDS and "capture" in cli.build_parser().format_help()
