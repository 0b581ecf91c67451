"""benchmarks/vllm/backend_test.py without vLLM or a GPU: the sampled pass's tolerance holds for santa's estimator
(its standard errors bound the spread of prop's estimates over seeds, which centre on exact attention), the vLLM
files are refused unless their SHA-256 is 0.26.0's, and the pass counts are read from pytest's JUnit XML."""

import math

import pytest
import torch
from benchmarks.vllm import backend_test

from helpers import DEVICE
from santa.vllm.decode import PagedDecoder
from vllm_stand_ins import BLOCK, HEAD_DIM, HEADS, KV_HEADS, FlashAttentionImpl, make_batch

SCALE = 1 / math.sqrt(HEAD_DIM)


def test_the_derived_tolerance_bounds_prop_over_seeds():
    """Over 64 seeds, prop at S = 16 centres on exact attention and spreads no more than σ/√S per element (systematic
    draws: less); every estimate of every seed lies within z·se of the exact answer (z of α = 1e-3); sequences with
    ≤ S keys have se = 0 and are exact."""
    budget, seeds = 16, 64
    batch = make_batch([200, 90, 16], [1, 1, 1], seed=11)
    se = backend_test.standard_errors(batch.query, batch.key, batch.value, batch.kv_cache, batch.common, budget, SCALE)
    FlashAttentionImpl(HEADS, HEAD_DIM, SCALE, KV_HEADS, None, None, "auto").do_kv_cache_update(
        None, batch.key, batch.value, batch.kv_cache, batch.common.slot_mapping)
    exact = batch.exact(SCALE)
    runs = []
    for seed in range(seeds):
        decoder = PagedDecoder(heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK, max_keys=208, max_batch=3,
                               budget=budget, kernel="prop", seed=seed, dtype=torch.float32, kv_dtype=torch.float32, device=DEVICE)
        out = torch.empty_like(batch.query)
        decoder.run(batch.query, batch.kv_cache, seq_lens=batch.common.seq_lens, block_table=batch.common.block_table_tensor,
                    layer=0, scale=SCALE, out=out)
        runs.append(out)
    runs = torch.stack(runs)  # [seeds, B, H, D]
    assert torch.equal(se[2], torch.zeros_like(se[2])) and (se[:2] > 0).all()
    torch.testing.assert_close(runs[:, 2], exact[2].expand_as(runs[:, 2]), rtol=1e-5, atol=1e-5)  # 16 keys ≤ S: exact
    sampled = runs[:, :2]
    ratio = sampled.var(0) / se[:2] ** 2  # per element: the spread over seeds against σ²/S
    assert 0.2 < float(ratio.mean()) < 1.1, float(ratio.mean())
    bias = (sampled.mean(0) - exact[:2]) / (se[:2] / math.sqrt(seeds))  # standardised error of the mean over seeds
    assert float(bias.abs().mean()) < 1.2, float(bias.abs().mean())  # unbiased: |N(0, ≤1)| averages ≤ 0.8
    z = backend_test.z_value(1e-3, se[:2].numel())
    assert ((sampled - exact[:2]).abs() <= z * se[:2]).all()


def test_z_is_the_two_sided_bonferroni_quantile():
    assert backend_test.z_value(0.05, 1) == pytest.approx(1.959964, abs=1e-5)
    assert backend_test.z_value(1e-3, 24576) == pytest.approx(5.4878, abs=1e-3)


def test_a_decode_batch_only_is_sampled():
    batch = make_batch([200, 90], [1, 4], seed=12)
    se = backend_test.standard_errors(batch.query, batch.key, batch.value, batch.kv_cache, batch.common, 16, SCALE)
    assert torch.equal(se, torch.zeros_like(se))  # a mixed batch runs FlashAttention: exact


def test_files_other_than_vllm_0260s_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="is missing: run `bash benchmarks/device/prepare.sh vllmtests`"):
        backend_test.check_files(tmp_path)
    for name in backend_test.FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("# not vLLM's\n")
    with pytest.raises(SystemExit, match="expected vLLM 0.26.0's"):
        backend_test.check_files(tmp_path)


def test_the_work_folder_holds_the_files_as_a_package_and_the_models_config(tmp_path):
    tests = tmp_path / "vt"
    for name in backend_test.FILES:
        (tests / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / name).write_text(f"# {name}\n")
    work = tmp_path / "work"
    backend_test.make_workdir(tests, work)
    assert all((work / p / "__init__.py").read_text() == "" for p in ("tests", "tests/v1", "tests/v1/attention"))
    assert (work / backend_test.FILES[0]).read_text() == f"# {backend_test.FILES[0]}\n"
    config = (work / "meta-llama/Meta-Llama-3-8B/config.json").read_text()
    assert '"num_attention_heads": 32' in config and '"num_key_value_heads": 8' in config


def test_pass_counts_come_from_junit_xml(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text("""<testsuites><testsuite>
<testcase classname="t" name="a"/><testcase classname="t" name="b"><failure message="[CUSTOM] differs">x</failure></testcase>
<testcase classname="t" name="c"><skipped message="no"/></testcase><testcase classname="t" name="d"><error message="boom"/></testcase>
</testsuite></testsuites>""")
    counts = backend_test.junit_counts(xml)
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["errors"]) == (1, 1, 1, 1)
    assert [f["test"] for f in counts["failures"]] == ["t::b", "t::d"] and counts["failures"][0]["message"] == "[CUSTOM] differs"
    assert backend_test.junit_counts(tmp_path / "none.xml")["passed"] == 0
