"""Bad input the CLI audit found, refused before any work with a one-line error naming the flag
(status 2), or one line and status 1: one token with no decode step, ``--threads`` past the cap,
``--error-target`` with a sampler or kernel that has none, an ``eval run --out`` of another command,
/dev/null and folders that take no file as outputs, ``--out`` and ``--plot`` naming one file, a
one-hot ablation of the base budget itself, and the wording of flags' errors and help."""

from pathlib import Path

import pytest

import santa.cli
import santa.eval.cli
import santa.generate
from helpers import TINY_CELLS_FLAGS, refusal, sweep_jobs, sweep_record, write_jsonl
from santa.cli import main
from santa.cliargs import make_output_file, same_file
from santa.generate import Answer, Prompt
from santa.sweep_files import load_sweep

pytestmark = pytest.mark.usefixtures("no_work")  # tests/conftest.py: no model loads, no work runs

NOT_A_FILE = "/proc/santa-no-such-folder"  # a folder that cannot be made, root or not (os.access passes /proc)


def eval_run(out, *flags) -> list[str]:
    return ["eval", "run", "--out", str(out), "--lengths", "256", "--prompts", "0", "--methods", "dense", *flags]


# --- santa generate --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1", "0"])
def test_generate_refuses_one_new_token_which_no_decode_step_follows(capsys, value):
    err = refusal(main, ["generate", "--length", "256", "--max-new-tokens", value], capsys)
    assert "santa generate: error: argument --max-new-tokens: expected an integer ≥ 2 (the first token comes from the prefill" in err
    assert err.rstrip().endswith(f"got {value}")


def test_generate_takes_two_new_tokens(capsys, generate_run_arguments):
    assert main(["generate", "--length", "256", "--max-new-tokens", "2"]) == 1  # the stand-in's refusal: past the parser
    assert generate_run_arguments["max_new_tokens"] == 2


def test_an_answer_stopped_after_the_prefills_token_shows_no_decode_columns(capsys):
    """A stop token first: no decode step ran, so no share of V rows read and no decode speed (not "100 %")."""
    prompt = Prompt(task="user", text="hi", answers=(), n_tokens=2, seed=0)
    answers = [Answer(method=name, text="x", found=False, prefill_s=0.1, decode_s=1e-6, new_tokens=1, share_per_head=share,
                      share_per_kv_head=None) for name, share in (("dense (SDPA)", None), ("systematic S=64", None))]
    santa.cli.print_answers([prompt], answers, fast=False)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("dense", "systematic"))]
    assert len(rows) == 2 and all(row.split()[-5:-2] == ["n/a", "n/a", "0.10"] and "n/a  'x'" in row for row in rows)
    assert "%" not in "".join(rows)
    assert "n/a: no decode step ran (the answer's only token came from the prefill)" in out


@pytest.mark.parametrize("value", ["1025", "100000", str(2**40)])
def test_generate_caps_threads_as_the_other_commands_do(capsys, value):
    assert f"santa generate: error: argument --threads: at most 1024, got {value}" in refusal(main, ["generate", "--threads", value], capsys)


def test_generate_takes_the_most_threads(monkeypatch, generate_run_arguments):
    import torch

    seen = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    assert main(["generate", "--threads", "1024"]) == 1 and seen == [1024]


@pytest.mark.parametrize(("flags", "message"), [
    (["--sampler", "topk"], "argument --error-target: needs a stochastic --sampler (iid, stratified, systematic), got --sampler topk"),
    (["--sampler", "dense"], "argument --error-target: needs a stochastic --sampler (iid, stratified, systematic), got --sampler dense"),
    (["--kernel", "flash"], "argument --error-target: runs on --kernel prop (its pilot reads the global CDF), not on --kernel flash"),
])
def test_generate_refuses_an_error_target_without_a_pilot_at_parse_time(capsys, flags, message):
    assert f"santa generate: error: {message}" in refusal(main, ["generate", "--error-target", "0.1", *flags], capsys)


# --- santa eval run --out --------------------------------------------------------------------------


CELL = {"key": "k", "name": "uniform", "layer": None, "schedule": [4, 4], "total": 8, "seed": 0, "scores": {"0": 0.5}, "score": 0.5}
UPDATE = {"key": "update 1", "update": 1, "theta": [0.0, 0.0], "episodes": []}


@pytest.mark.parametrize(("record", "holds"), [
    (CELL, "a schedule cell of santa ablate layers / santa tune evaluate"),
    (UPDATE, "a policy update of santa tune budgets (history.jsonl)"),
    ({"key": "k", "x": 1}, "not a sweep record of santa eval run (a record without model, task"),
])
def test_eval_run_refuses_to_append_to_another_commands_file(no_work, monkeypatch, capsys, record, holds):
    import santa.eval.cli
    import santa.eval.runner

    monkeypatch.setattr(santa.eval.cli, "run_sweep", santa.eval.runner.run_sweep)  # its loads stay refused (no_work)
    out = no_work / "e.jsonl"
    write_jsonl(out, [record])
    before = out.read_bytes()
    assert main(eval_run(out)) == 1  # not WorkStarted: refused on the records run_sweep reads, before any model loads
    err = capsys.readouterr().err
    assert err.startswith(f"santa eval run: error: {out}, line 1: {holds}") and err.count("\n") == 1
    assert "give --out a sweep file of santa eval run, or a new file" in err
    assert out.read_bytes() == before


