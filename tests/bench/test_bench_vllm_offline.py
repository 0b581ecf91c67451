"""benchmarks/vllm/offline.py's clock (issue 27), without vLLM: a fake engine whose requests finish their
chunked prefill at different steps, so that early requests decode beside later prefills (mixed steps,
slow here) before every step is a decode step of the whole batch (fast). Only the latter may be timed. Also its
result files: one run per --out, and a killed run resumed where it stopped."""

import json
import sys
import types

import pytest
from benchmarks.vllm import offline

from santa.writer_lock import writer_lock

MIXED_STEP, DECODE_STEP = 10.0, 1.0  # seconds per engine step on the fake clock


class FakeEngine:
    """Request i's prefill ends after step ``2 + i``; from then on each step gives it one token (DELTA),
    up to ``params.max_tokens``. Its ids carry vLLM's random suffix."""

    def __init__(self):
        self.now, self.steps, self.requests = 0.0, 0, []

    def add_request(self, request_id, prompt, params):
        self.requests.append(dict(id=f"{request_id}-a1b2c3d4", ready=2 + len(self.requests), made=0, max=params.max_tokens))

    def has_unfinished_requests(self):
        return any(r["made"] < r["max"] for r in self.requests)

    def clock(self):
        return self.now

    def step(self):
        self.steps += 1
        prefilling = any(self.steps <= r["ready"] for r in self.requests)
        self.now += MIXED_STEP if prefilling else DECODE_STEP
        outputs = []
        for r in self.requests:
            if self.steps > r["ready"] and r["made"] < r["max"]:
                r["made"] += 1
                token = 1000 * int(r["id"].split("x")[1].split("-")[0]) + r["made"]
                outputs.append(types.SimpleNamespace(request_id=r["id"], outputs=[types.SimpleNamespace(token_ids=[token])]))
        return outputs


def test_only_steps_that_decode_the_whole_batch_are_timed():
    """Request 2 decodes from step 5; request 0, two steps ahead, may not finish inside the clock."""
    engine = FakeEngine()
    rate, tokens = offline.clocked_steps(engine, ["p0", "p1", "p2"], types.SimpleNamespace(max_tokens=14), warm_tokens=4,
                                         new_tokens=8, tag="r0", clock=engine.clock)
    assert rate == pytest.approx(3 / DECODE_STEP)  # 3 tokens per decode step; the mixed steps (10 s each) lie outside
    assert tokens == [[1000 * i + k for k in range(1, 15)] for i in range(3)]


def test_a_request_that_finishes_inside_the_clock_is_an_error_not_a_rate():
    engine = FakeEngine()  # request 0 is two tokens ahead of request 2: 13 tokens cannot hold 4 + 8 for all three
    with pytest.raises(RuntimeError, match="finished while the clock ran"):
        offline.clocked_steps(engine, ["p0", "p1", "p2"], types.SimpleNamespace(max_tokens=13), warm_tokens=4, new_tokens=8,
                              tag="r0", clock=engine.clock)


def test_a_batch_the_kv_cache_cannot_hold_at_once_is_refused_before_the_clock():
    with pytest.raises(RuntimeError, match=r"holds 28,122 blocks of 16 tokens and 256 requests of 2,220 tokens need 35,584"):
        offline.check_fits(batch=256, tokens=2220, blocks=28_123, block_size=16)  # the H100's 449,968 tokens
    offline.check_fits(batch=64, tokens=2220, blocks=28_123, block_size=16)  # fits: no error
    with pytest.raises(RuntimeError, match="need 6:"):  # whole blocks per request, one block vLLM's null block
        offline.check_fits(batch=3, tokens=17, blocks=6, block_size=16)
    offline.check_fits(batch=3, tokens=16, blocks=4, block_size=16)
    offline.check_fits(batch=256, tokens=2220, blocks=None, block_size=16)  # not known in this process: not checked


def test_a_clock_that_never_starts_is_an_error_not_a_rate():
    engine = FakeEngine()
    with pytest.raises(RuntimeError, match="the clock never ran"):
        offline.clocked_steps(engine, ["p0", "p1"], types.SimpleNamespace(max_tokens=3), warm_tokens=4, new_tokens=1, tag="r0",
                              clock=engine.clock)


