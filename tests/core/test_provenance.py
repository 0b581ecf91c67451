"""santa.provenance.code_commit: the commit written beside every benchmark and sweep record."""

import re

from santa.provenance import code_commit, source_dirty


def test_santa_commit_overrides_the_checkouts_git_head(monkeypatch):
    monkeypatch.setenv("SANTA_COMMIT", "d0363c3")
    assert code_commit() == "d0363c3"
    assert source_dirty() is None  # this checkout's .git says nothing about that commit


def test_without_the_variable_it_is_this_checkouts_short_head_or_none(monkeypatch):
    monkeypatch.delenv("SANTA_COMMIT", raising=False)
    commit = code_commit()
    assert commit is None or re.fullmatch(r"[0-9a-f]{4,40}", commit)
    assert source_dirty() in ((None,) if commit is None else (True, False))


def test_run_record_holds_what_a_rerun_needs(monkeypatch):
    from santa.provenance import run_record

    monkeypatch.setenv("SANTA_COMMIT", "abc1234")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("HOME_UNRELATED_SECRET", "x")
    record = run_record(["benchmarks/kernels/paged_ab.py", "out dir/x.jsonl", "--fp8"])
    assert record["command"] == "python benchmarks/kernels/paged_ab.py 'out dir/x.jsonl' --fp8"  # pasteable
    assert record["env"]["SANTA_COMMIT"] == "abc1234" and record["env"]["TRITON_INTERPRET"] == "1"
    assert "HOME_UNRELATED_SECRET" not in record["env"]
    assert record["commit"] == "abc1234" and record["source_dirty"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["date"])
    assert record["device"] == "cpu" or record["device"]
    assert {"python", "host", "torch"} <= set(record)
    assert run_record(["/venv/bin/santa", "bench", "e2e", "--batch", "16"])["command"] == "santa bench e2e --batch 16"
