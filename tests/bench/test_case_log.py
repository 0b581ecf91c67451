"""The kernel A/B scripts' resumable case files (benchmarks/bench/case_log.py): one run record, cases appended and
skipped on a re-run, one writer at a time."""

import json

import pytest
from benchmarks.bench.case_log import add_case, cases_done, run_locked


def test_a_new_file_gets_one_run_record_and_a_rerun_sees_its_cases(tmp_path, capsys):
    path = str(tmp_path / "cases.jsonl")
    seen = []

    def measure():  # as the scripts do: the keys done, then each case measured and added
        seen.append(cases_done(path))
        add_case(path, {"key": "llama/b1/n512", "us": 1.5})

    run_locked(path, "script.py", measure)  # the lock creates the file
    assert json.loads(capsys.readouterr().out) == {"key": "llama/b1/n512", "us": 1.5}
    run_locked(path, "script.py", lambda: seen.append(cases_done(path)))
    assert seen == [set(), {"run", "llama/b1/n512"}]  # the re-run writes no second run record
    lines = [json.loads(line) for line in open(path)]
    assert [line["key"] for line in lines] == ["run", "llama/b1/n512"] and "command" in lines[0]


def test_a_second_writer_is_refused_with_one_line_naming_the_script(tmp_path):
    path = str(tmp_path / "cases.jsonl")
    ran = []

    def nested():
        ran.append("outer")
        run_locked(path, "inner.py", lambda: ran.append("inner"))

    with pytest.raises(SystemExit) as exit_info:
        run_locked(path, "outer.py", nested)
    assert ran == ["outer"]  # the second writer never measured
    assert str(exit_info.value.code).startswith("inner.py: ") and path in str(exit_info.value.code)
