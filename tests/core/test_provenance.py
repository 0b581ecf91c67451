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
