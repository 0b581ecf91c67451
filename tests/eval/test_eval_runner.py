"""Grid, JSONL store and resume; the report on synthetic records."""

import json

import pytest

from santa.eval.report import cells, table
from santa.eval.runner import Job, batches, grid, run_sweep
from santa.sweep_files import append_record, read_records


def small_grid(**overrides):
    args = dict(models=["m"], tasks=["niah_single"], lengths=[512], budgets=[16, 32], prompts=[0, 1], seeds=[0, 1])
    return grid(**{**args, **overrides})


def test_grid_runs_dense_once_and_topk_without_seeds():
    jobs = small_grid()
    per_prompt = [j for j in jobs if j.prompt == 0]
    assert sum(j.method == "dense" for j in per_prompt) == 1
    assert sum(j.method == "topk" for j in per_prompt) == 2  # one per budget
    assert sum(j.method == "systematic" for j in per_prompt) == 4  # budgets × seeds
    assert len({j.key() for j in jobs}) == len(jobs)


def test_grid_keeps_jobs_of_one_prompt_together():
    jobs = small_grid(tasks=["niah_single", "kl"])
    groups = [j.group for j in jobs]
    changes = sum(a != b for a, b in zip(groups, groups[1:], strict=False))
    assert changes == len(set(groups)) - 1


def test_batches_hold_one_task_and_at_most_batch_size_prompts():
    jobs = small_grid(tasks=["niah_single", "kl"], prompts=range(5))
    split = batches(jobs, 2)
    assert sorted(j.key() for b in split for j in b) == sorted(j.key() for j in jobs)  # each job once
    for batch in split:
        assert len({(j.model, j.length, j.task) for j in batch}) == 1
        assert len({j.prompt for j in batch}) <= 2
    # Prompt chunks outer, tasks inner: both tasks get prompts 0-1 before either gets prompt 2.
    assert [(b[0].task, sorted({j.prompt for j in b})) for b in split[:2]] == [("kl", [0, 1]), ("niah_single", [0, 1])]
    assert len(split) == 6


def test_batch_size_must_be_positive():
    import pytest

    with pytest.raises(ValueError, match="batch_size"):
        batches(small_grid(), 0)


def test_torn_last_line_is_ignored_and_the_next_record_survives(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, {"key": "a", "score": 1})
    with open(path, "a") as f:
        f.write('{"key": "b", "sco')  # a writer killed mid-line
    append_record(path, {"key": "c", "score": 0})
    assert [r["key"] for r in read_records(path)] == ["a", "c"]


class Killed(Exception):
    pass


def fake_load(calls):
    def load(name, device):
        calls.append(name)
        return object(), object()

    return load


def test_resume_runs_only_the_missing_jobs(tmp_path, monkeypatch):
    import santa.eval.runner as runner

    ran: list[Job] = []
    kill_after = {"jobs": 5}

    def fake_group(model, tokenizer, jobs, on_done):
        for job in jobs:
            if len(ran) == kill_after["jobs"]:
                raise Killed  # the sweep is killed after five jobs
            ran.append(job)
            on_done(
                job, {"score": 1.0, "prompt_tokens": 10, "new_tokens": 2, "v_rows_read": 0.5, "v_rows_read_kv": 0.6}
            )

    monkeypatch.setattr(runner, "run_batch", fake_group)
    jobs = small_grid()
    out = tmp_path / "sweep.jsonl"
    try:
        run_sweep(jobs, out, device="cpu", progress=False, load=fake_load([]))
    except Killed:
        pass
    assert len(read_records(out)) == 5
    kill_after["jobs"] = None
    ran_again = run_sweep(jobs, out, device="cpu", progress=False, load=fake_load([]))
    assert ran_again == len(jobs) - 5
    assert {r["key"] for r in read_records(out)} == {j.key() for j in jobs}
    assert run_sweep(jobs, out, device="cpu", progress=False, load=fake_load([])) == 0


def test_cells_average_seeds_per_prompt_then_bootstrap_over_prompts():
    base = {"model": "m", "task": "niah_single", "length": 512, "prefill": "dense", "method": "iid", "budget": 16}
    records = [
        {
            **base,
            "prompt": p,
            "seed": s,
            "score": float(s == 0),
            "prompt_tokens": 500,
            "new_tokens": 8,
            "v_rows_read": 0.1,
        }
        for p in range(4)
        for s in range(2)
    ]
    (cell,) = cells(records)
    assert (cell.n_prompts, cell.n_seeds) == (4, 2)
    assert (cell.mean, cell.low, cell.high) == (0.5, 0.5, 0.5)
    assert cell.avg_tokens == 508
    assert "50.0 [50.0, 50.0]" in table([cell])


