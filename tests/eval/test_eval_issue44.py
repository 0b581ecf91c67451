"""The new-user trial of issue 44 on ``santa eval``: an unusable ``--out`` named as ``--out``; the fp8
refusal under the default ``--path auto``; a report with nothing to show says so and why."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from helpers import refusal, sweep_jobs, sweep_record, write_jsonl
from santa.cli import main
from santa.eval.report import cells, compare_methods, pivot, smallest_matching_budgets
from santa.eval.runner import grid


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


# --- 6: --out that cannot be made --------------------------------------------------------------------


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("/proc/nope/x.jsonl", "argument --out: cannot create the folder /proc/nope ("),
        ("/proc/x.jsonl", "argument --out: cannot open /proc/x.jsonl for writing ("),
    ],
)
def test_an_out_that_cannot_be_made_names_out_before_any_work(no_work, capsys, out, message):
    """/proc passes os.access (W_OK for root), so only making the file tells: before any model loads."""
    err = refusal(main, ["eval", "run", "--out", out, "--device", "cpu"], capsys)
    assert last_line(err).startswith(f"santa eval run: error: {message}")


def test_the_out_check_takes_new_folders_and_leaves_nothing_behind(no_work, monkeypatch):
    import santa.eval.cli

    seen = []
    monkeypatch.setattr(santa.eval.cli, "run_sweep", lambda jobs, out, **kwargs: seen.append(Path(out)) or 0)
    out = no_work / "new" / "folder" / "sweep.jsonl"
    assert main(["eval", "run", "--out", str(out), "--device", "cpu"]) == 0
    assert seen == [out] and not (no_work / "new").exists()  # the sweep makes them (run_sweep)


def test_make_output_file_names_the_folder_it_cannot_make(tmp_path):
    from santa.cliargs import make_output_file, make_output_folder

    (tmp_path / "old.jsonl").write_text("kept\n")
    assert make_output_file(str(tmp_path / "old.jsonl")) is None and (tmp_path / "old.jsonl").read_text() == "kept\n"
    assert make_output_file(str(tmp_path / "a" / "b" / "x.jsonl")) is None and not (tmp_path / "a").exists()
    assert make_output_folder(str(tmp_path / "c" / "d")) is None and not (tmp_path / "c").exists()
    if Path("/proc/self").is_dir():
        assert make_output_folder("/proc/nope/run") == "cannot create the folder /proc/nope (No such file or directory)"


# --- 8: fp8 under the default --path --------------------------------------------------------------


def test_fp8_under_the_default_path_names_the_default_and_the_flag_to_pass(no_work, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = refusal(main, ["eval", "run", "--out", str(no_work / "s.jsonl"), "--kv-caches", "fp8"], capsys)
    line = last_line(err)
    assert line.startswith("santa eval run: error: argument --kv-caches: an fp8 KV cache runs on the fast path only")
    assert "--path auto (the default) picks hf on cpu: pass --path fast" in line and "was asked for" not in line


def test_fp8_under_an_explicit_hf_path_still_says_it_was_asked_for(no_work, capsys):
    err = refusal(main, ["eval", "run", "--out", str(no_work / "s.jsonl"), "--kv-caches", "fp8", "--path", "hf", "--device", "cpu"], capsys)
    assert last_line(err).endswith("but --path hf was asked for")


# --- 9: a report with nothing to show ------------------------------------------------------------------


def kl_records() -> list[dict]:
    jobs = grid(models=["m"], tasks=["kl"], lengths=[512], methods=["dense", "systematic"], budgets=[16], prompts=[0, 1])
    return [{"key": j.key(), **asdict(j), "score": 0.1 * (j.method != "dense"), "nll": 2.0, "prompt_tokens": 500,
             "new_tokens": 31} for j in jobs]


@pytest.mark.parametrize(
    ("view", "records", "says"),
    [
        (["--pivot", "--delta"], kl_records, "nothing to show: the difference to dense (--delta) leaves out the KL panels"),
        (["--compare", "systematic,topk"], kl_records, "nothing to compare: no systematic and topk records"),
        (["--compare", "systematic,iid"], lambda: [sweep_record(j) for j in sweep_jobs()], "the non-KL records hold dense, topk"),
        (["--smallest-budgets"], kl_records, "nothing to show: no sampled or top-k cell has a paired difference to dense"),
    ],
)
def test_a_report_with_nothing_to_show_says_so_in_one_line(tmp_path, capsys, view, records, says):
    path = tmp_path / "sweep.jsonl"
    write_jsonl(path, records())
    assert main(["eval", "report", str(path), *view]) == 0
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and out.strip(), out
    assert says in out


def test_the_library_reports_say_why_they_are_empty():
    kl = kl_records()
    assert pivot(cells(kl), delta=True).startswith("nothing to show:")
    assert pivot([]) == "nothing to show: no records"
    assert compare_methods(kl, "systematic", "topk").endswith("the records hold KL only")
    assert smallest_matching_budgets(cells(kl)).startswith("nothing to show:")
    assert pivot(cells(kl)).startswith("**m · kl")  # the KL tables without --delta