def test_several_batch_sizes_need_one_out_file_each(monkeypatch):
    """``--batch 1 16 64`` shares one engine; ``--out`` must then name a file per size through ``{batch}``."""
    argv = ["offline.py", "--folder", "/tmp/m", "--batch", "1", "16", "64"]
    monkeypatch.setattr("sys.argv", [*argv, "--out", "r.json"])
    with pytest.raises(SystemExit):
        offline.parse_args()
    monkeypatch.setattr("sys.argv", [*argv, "--out", "r_b{batch}.json"])
    args = offline.parse_args()
    assert args.batch == [1, 16, 64]
    assert [str(offline.out_path(args.out, b, 30000)) for b in args.batch] == ["r_b1.json", "r_b16.json", "r_b64.json"]
    monkeypatch.setattr("sys.argv", [*argv[:-2], "--out", "r.json"])  # one size: the file as named
    assert str(offline.out_path(offline.parse_args().out, 1, 30000)) == "r.json"
    monkeypatch.setattr("sys.argv", [*argv, "1", "--out", "r_b{batch}.json"])  # a size twice
    with pytest.raises(SystemExit):
        offline.parse_args()


def test_several_prompt_lengths_need_one_out_file_each_and_a_stated_max_model_len(monkeypatch, tmp_path):
    """``--prompt-tokens 2048 4096`` shares one engine: ``--out`` must name a file per cell through ``{prompt}``, and the
    engine's ``--max-model-len`` must be given (a run of one length sizes it to that length, so the shorter lengths of a
    shared engine would otherwise run on another engine than their own run's, unrecorded). Each cell's settings carry
    its own length, and the lock is one for the run."""
    argv = ["offline.py", "--folder", "/tmp/m", "--batch", "1", "16", "--prompt-tokens", "2048", "4096"]
    for tail in (["--out", "r{batch}.json", "--max-model-len", "8192"],  # no {prompt}
                 ["--out", "r{prompt}x{batch}.json"],  # no --max-model-len
                 ["4096", "--out", "r{prompt}x{batch}.json", "--max-model-len", "8192"],  # a length twice
                 ["0", "--out", "r{prompt}x{batch}.json", "--max-model-len", "8192"]):  # a length below 1
        monkeypatch.setattr("sys.argv", [*argv, *tail])
        with pytest.raises(SystemExit):
            offline.parse_args()
    monkeypatch.setattr("sys.argv", [*argv, "--out", str(tmp_path / "r{prompt}x{batch}.json"), "--max-model-len", "8192"])
    args = offline.parse_args()
    assert args.prompt_tokens == [2048, 4096]
    cells = [offline.out_path(args.out, b, n).name for n in args.prompt_tokens for b in args.batch]
    assert cells == ["r2048x1.json", "r2048x16.json", "r4096x1.json", "r4096x16.json"]
    assert offline.lock_path(args.out).name == "rx.json.lock"
    settings = {n: offline.run_settings(args, {}, prompt_tokens=n) for n in args.prompt_tokens}
    assert settings[2048]["prompt_tokens"] == 2048 and settings[4096]["max_model_len"] == 8192
    path = offline.out_path(args.out, 16, 2048)
    path.write_text(json.dumps({**settings[2048], "decode_tokens_per_s_all": [1.0, 2.0]}))
    assert offline.finished(path, settings[2048]) and not offline.finished(path, settings[4096])
    for n in args.prompt_tokens:  # every cell done: time_batches returns before it imports torch or vLLM
        for b in args.batch:
            offline.out_path(args.out, b, n).write_text(json.dumps({**settings[n], "decode_tokens_per_s_all": [1.0, 2.0]}))
    monkeypatch.delenv("SANTA_VLLM_BUDGET", raising=False)
    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of vLLM would now raise
    offline.time_batches(args)