def test_job_key_is_stable_json():
    job = small_grid()[0]
    assert json.loads(job.key())["task"] == "niah_single"


def test_plot_writes_one_figure_per_task(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    from santa.eval.report import plot, plot_delta

    base = {"model": "m", "length": 512, "prefill": "dense", "prompt_tokens": 500, "new_tokens": 8, "v_rows_read": 0.1}
    records = [
        {
            **base,
            "task": task,
            "method": method,
            "budget": budget,
            "prompt": p,
            "seed": 0,
            "score": 0.5 + 0.1 * p,
            "nll": 1.0,
        }
        for task in ("niah_single", "kl")
        for method, budget in (("dense", 0), ("systematic", 16), ("systematic", 32), ("topk", 16), ("prop", 16), ("flash", 64))
        for p in range(3)
    ]  # every method the runner has (the kernels' prop and flash included) gets a line
    paths = plot(cells(records), tmp_path)
    assert sorted(p.name for p in paths) == ["accuracy_m_niah_single_512.png", "kl_m_kl_512.png"]
    (delta,) = plot_delta(cells(records), tmp_path)  # KL cells have no paired difference
    assert delta.name == "delta_m_512_dense.png"
    assert all(p.stat().st_size > 0 for p in [*paths, delta])


def test_paired_difference_to_dense_on_the_same_prompts():
    base = {"model": "m", "task": "niah_multivalue", "length": 512, "prefill": "dense", "seed": 0}
    extra = {"prompt_tokens": 500, "new_tokens": 8, "v_rows_read": 0.1}
    dense = [{**base, **extra, "method": "dense", "budget": 0, "prompt": p, "score": p / 10} for p in range(6)]
    # one quarter lower on every prompt; and equal to dense on every prompt
    lower = [{**r, "method": "topk", "budget": 16, "score": r["score"] - 0.25} for r in dense]
    same = [{**r, "method": "systematic", "budget": 16} for r in dense]
    by_method = {c.method: c for c in cells(dense + lower + same)}
    assert by_method["dense"].delta is None
    topk, sys = by_method["topk"], by_method["systematic"]
    assert (topk.delta, topk.delta_low, topk.delta_high) == (-0.25, -0.25, -0.25)  # paired: no prompt-to-prompt spread
    assert topk.high - topk.low > 0.1  # while the unpaired CI of its mean is wide
    assert topk.matches_dense is False and sys.matches_dense is True


def test_records_read_from_a_gzipped_jsonl(tmp_path):
    import gzip

    path = tmp_path / "sweep.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"key": "a", "score": 1}\n{"key": "b", "sco'))
    assert [r["key"] for r in read_records(path)] == ["a"]


def test_smallest_matching_budget_needs_every_larger_budget_to_match():
    from santa.eval.report import smallest_matching_budgets

    base = {"model": "m", "task": "niah_single", "length": 512, "prefill": "dense", "seed": 0}
    extra = {"prompt_tokens": 500, "new_tokens": 8, "v_rows_read": 0.1}
    dense = [{**base, **extra, "method": "dense", "budget": 0, "prompt": p, "score": 1.0} for p in range(8)]
    # systematic: loses every prompt at S=16, matches at 32, loses at 64, matches at 128 → safe from 128
    lose = {16: True, 32: False, 64: True, 128: False}
    sys = [{**r, "method": "systematic", "budget": s, "score": 0.0 if lose[s] else 1.0} for r in dense for s in lose]
    topk = [{**r, "method": "topk", "budget": s, "score": 0.0} for r in dense for s in (16, 128)]
    table_text = smallest_matching_budgets(cells(dense + sys + topk))
    # the budget comes with the share of V read there (v_rows_read = 0.1 in every record)
    assert table_text.splitlines()[-1] == "| m | 512 | dense | niah_single | 8 | 128 (10.00 % of V) | >128 | ±0.0 pts |"


def test_kl_pivot_ends_with_the_loglog_slope():
    from santa.eval.report import pivot

    base = {"model": "m", "task": "kl", "length": 512, "prefill": "dense", "seed": 0, "prompt_tokens": 500, "new_tokens": 0}
    dense = [{**base, "method": "dense", "budget": 0, "prompt": p, "score": 0.0, "nll": 1.0} for p in range(3)]
    # KL = 2 / S on every prompt: a slope of exactly −1
    sampled = [{**r, "method": "iid", "budget": s, "score": 2.0 / s} for r in dense for s in (16, 32, 64)]
    lines = pivot(cells(dense + sampled)).splitlines()
    assert lines[2] == "| method | S=16 | S=32 | S=64 | slope |"
    assert lines[-1].endswith("| -1.00 |")
    assert lines[-2].count("|") == lines[2].count("|")  # the dense row fills every column


def test_compare_methods_pairs_prompts_per_budget_and_pools_over_budgets():
    import pytest

    from santa.eval.report import compare_methods

    base = {"model": "m", "task": "fwe", "length": 512, "prefill": "dense", "seed": 0}
    # systematic beats top-k by exactly 0.5 at S=16 and ties at S=32, on every one of 6 prompts
    sys = [{**base, "method": "systematic", "budget": s, "prompt": p, "score": 1.0} for s in (16, 32) for p in range(6)]
    topk = [{**base, "method": "topk", "budget": s, "prompt": p, "score": 0.5 if s == 16 else 1.0} for s in (16, 32) for p in range(6)]
    kl = [{**base, "task": "kl", "method": m, "budget": 16, "prompt": 0, "score": 0.1} for m in ("systematic", "topk")]
    last = compare_methods(sys + topk + kl, "systematic", "topk").splitlines()[-1]
    assert last == "| m | fwe | 512 | dense | 6 | S=16: +50.0 [+50.0, +50.0]*; S=32: +0.0 [+0.0, +0.0] | +25.0 [+25.0, +25.0]* |"
    with pytest.raises(ValueError, match="second method"):
        compare_methods(sys, "systematic", "dense")


def test_report_piped_into_a_reader_that_leaves_early_exits_quietly(tmp_path):
    import subprocess
    import sys

    base = {"model": "m", "task": "niah_single", "length": 512, "prefill": "dense", "method": "iid", "seed": 0}
    extra = {"prompt": 0, "score": 1.0, "prompt_tokens": 500, "new_tokens": 8}
    path = tmp_path / "sweep.jsonl"
    # 1,000 table rows (~100 kB): more than a pipe buffer holds, so the writer is still writing when the reader leaves
    path.write_text("".join(json.dumps({**base, **extra, "budget": b, "key": str(b)}) + "\n" for b in range(1, 1001)))
    proc = subprocess.Popen(
        [sys.executable, "-m", "santa.cli", "eval", "report", str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout.readline().startswith(b"| model |")
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, stderr
    assert "Traceback" not in stderr


def test_runs_with_another_answer_budget_are_their_own_cells_with_their_own_dense():
    from santa.eval.report import compare_methods

    base = {"model": "m", "task": "gsm8k", "length": 0, "prefill": "dense", "seed": 0}
    extra = {"prompt_tokens": 300, "new_tokens": 8, "v_rows_read": 0.1}
    # at 256 new tokens every answer is cut (score 0); at 512 dense solves every item, systematic half
    records = [
        {**base, **extra, "max_new_tokens": n, "method": m, "budget": s, "prompt": p, "score": score}
        for n, scores in ((256, {"dense": 0.0, "systematic": 0.0, "topk": 0.0}), (512, {"dense": 1.0, "systematic": 0.5, "topk": 0.25}))
        for (m, s) in (("dense", 0), ("systematic", 64), ("topk", 64))
        for p in range(4)
        for score in (scores[m],)
    ]
    by_cell = {(c.task, c.method): c for c in cells(records)}
    assert sorted({task for task, _ in by_cell}) == ["gsm8k_256tok", "gsm8k_512tok"]
    assert all(c.n_seeds == 1 and c.n_prompts == 4 for c in by_cell.values())  # not pooled as seeds
    assert by_cell["gsm8k_512tok", "systematic"].delta == -0.5  # paired with the dense of its own budget
    assert by_cell["gsm8k_256tok", "systematic"].delta == 0.0
    lines = compare_methods(records, "systematic", "topk").splitlines()[-2:]
    assert [line.split(" | ")[1] for line in lines] == ["gsm8k_256tok", "gsm8k_512tok"]
    assert lines[-1].endswith("| +25.0 [+25.0, +25.0]* |")
    # the default budget keeps the plain task name
    assert {c.task for c in cells([{**r, "max_new_tokens": 64} for r in records])} == {"gsm8k"}


def test_score_samples_are_their_own_jobs_and_leave_exact_score_keys_unchanged():
    jobs = small_grid(score_samples=(0, 8), seeds=[0])
    exact = [j for j in jobs if j.score_samples == 0]
    assert [j.key() for j in exact] == [j.key() for j in small_grid(seeds=[0])]  # resume old sweeps
    assert all("score_samples" not in json.loads(j.key()) for j in exact)
    sampled = [j for j in jobs if j.score_samples == 8]
    assert len(sampled) == len(exact)  # every method, dense included (the score stage alone)
    assert json.loads(sampled[0].key())["score_samples"] == 8
    dense = next(j for j in sampled if j.method == "dense").config()
    assert (dense.sampler, dense.score_samples) == ("dense", 8)
    assert next(j for j in exact if j.method == "dense").config().score_samples is None
    import pytest

    with pytest.raises(ValueError, match="score_samples"):
        small_grid(score_samples=(-1,))


def test_score_sampled_cells_are_a_setting_paired_with_exact_dense():
    from santa.eval.report import compare_methods, pivot

    base = {"model": "m", "task": "fwe", "length": 512, "prefill": "dense", "seed": 0, "prompt_tokens": 500, "new_tokens": 8}
    dense = [{**base, "method": "dense", "budget": 0, "prompt": p, "score": 1.0} for p in range(4)]
    # Bernoulli scores with B = 8: dense values lose 0.25, systematic S=16 loses 0.5; exact-score systematic ties
    scores_only = [{**r, "score_samples": 8, "score": 0.75} for r in dense]
    both = [{**r, "method": "systematic", "budget": 16, "score_samples": 8, "score": 0.5} for r in dense]
    exact_sys = [{**r, "method": "systematic", "budget": 16, "score_samples": 0} for r in dense]
    by_setting = {(c.prefill, c.method): c for c in cells(dense + scores_only + both + exact_sys)}
    assert sorted(by_setting) == [("dense", "dense"), ("dense", "systematic"), ("dense+bqk8", "dense"), ("dense+bqk8", "systematic")]
    assert by_setting["dense", "dense"].delta is None  # the baseline
    assert by_setting["dense+bqk8", "dense"].delta == -0.25
    assert by_setting["dense+bqk8", "systematic"].delta == -0.5
    assert by_setting["dense", "systematic"].delta == 0.0
    panel = pivot(cells(dense + scores_only + both), delta=True)
    assert "**m · fwe · 512 tokens · dense+bqk8 prefill**" in panel and "| dense | -25.0 [-25.0, -25.0]* (all S) |" in panel
    assert "| m | fwe | 512 | dense+bqk8 |" in compare_methods(both + [{**r, "method": "topk"} for r in both], "systematic", "topk")


def test_fp8_cells_pair_with_dense_on_their_own_cache_and_fp8_dense_with_the_models_cache():
    """Issue 25 item 4: prop-fp8 − dense-fp8 and dense-fp8 − dense on the model's cache, each paired on the prompts."""
    base = {"model": "m", "task": "fwe", "length": 512, "prefill": "dense", "seed": 0, "prompt_tokens": 500, "new_tokens": 8}
    dense = [{**base, "method": "dense", "budget": 0, "prompt": p, "score": 1.0} for p in range(4)]
    dense_fp8 = [{**r, "kv_cache": "fp8", "score": 0.75} for r in dense]
    prop = [{**r, "method": "prop", "budget": 128, "score": 0.9} for r in dense]
    prop_fp8 = [{**r, "kv_cache": "fp8", "score": 0.5} for r in prop]
    by_setting = {(c.prefill, c.method): c for c in cells(dense + dense_fp8 + prop + prop_fp8)}
    assert sorted(by_setting) == [("dense", "dense"), ("dense", "prop"), ("dense+fp8", "dense"), ("dense+fp8", "prop")]
    assert by_setting["dense", "dense"].delta is None  # the reference
    assert by_setting["dense", "prop"].delta == pytest.approx(-0.1)
    assert by_setting["dense+fp8", "dense"].delta == pytest.approx(-0.25)  # what fp8 costs dense
    assert by_setting["dense+fp8", "prop"].delta == pytest.approx(-0.25)  # prop-fp8 − dense-fp8


def test_a_record_with_an_unknown_kv_cache_is_refused():
    from santa.eval.report import record_problem

    record = {"key": "k", "model": "m", "task": "fwe", "length": 512, "prefill": "dense", "method": "dense", "budget": 0,
              "prompt": 0, "score": 1.0, "prompt_tokens": 500, "new_tokens": 8}
    assert record_problem(record) is None
    assert "kv_cache" in record_problem({**record, "kv_cache": "fp8_e5m2"})
