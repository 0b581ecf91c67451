"""Sweep files: one writer per file (a lock the kernel drops with the process), one record per job key
in the report, and a one-line error naming the file (and line) for a file that cannot be read."""

import gzip
import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict

import pytest

import santa.eval.runner as runner
from helpers import sweep_jobs, sweep_record, write_jsonl
from santa.cli import main
from santa.eval.report import cells, load_records
from santa.eval.runner import run_sweep
from santa.sweep_files import SweepFileError, SweepLocked, append_record, load_sweep, read_records, sweep_lock


def no_load(name, device):
    raise AssertionError("the model must not load")


def fake_batch(model, tokenizer, batch_jobs, on_done):
    for job in batch_jobs:
        on_done(job, {k: v for k, v in sweep_record(job).items() if k not in asdict(job) and k != "key"})


def report_error(capsys, *paths) -> str:
    """stderr of ``santa eval report`` that must fail with status 1 and one line."""
    assert main(["eval", "report", *map(str, paths)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


# --- one writer ------------------------------------------------------------------------------------


def test_a_second_writer_is_refused_naming_the_file(tmp_path):
    out = tmp_path / "sweep.jsonl"
    with sweep_lock(out), pytest.raises(SweepLocked, match=f"{out}: another `santa eval run` is writing this file"):
        run_sweep(sweep_jobs(), out, device="cpu", progress=False, load=no_load)


def test_a_second_eval_run_exits_1_naming_the_file_before_loading(tmp_path, capsys, monkeypatch):
    import santa.assets

    monkeypatch.setattr(santa.assets, "load_model", no_load)
    out = tmp_path / "sweep.jsonl"
    with sweep_lock(out):
        assert main(["eval", "run", "--out", str(out), "--device", "cpu", "--prompts", "0"]) == 1
    assert capsys.readouterr().err == f"santa eval run: error: {out}: another `santa eval run` is writing this file; wait for it to end or use another --out\n"


def test_the_lock_is_released_when_a_sweep_fails(tmp_path, monkeypatch):
    class Killed(Exception):
        pass

    def dies(*args):
        raise Killed

    monkeypatch.setattr(runner, "run_batch", dies)
    out = tmp_path / "sweep.jsonl"
    with pytest.raises(Killed):
        run_sweep(sweep_jobs(), out, device="cpu", progress=False, load=lambda name, device: (None, None))
    with sweep_lock(out):  # free again
        pass


def test_a_killed_writer_leaves_no_stale_lock(tmp_path, monkeypatch):
    out = tmp_path / "sweep.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from santa.sweep_files import sweep_lock\n"
         "with sweep_lock(sys.argv[1]):\n    print('locked', flush=True); time.sleep(300)", str(out)],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout.readline() == b"locked\n"
        with pytest.raises(SweepLocked):
            run_sweep(sweep_jobs(), out, device="cpu", progress=False, load=no_load)
        os.kill(holder.pid, signal.SIGKILL)  # a crash: no cleanup code runs
        holder.wait(timeout=60)
        monkeypatch.setattr(runner, "run_batch", fake_batch)
        assert run_sweep(sweep_jobs(), out, device="cpu", progress=False, load=lambda name, device: (None, None)) == 4
    finally:
        holder.kill()
        holder.wait()
    assert not list(tmp_path.glob("*.lock"))  # no lock file to go stale


def test_a_sweep_refuses_to_append_to_gzip(tmp_path):
    out = tmp_path / "sweep.jsonl"
    out.write_bytes(gzip.compress(b""))  # gzip content under a plain name
    with pytest.raises(SweepFileError, match="a gzip file cannot be appended to"):
        run_sweep(sweep_jobs(), out, device="cpu", progress=False, load=no_load)
    with pytest.raises(SweepFileError, match="cannot write gzip"):
        run_sweep(sweep_jobs(), tmp_path / "sweep.jsonl.gz", device="cpu", progress=False, load=no_load)


def test_a_sweep_killed_mid_line_resumes_with_nothing_lost(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "run_batch", fake_batch)
    out = tmp_path / "sweep.jsonl"
    first, *rest = sweep_jobs()
    append_record(out, sweep_record(first))
    with open(out, "a") as f:
        f.write(json.dumps(sweep_record(rest[0]))[:40])  # the writer was killed in the middle of this line
    assert load_sweep(out).torn == [2]
    assert run_sweep(sweep_jobs(), out, device="cpu", progress=False, load=lambda name, device: (None, None)) == 3
    keys = [r["key"] for r in read_records(out)]
    assert sorted(keys) == sorted(j.key() for j in sweep_jobs())  # every job once, the torn one run again


# --- one record per job key --------------------------------------------------------------------------


def test_report_keeps_one_record_per_job_key(tmp_path):
    path = tmp_path / "sweep.jsonl"
    write_jsonl(path, [sweep_record(j) for j in sweep_jobs()] * 2)  # two writers on one file wrote every record twice
    loaded = load_records([path])
    assert (len(loaded.records), loaded.duplicates) == (4, 4)
    assert {c.n_seeds for c in cells(loaded.records)} == {1}  # not counted as extra seeds


def test_report_keeps_the_first_record_of_a_duplicated_key(tmp_path):
    job = sweep_jobs()[0]
    path = tmp_path / "sweep.jsonl"
    write_jsonl(path, [sweep_record(job, 1.0), sweep_record(job, 0.0)])
    assert [r["score"] for r in load_records([path]).records] == [1.0]


def test_report_says_how_many_duplicates_it_dropped(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    write_jsonl(path, [sweep_record(j) for j in sweep_jobs()])
    assert main(["eval", "report", str(path), str(path)]) == 0  # the same file twice: every key again
    captured = capsys.readouterr()
    assert "santa eval report: dropped 4 duplicate record(s)" in captured.err
    assert "| m | niah_single | 512 | dense | dense | – | 2×1 |" in captured.out


def test_report_notes_a_line_cut_by_a_killed_run_and_reports_the_rest(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    write_jsonl(path, [sweep_record(j) for j in sweep_jobs()])
    with open(path, "a") as f:
        f.write('{"key": "cut sho')
    assert main(["eval", "report", str(path)]) == 0
    assert capsys.readouterr().err == f"santa eval report: {path}, line 5: a record cut short by a killed run; skipped\n"


# --- files that cannot be read: one line naming the file (and line), status 1 -------------------------


def test_report_on_a_missing_file_exits_1_naming_it(tmp_path, capsys):
    path = tmp_path / "nosuch.jsonl"
    assert report_error(capsys, path) == f"santa eval report: error: {path}: no such file\n"


def test_report_on_a_binary_file_names_the_file_and_line(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    path.write_bytes(json.dumps(sweep_record(sweep_jobs()[0])).encode() + b"\n\x89PNG\xff\x00")
    assert f"{path}, line 2: not UTF-8 text" in report_error(capsys, path)


def test_report_on_a_line_that_is_not_json_names_it(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    path.write_text(json.dumps(sweep_record(sweep_jobs()[0])) + "\nhello\n")
    assert f"{path}, line 2: not a JSON record: 'hello'" in report_error(capsys, path)


def test_report_on_a_json_value_without_a_key_names_the_line(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    path.write_text('{"model": "m"}\n')
    assert f"{path}, line 1: not a sweep record" in report_error(capsys, path)


def test_report_on_a_record_without_the_expected_fields_names_them(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    full = sweep_record(sweep_jobs()[0])
    write_jsonl(path, [full, {k: v for k, v in full.items() if k not in ("score", "budget")}])
    assert f"{path}, line 2: a record without budget, score" in report_error(capsys, path)


def test_report_on_a_field_of_the_wrong_type_names_it(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    write_jsonl(path, [{**sweep_record(sweep_jobs()[0]), "score": "high"}])
    assert f"{path}, line 1: score must be a finite number, got 'high'" in report_error(capsys, path)


def test_report_on_a_truncated_gz_exits_1_naming_it(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl.gz"
    data = gzip.compress("".join(json.dumps(sweep_record(j)) + "\n" for j in sweep_jobs()).encode())
    path.write_bytes(data[: len(data) // 2])
    assert f"{path}: the gzip data is cut short" in report_error(capsys, path)


def test_report_on_a_file_named_gz_that_is_not_gzip_names_it(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl.gz"
    write_jsonl(path, [sweep_record(sweep_jobs()[0])])
    assert f"{path}: named .gz but not a gzip file" in report_error(capsys, path)


def test_report_on_an_empty_file_exits_1(tmp_path, capsys):
    path = tmp_path / "sweep.jsonl"
    path.write_text("")
    assert f"{path}: no sweep records in it" in report_error(capsys, path)


def test_gzip_is_read_by_its_content_whatever_the_name(tmp_path):
    path = tmp_path / "sweep.jsonl"
    path.write_bytes(gzip.compress((json.dumps(sweep_record(sweep_jobs()[0])) + "\n").encode()))
    assert [r["key"] for r in read_records(path)] == [sweep_jobs()[0].key()]