def finished_run(tmp_path, monkeypatch, batches=("1", "16")):
    """argv of a run over ``batches`` into tmp_path/r_b{batch}.json, with a model folder that exists."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    out = tmp_path / "r_b{batch}.json"
    monkeypatch.setattr("sys.argv", ["offline.py", "--folder", str(folder), "--batch", *batches, "--repeats", "2",
                                     "--out", str(out)])
    monkeypatch.delenv("SANTA_VLLM_BUDGET", raising=False)
    return offline.parse_args()


def test_a_finished_size_is_not_timed_again_and_other_settings_are(tmp_path, monkeypatch):
    """A size whose file holds every repeat with this run's settings is skipped (no engine when all are); fewer repeats,
    another backend or an unreadable file is timed again."""
    args = finished_run(tmp_path, monkeypatch)
    settings = offline.run_settings(args, {}, prompt_tokens=30000)
    path = offline.out_path(args.out, 1, 30000)
    assert not offline.finished(path, settings)  # no file yet
    path.write_text(json.dumps({**settings, "decode_tokens_per_s_all": [1.0]}))
    assert not offline.finished(path, settings)  # a killed run: one repeat of two
    path.write_text(json.dumps({**settings, "decode_tokens_per_s_all": [1.0, 2.0]}))
    assert offline.finished(path, settings)
    assert not offline.finished(path, {**settings, "backend": "FLASH_ATTN"})
    assert not offline.finished(path, {**settings, "tensor_parallel_size": 2})  # a TP run is its own measurement
    path.write_text("{not json")
    assert not offline.finished(path, settings)
    for batch in (1, 16):  # every size done: time_batches returns before it imports torch or vLLM
        offline.out_path(args.out, batch, 30000).write_text(json.dumps({**settings, "decode_tokens_per_s_all": [1.0, 2.0]}))
    monkeypatch.setitem(sys.modules, "vllm", None)  # an import of vLLM would now raise
    offline.time_batches(args)


def test_a_second_run_on_the_same_out_is_refused(tmp_path, monkeypatch):
    args = finished_run(tmp_path, monkeypatch)
    with writer_lock(offline.lock_path(args.out)), pytest.raises(SystemExit, match="another offline.py run"):
        offline.main()


def test_first_difference_finds_where_two_greedy_sequences_part():
    assert offline.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert offline.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert offline.first_difference([1, 2], [1, 2, 3]) == 2  # one a prefix of the other


def test_compare_reports_the_rate_ratio_where_tokens_part_and_each_engine_against_itself(tmp_path, capsys):
    flash = {"backend": "FLASH_ATTN", "santa": {}, "decode_tokens_per_s": 200.0, "tokens": [[1, 2, 3], [4, 5, 6], [7, 8, 9]],
             "repeat_same_tokens": 3}
    gate = {"backend": "CUSTOM", "santa": {"kernel": "prop"}, "decode_tokens_per_s": 190.0,
            "tokens": [[1, 2, 3], [4, 0, 6], [7, 8, 0]]}  # an older record: no repeat_same_tokens
    paths = []
    for name, record in (("f", flash), ("g", gate)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(record))
    offline.compare(*map(str, paths))
    line = capsys.readouterr().out.strip()
    assert "0.950× decode tokens/s (190 against 200)" in line
    assert "1 of 3 sequences with identical greedy tokens, the others from token 1–2 (median 2)" in line
    assert line.endswith("FLASH_ATTN kept 3 of 3 across its own repeats")


def test_kernel_totals_sum_each_kernel_over_traces_plain_and_gzipped(tmp_path):
    import gzip

    events = [{"cat": "kernel", "name": "prop1p_d128_g4", "dur": 5.0}, {"cat": "kernel", "name": "flash_fwd", "dur": 20.0},
              {"cat": "cpu_op", "name": "aten::mm", "dur": 99.0}, {"cat": "kernel", "name": "prop1p_d128_g4", "dur": 5.5}]
    plain = tmp_path / "a.pt.trace.json"
    plain.write_text(json.dumps({"traceEvents": events[:2]}))
    zipped = tmp_path / "b.pt.trace.json.gz"
    with gzip.open(zipped, "wt") as f:
        json.dump({"traceEvents": events[2:]}, f)
    assert offline.kernel_totals([plain, zipped]) == [{"name": "flash_fwd", "count": 1, "total_us": 20.0},
                                                      {"name": "prop1p_d128_g4", "count": 2, "total_us": 10.5}]


def test_compare_prints_the_kernels_whose_time_differs_most(tmp_path, capsys):
    flash = {"backend": "FLASH_ATTN", "santa": {}, "decode_tokens_per_s": 100.0, "tokens": [[1]],
             "kernels": [{"name": "flash_fwd", "count": 32, "total_us": 640.0}, {"name": "gemm", "count": 64, "total_us": 900.0}]}
    gate = {**flash, "backend": "CUSTOM", "decode_tokens_per_s": 98.0,
            "kernels": [{"name": "flash_fwd", "count": 32, "total_us": 641.0}, {"name": "gemm", "count": 64, "total_us": 900.0},
                        {"name": "prop1p_d128_g4", "count": 32, "total_us": 170.0}]}
    assert offline.kernel_differences(flash["kernels"], gate["kernels"], most=2) == [("prop1p_d128_g4", 0.0, 170.0),
                                                                                      ("flash_fwd", 640.0, 641.0)]
    paths = []
    for name, record in (("f", flash), ("g", gate)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(record))
    offline.compare(*map(str, paths))
    out = capsys.readouterr().out
    assert "profiled kernels: 1540 against 1711 µs in all" in out and "+170.0" in out and "prop1p_d128_g4" in out


def test_invariance_compares_the_alone_requests_with_the_batched_runs_first_rows(tmp_path, capsys):
    alone = {"backend": "CUSTOM", "santa": {"SANTA_VLLM_KERNEL": "prop"}, "batch": 1, "batch_invariant": True,
             "tokens": [[5, 6, 7]]}
    batched = {**alone, "batch": 3, "tokens": [[5, 6, 7, 8, 9], [1, 2, 3, 4, 5], [9, 9, 9, 9, 9]]}
    drifted = {**batched, "tokens": [[5, 6, 0, 8, 9], *batched["tokens"][1:]]}
    paths = {}
    for name, record in (("alone", alone), ("batched", batched), ("drifted", drifted)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(record))
    assert offline.invariance(str(paths["alone"]), str(paths["batched"]))  # over the 3 tokens both asked for
    assert "request 0: batch 1 against batch 3" in capsys.readouterr().out
    assert not offline.invariance(str(paths["alone"]), str(paths["drifted"]))
    assert "VLLM_BATCH_INVARIANT=1): differs from token 2 of 3" in capsys.readouterr().out
    with pytest.raises(ValueError, match="give the smaller batch first"):
        offline.invariance(str(paths["batched"]), str(paths["alone"]))


def test_run_settings_say_whether_vllms_batch_invariant_mode_was_on(monkeypatch):
    monkeypatch.setattr("sys.argv", ["offline.py", "--folder", "/tmp/m", "--out", "/tmp/o.json"])
    parsed = offline.parse_args()
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    assert "batch_invariant" not in offline.run_settings(parsed, {}, prompt_tokens=30000)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert offline.run_settings(parsed, {}, prompt_tokens=30000)["batch_invariant"] is True
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "2")  # vLLM's bool(int(...)): on
    assert offline.run_settings(parsed, {}, prompt_tokens=30000)["batch_invariant"] is True
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    assert "batch_invariant" not in offline.run_settings(parsed, {}, prompt_tokens=30000)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "yes")
    with pytest.raises(RuntimeError, match="VLLM_BATCH_INVARIANT must be an int.*'yes'"):
        offline.run_settings(parsed, {}, prompt_tokens=30000)


def test_invariance_from_the_command_line_exits_by_its_verdict_and_names_a_missing_file(tmp_path, monkeypatch, capsys):
    record = {"backend": "CUSTOM", "santa": {}, "batch": 1, "tokens": [[1, 2]]}
    alone, batched = tmp_path / "a.json", tmp_path / "b.json"
    alone.write_text(json.dumps(record))
    batched.write_text(json.dumps({**record, "batch": 2, "tokens": [[1, 3], [4, 4]]}))
    for paths, status in (((alone, alone), 0), ((alone, batched), 1)):
        monkeypatch.setattr("sys.argv", ["offline.py", "--invariance", *map(str, paths)])
        with pytest.raises(SystemExit) as exit_:
            offline.main()
        assert exit_.value.code == status
    monkeypatch.setattr("sys.argv", ["offline.py", "--invariance", str(alone), str(tmp_path / "none.json")])
    with pytest.raises(SystemExit, match="offline.py --invariance: .*none.json"):
        offline.main()
