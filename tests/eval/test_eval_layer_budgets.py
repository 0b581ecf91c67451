"""santa eval run --layer-budgets FILE: a santa tune budgets schedule on every sampled job of a sweep."""

from __future__ import annotations

import json

import pytest

from helpers import refusal
from santa.eval.report import setting_label
from santa.eval.runner import grid

GRID = dict(models=["smollm2-135m"], tasks=["niah_single"], lengths=[1024], methods=["dense", "systematic"],
            budgets=[4], prompts=[0])


def test_the_schedule_goes_to_every_sampled_job_and_to_no_dense_one():
    jobs = grid(**GRID, layer_budgets={0: 8, 3: 2}, schedule="learned")
    by_method = {j.method: j for j in jobs}
    assert by_method["systematic"].schedule == "learned" and by_method["systematic"].layer_budgets == ((0, 8), (3, 2))
    assert by_method["dense"].schedule == "" and by_method["dense"].layer_budgets == ()
    assert by_method["systematic"].config().layer_budgets == {0: 8, 3: 2}


def test_jobs_without_a_schedule_keep_their_old_keys_and_scheduled_ones_get_new_ones():
    plain = {j.method: j.key() for j in grid(**GRID)}
    scheduled = {j.method: j.key() for j in grid(**GRID, layer_budgets={0: 8}, schedule="learned")}
    assert "schedule" not in plain["systematic"] and "layer_budgets" not in plain["systematic"]
    assert scheduled["dense"] == plain["dense"] and scheduled["systematic"] != plain["systematic"]
    assert json.loads(scheduled["systematic"])["layer_budgets"] == [[0, 8]]


def test_the_report_shows_the_schedule_in_the_setting():
    record = {"prefill": "dense", "task": "niah_single", "schedule": "learned"}
    assert setting_label(record) == "dense+learned"
    assert setting_label({"prefill": "dense", "task": "niah_single"}) == "dense"


@pytest.mark.parametrize("text,match", [
    ('{"layer_budgets": {"0": 0}}', "budget"),
    ('{"layer_budgets": {}}', "is empty"),
    ("not json", "not valid JSON"),
])
def test_a_bad_schedule_file_is_refused_before_any_work(tmp_path, capsys, monkeypatch, text, match):
    import santa.eval.cli as eval_cli
    from santa.cli import main

    # patched where the command looks it up (patching santa.eval.runner.run_sweep before santa.eval.cli
    # was first imported bound the fake there for every later test)
    monkeypatch.setattr(eval_cli, "run_sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    path = tmp_path / "schedule.json"
    path.write_text(text)
    err = refusal(main, ["eval", "run", "--out", str(tmp_path / "s.jsonl"), "--layer-budgets", str(path)], capsys)
    assert "--layer-budgets" in err and match in err


def test_grid_refuses_bad_schedules_by_name():
    with pytest.raises(ValueError, match="layer_budgets"):
        grid(**GRID, layer_budgets={-1: 4})
    with pytest.raises(ValueError, match="schedule"):
        grid(**GRID, layer_budgets={0: 4}, schedule="")
