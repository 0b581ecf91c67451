"""santa eval / santa bench reliability: hand-edited sweep records named by file and line, every flag
checked before any work (nothing loads for a bad command line), plain-text help, integer arguments."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from santa.cli import main
from santa.eval.report import cells, check_records, compare_methods, pivot, table
from santa.eval.runner import grid
from test_sweep_files import jobs, record, write


def kl_records() -> list[dict]:
    kl_jobs = grid(models=["m"], tasks=["kl"], lengths=[512], methods=["dense", "systematic"], budgets=[16], prompts=[0, 1])
    return [{"key": j.key(), **asdict(j), "score": 0.1 * (j.method != "dense"), "nll": 2.0, "prompt_tokens": 500,
             "new_tokens": 31} for j in kl_jobs]


def edited(records: list[dict], index: int, **fields) -> list[dict]:
    """``records`` with record ``index`` changed (a field set to ``DROP`` is removed)."""
    changed = {k: v for k, v in {**records[index], **fields}.items() if v is not DROP}
    return records[:index] + [changed] + records[index + 1 :]


DROP = object()
ACCURACY = [record(j) for j in jobs()]  # dense, topk S=16 on prompts 0 and 1 (dense first)
VIEWS = [[], ["--pivot"], ["--pivot", "--delta"], ["--smallest-budgets"], ["--compare", "systematic,topk"]]


# --- eval report: every field it reads is checked per line ---------------------------------------------

BAD_RECORDS = {
    "a KL record without nll": (kl_records, 1, {"nll": DROP}, "a record without nll"),
    "a NaN score": (lambda: ACCURACY, 0, {"score": float("nan")}, "score must be a finite number, got nan"),
    "an infinite score": (lambda: ACCURACY, 1, {"score": float("inf")}, "score must be a finite number, got inf"),
    "a NaN KL": (kl_records, 1, {"score": float("nan")}, "score must be a finite number, got nan"),
    "a NaN nll": (kl_records, 0, {"nll": float("nan")}, "nll must be a finite number ≥ 0, got nan"),
    "an accuracy above 1": (lambda: ACCURACY, 1, {"score": 2.0}, "score of a niah_single record must be in [0, 1]"),
    "a negative KL": (kl_records, 1, {"score": -0.5}, "score of a KL record must be ≥ 0"),
    "a dense record with a budget": (lambda: ACCURACY, 0, {"budget": 16}, "budget of a dense record must be 0"),
    "a sampled record with budget 0": (lambda: ACCURACY, 1, {"budget": 0}, "budget of a topk record must be ≥ 1"),
    "an unknown method": (lambda: ACCURACY, 1, {"method": "magic"}, "method must be one of dense, iid"),
    "an unknown task": (lambda: ACCURACY, 1, {"task": "chess"}, "task must be one of niah_single"),
    "an unknown prefill": (lambda: ACCURACY, 1, {"prefill": "half"}, "prefill must be one of dense, sampled"),
    "a negative prompt": (lambda: ACCURACY, 1, {"prompt": -1}, "prompt must be an integer ≥ 0, got -1"),
    "a float length": (lambda: ACCURACY, 1, {"length": 512.5}, "length must be an integer ≥ 0, got 512.5"),
    "a bool budget": (lambda: ACCURACY, 1, {"budget": True}, "budget must be an integer ≥ 0, got True"),
    "an empty model": (lambda: ACCURACY, 1, {"model": ""}, "model must be a non-empty string"),
    "a string share read": (lambda: ACCURACY, 1, {"v_rows_read": "a"}, "v_rows_read must be a number in [0, 1]"),
    "a share read above 1": (lambda: ACCURACY, 1, {"v_rows_read_kv": 3.0}, "v_rows_read_kv must be a number in [0, 1]"),
    "a string answer budget": (lambda: ACCURACY, 1, {"max_new_tokens": "x"}, "max_new_tokens must be an integer ≥ 1"),
    "a string score_samples": (lambda: ACCURACY, 1, {"score_samples": "8"}, "score_samples must be an integer ≥ 0"),
    "a numeric schedule": (lambda: ACCURACY, 1, {"schedule": 5}, "schedule must be a string, got 5"),
    "an unknown KL mode": (kl_records, 1, {"kl_mode": 3}, "kl_mode must be one of chunked, stepwise"),
    "negative new tokens": (lambda: ACCURACY, 1, {"new_tokens": -3}, "new_tokens must be an integer ≥ 0"),
}


@pytest.mark.parametrize("view", VIEWS[:2] + VIEWS[-1:], ids=lambda v: " ".join(v) or "table")
@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_report_names_the_file_and_line_of_a_record_it_cannot_use(tmp_path, capsys, case, view):
    make, index, fields, message = BAD_RECORDS[case]
    path = tmp_path / "sweep.jsonl"
    write(path, edited(make(), index, **fields))
    assert main(["eval", "report", str(path), *view]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"santa eval report: error: {path}, line {index + 1}: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err and "nan [" not in err


@pytest.mark.parametrize("case", ["a NaN score", "an infinite score", "a dense record with a budget", "an unknown method", "a negative prompt"])
def test_the_library_refuses_the_same_records_by_index(case):
    make, index, fields, message = BAD_RECORDS[case]
    records = edited(make(), index, **fields)
    with pytest.raises(ValueError, match=rf"records\[{index}\]: {message[:20]}"):
        cells(records)
    with pytest.raises(ValueError, match=rf"records\[{index}\]"):
        compare_methods(records, "systematic", "topk")
    with pytest.raises(ValueError, match=r"records\[0\] must be a dict"):
        check_records(["not a record"])


def test_a_kl_table_of_records_passed_without_nll_shows_no_perplexity():
    records = [{k: v for k, v in r.items() if k != "nll"} for r in kl_records()]
    text = table(cells(records))
    assert "ppl –" in text and "None" not in text


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: " ".join(v) or "table")
def test_valid_records_of_every_kind_still_report(tmp_path, capsys, view):
    path = tmp_path / "sweep.jsonl"
    write(path, ACCURACY + kl_records())
    assert main(["eval", "report", str(path), *view]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out


def test_pivot_shows_every_method_of_the_records():
    records = [record(j) for j in grid(models=["m"], tasks=["niah_single"], lengths=[512], methods=["dense", "iid", "prop"],
                                        budgets=[16], prompts=[0, 1])]
    text = pivot(cells(records))
    assert all(f"| {method} |" in text for method in ("dense", "iid", "prop"))