@pytest.mark.parametrize("content", ["", "SWEEP"])
def test_eval_run_resumes_its_own_sweep_file_or_an_empty_one(no_work, monkeypatch, content):
    out = no_work / "e.jsonl"
    if content:
        write_jsonl(out, [sweep_record(job) for job in sweep_jobs()])
    else:
        out.write_text("")
    checked = []

    def sweep(jobs, out, *, check_records, **kwargs):  # the check run_sweep makes on the records it reads
        records = load_sweep(out).records
        check_records(Path(out), records)
        checked.append(len(records))
        return 0

    monkeypatch.setattr(santa.eval.cli, "run_sweep", sweep)
    assert main(eval_run(out)) == 0
    assert checked == [len(sweep_jobs()) if content else 0]


def test_eval_run_refuses_dev_null_as_out(no_work, capsys):
    err = refusal(main, eval_run("/dev/null"), capsys)
    assert "santa eval run: error: argument --out: /dev/null is not a regular file (a device, pipe or socket); give a file path" in err
    assert make_output_file("/dev/null").startswith("/dev/null is not a regular file")


def test_eval_run_says_a_failed_write_in_one_line(no_work, monkeypatch, capsys):
    """An error while appending (a full disk, a file system that refuses fsync) names --out: status 1, no traceback."""

    def fail(jobs, out, **kwargs):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(santa.eval.cli, "run_sweep", fail)
    out = no_work / "e.jsonl"
    assert main(eval_run(out)) == 1
    assert capsys.readouterr().err == f"santa eval run: error: {out}: cannot append the sweep's records (Invalid argument)\n"


# --- outputs tried before the work ---------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["eval", "variance", "--out", "/dev/null"],
    ["eval", "bernoulli", "--out", f"{NOT_A_FILE}/x.json"],
    ["eval", "variance", "--plot", f"{NOT_A_FILE}/x.png"],
    ["bench", "e2e", "--out", f"{NOT_A_FILE}/run"],
    ["bench", "capture", "--out", f"{NOT_A_FILE}/x.pt"],
    ["ablate", "layers", "--out", "OUT", "--plot", f"{NOT_A_FILE}/a.png", *TINY_CELLS_FLAGS],
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(no_work, capsys, argv):
    pytest.importorskip("matplotlib")
    argv = [str(no_work / "a.jsonl") if a == "OUT" else a for a in argv]
    flag = next(a for a in argv if a.startswith(NOT_A_FILE) or a == "/dev/null")
    err = refusal(main, argv, capsys)
    assert f"error: argument {argv[argv.index(flag) - 1]}: " in err
    assert "is not a regular file" in err if flag == "/dev/null" else f"cannot create the folder {NOT_A_FILE}" in err


@pytest.mark.parametrize("command", ["variance", "bernoulli"])
@pytest.mark.parametrize(("out", "plot"), [("same.png", "same.png"), ("same.png", "./same.png"), ("same.png", "same")])
def test_eval_diagnostics_refuse_out_and_plot_naming_one_file(no_work, monkeypatch, capsys, command, out, plot):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(no_work)
    err = refusal(main, ["eval", command, "--out", out, "--plot", plot], capsys)
    assert f"santa eval {command}: error: argument --plot: {plot} is also --out" in err


def test_ablate_refuses_out_and_plot_naming_one_file(no_work, capsys):
    pytest.importorskip("matplotlib")
    out = no_work / "a.png"
    err = refusal(main, ["ablate", "layers", "--out", str(out), "--plot", str(out), *TINY_CELLS_FLAGS], capsys)
    assert f"santa ablate layers: error: argument --plot: {out} is also --out" in err and not out.exists()


def test_same_file_follows_links(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "a.json")
    assert same_file(str(tmp_path / "link.json"), str(tmp_path / "a.json"))
    assert same_file(str(tmp_path / "sub" / ".." / "b.png"), str(tmp_path / "b.png"))
    assert not same_file(str(tmp_path / "a.json"), str(tmp_path / "a.png"))


# --- santa ablate / santa tune ---------------------------------------------------------------------


def test_ablate_refuses_a_one_hot_budget_equal_to_the_base(no_work, capsys):
    out = no_work / "a.jsonl"
    err = refusal(main, ["ablate", "layers", "--out", str(out), "--one-hot", "16", "--base", "16", *TINY_CELLS_FLAGS], capsys)
    assert "santa ablate layers: error: argument --one-hot: must differ from --base (16)" in err and not out.exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["ablate", "layers", "--out", "OUT", "--metric", "foo", *TINY_CELLS_FLAGS], "santa ablate layers: error: argument --metric: invalid choice: 'foo' (choose from kl, "),
    (["tune", "budgets", "--out", "OUT", "--reward", "foo"], "santa tune budgets: error: argument --reward: invalid choice: 'foo' (choose from kl, "),
    (["ablate", "layers", "--out", "OUT", "--model", "foo"], "santa ablate layers: error: argument --model: invalid choice: 'foo'"),
])
def test_metric_reward_and_model_errors_name_their_flag(no_work, capsys, argv, message):
    err = refusal(main, [str(no_work / "out") if a == "OUT" else a for a in argv], capsys)
    assert message in err
    assert ("synthetic)" in err) == ("--reward" in argv)  # tune budgets' --reward takes synthetic too


# --- help -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["variance", "bernoulli"])
def test_eval_diagnostics_help_describes_every_flag_and_no_sweep_file(capsys, command):
    with pytest.raises(SystemExit) as stop:
        main(["eval", command, "-h"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert stop.value.code == 0
    assert "--model MODEL bundled model: smollm2-135m (default)" in out
    assert "--device DEVICE cpu, cuda or cuda:N (default: cuda when present, else cpu)" in out
    assert "exit status: 0 done; 1 the work failed" in out and "sweep file" not in out
