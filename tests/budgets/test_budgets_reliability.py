"""``santa ablate`` / ``santa tune``: one writer per output, resume that checks every history line,
schedule labels that cannot collide, every flag checked before any work, plain help texts, and the
integer convention of :mod:`santa.checks` in the budgets library. Tiny random model, no Ray started."""

import argparse
import gzip
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import CUDA, TINY_CELLS_FLAGS, CountingScorer, exit_code_and_stderr, refusal
from santa.budgets.reinforce import Episode, PolicyState, reinforce_step, sample_schedule
from santa.budgets.rewards import RewardSpec
from santa.budgets.run_folder import (
    HISTORY,
    RUN,
    CheckpointError,
    RunLocked,
    TuneSpec,
    history_lock,
    resume,
    update_record,
)
from santa.budgets.sweep import Cell, run_cells
from santa.schedule_file import write_schedule
from santa.sweep_files import SweepLocked, append_record, read_records, sweep_lock
from santa.writer_lock import writer_lock

# The run that `santa tune budgets` + TUNE asks for (the CLI's defaults on the 2-layer tiny model).
CLI_SPEC = TuneSpec(reward=RewardSpec(kind="synthetic", model="tiny-random"), n_layers=2, total=16, floor=1, max_staleness=4)
TUNE = ["budgets", "--model", "tiny-random", "--reward", "synthetic", "--no-plots", "--no-progress", "--device", "cpu",
        "--workers", "1", "--num-cpus", "1"]


def ablate(argv, capsys):
    """``santa ablate ARGV`` run to its return value (no SystemExit): (that status, its stderr)."""
    from santa.budgets.ablate_cli import main

    return main(argv), capsys.readouterr().err


def tune_cli(argv, capsys):
    """``santa tune ARGV`` run to its return value (no SystemExit): (that status, its stderr)."""
    from santa.budgets.tune_cli import main

    return main(argv), capsys.readouterr().err


def no_model(*args, **kwargs):
    raise AssertionError("a model was loaded although the command had to stop before any work")


def one_line_error(err, prog, *fragments):
    assert err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    assert "Traceback" not in err and "usage:" not in err
    for fragment in fragments:
        assert str(fragment) in err, err


def cell_command(tmp_path, command):
    """(argv without --out, program name, main) of `ablate layers` or `tune evaluate` on the tiny model."""
    if command == "ablate":
        return ["layers", "--base", "4", *TINY_CELLS_FLAGS], "santa ablate layers", ablate
    schedule = write_schedule(tmp_path / "learned.json", [6, 2])
    return ["evaluate", "--schedule", str(schedule), *TINY_CELLS_FLAGS], "santa tune evaluate", tune_cli


# --- 1. one writer per output ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ablate", "evaluate"])
def test_a_second_writer_of_a_cells_file_exits_1_naming_it(tmp_path, capsys, no_work, command):
    argv, prog, main = cell_command(tmp_path, command)
    out = tmp_path / "cells.jsonl"
    with writer_lock(out):  # another run holds the file
        code, err = main([*argv, "--out", str(out)], capsys)
    assert code == 1
    one_line_error(err, prog, out, "another run is writing this file")
    assert out.read_bytes() == b""  # nothing written


def test_the_cells_lock_is_the_eval_run_lock(tmp_path):
    """One implementation: an `eval run` holding a file keeps the cells out of it, and the other way round."""
    out = tmp_path / "cells.jsonl"
    cells = [Cell("c", (1, 2))]
    with sweep_lock(out), pytest.raises(SweepLocked, match="another run is writing this file"):
        run_cells(cells, out=out, prompts=[0], setting={}, make_scorer=no_model, progress=False)
    with writer_lock(out), pytest.raises(SweepLocked, match="another `santa eval run` is writing this file"):
        with sweep_lock(out):
            pass
    assert run_cells(cells, out=out, prompts=[0], setting={}, make_scorer=CountingScorer, progress=False) == 1  # free again


HOLDER = """import sys, time
from santa.writer_lock import writer_lock
with writer_lock(sys.argv[1]), writer_lock(sys.argv[2]):
    print('locked', flush=True); time.sleep(300)"""


def test_a_writer_in_another_process_keeps_the_second_one_out(tmp_path):
    out, history = tmp_path / "cells.jsonl", tmp_path / HISTORY
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), str(history)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"locked\n"
        with pytest.raises(SweepLocked, match=re.escape(str(out))):
            run_cells([Cell("c", (1, 2))], out=out, prompts=[0], setting={}, make_scorer=no_model, progress=False)
        with pytest.raises(RunLocked, match="another `santa tune budgets` is writing"), history_lock(tmp_path):
            pass
    finally:
        holder.kill()
        holder.wait()
    with writer_lock(out), history_lock(tmp_path):  # the kernel dropped the killed holder's locks
        pass


def test_a_second_tune_driver_exits_1_before_ray_starts(tmp_path, capsys, no_work):
    ray = pytest.importorskip("ray")
    with history_lock(tmp_path):
        code, err = tune_cli([*TUNE, "--out", str(tmp_path)], capsys)
    assert code == 1
    one_line_error(err, "santa tune budgets", tmp_path / HISTORY, "another `santa tune budgets` is writing")
    assert not ray.is_initialized() and not (tmp_path / RUN).exists()


def test_tune_library_refuses_a_second_driver(tmp_path):
    pytest.importorskip("ray")
    from santa.budgets.distributed import tune

    with writer_lock(tmp_path / HISTORY), pytest.raises(RunLocked):
        tune(CLI_SPEC, out=tmp_path, iterations=1, workers=1, device="cpu", progress=False)


# --- 2. resume checks every history line -------------------------------------------------------------


def valid_history(spec=CLI_SPEC, updates=3, per_update=2) -> list[dict]:
    """History records as the driver writes them: REINFORCE steps from θ = 0 (sessions 0, 0, 1)."""
    state, thetas, records = PolicyState.initial(spec.n_layers), {0: (0.0,) * spec.n_layers}, []
    for u in range(updates):
        session = 0 if u < 2 else 1
        episodes = []
        for k in range(per_update):
            schedule = sample_schedule(state.theta, total=spec.total, floor=spec.floor, rng=np.random.default_rng(10 * u + k))
            episodes.append(Episode(f"{session}-{u}-{k}", tuple(int(s) for s in schedule), 0.1 * k + 0.01 * u, state.version, "w", 0.1, "cpu", 1, 1.0))
        step = reinforce_step(state, episodes, theta_of=thetas.__getitem__, total=spec.total, floor=spec.floor, alpha=spec.alpha)
        state = step.state
        thetas[state.version] = state.theta
        records.append(update_record(state=state, session=session, baseline=step.baseline, gradient=step.gradient,
                                     episodes=episodes, workers=1, time=1.0))
    return records


def write_history(folder: Path, records, extra_lines=()) -> Path:
    path = folder / HISTORY
    path.write_text("".join(line + "\n" for line in [json.dumps(r) for r in records] + list(extra_lines)))
    return path


def test_a_valid_history_resumes_with_a_torn_last_line_skipped(tmp_path):
    records = valid_history()
    write_history(tmp_path, records, ['{"key": "update 4", "upd'])
    resumed = resume(tmp_path, 2, spec=CLI_SPEC)
    assert resumed.state.version == 3 and resumed.session == 2 and len(resumed.episode_ids) == 6
    assert resumed.state.theta == tuple(records[-1]["theta"])


def broken(change):
    def make():
        records = valid_history()
        change(records)
        return records

    return make


def _set(index, key, value):
    return broken(lambda r: r[index].__setitem__(key, value))


def _episode(index, key, value):
    return broken(lambda r: r[index]["episodes"][0].__setitem__(key, value))


def _sessions(*sessions):
    return broken(lambda r: [record.__setitem__("session", s) for record, s in zip(r, sessions, strict=True)])


BROKEN = {  # case → (history, line, complaint)
    "missing theta": (broken(lambda r: r[1].pop("theta")), 2, "no 'theta'"),
    "missing episodes": (broken(lambda r: r[0].pop("episodes")), 1, "no 'episodes'"),
    "missing reward_count": (broken(lambda r: r[2].pop("reward_count")), 3, "no 'reward_count'"),
    "theta of 5 layers": (_set(1, "theta", [0.0] * 5), 2, "'theta' has 5 entries, the model has 2 layers"),
    "theta a string": (_set(0, "theta", "0,0"), 1, "'theta' must be a list"),
    "theta with null": (_set(0, "theta", [0.0, None]), 1, "'theta' must hold finite numbers"),
    "update a string": (_set(0, "update", "1"), 1, "'update' must be an integer"),
    "update a bool": (_set(0, "update", True), 1, "'update' must be an integer"),
    "a gap": (_set(2, "update", 4), 3, "update 4 where 3 was expected"),
    "session goes back": (_sessions(1, 1, 0), 3, "session 0 after session 1"),
    "negative session": (_sessions(-1, 0, 0), 1, "session -1"),
    "episodes empty": (_set(1, "episodes", []), 2, "an update without episodes"),
    "episode not an object": (broken(lambda r: r[0]["episodes"].__setitem__(0, "e")), 1, "episode 0: not a JSON object"),
    "episode id reused": (broken(lambda r: r[2]["episodes"][1].__setitem__("id", r[0]["episodes"][0]["id"])), 3, "is accepted twice"),
    "episode id missing": (broken(lambda r: r[1]["episodes"][0].pop("id")), 2, "episode 0: no 'id'"),
    "schedule of 3 layers": (_episode(0, "schedule", [5, 5, 6]), 1, "'schedule' has 3 entries"),
    "schedule of floats": (_episode(0, "schedule", [8.0, 8.0]), 1, "'schedule' must hold integers"),
    "schedule of another total": (_episode(0, "schedule", [9, 9]), 1, "does not sum to 16"),
    "version from the future": (_episode(1, "version", 2), 2, "version 2, expected one of the policies 0…1"),
    "reward NaN": (_episode(0, "reward", float("nan")), 1, "'reward' must be a finite number"),
    "reward_count off": (broken(lambda r: r[1].__setitem__("reward_count", 5)), 2, "reward_count 5, expected 2 + 2"),
    "reward_sum off": (broken(lambda r: r[2].__setitem__("reward_sum", r[2]["reward_sum"] + 1)), 3, "reward_sum"),
    "theta not the replay": (broken(lambda r: r[1]["theta"].__setitem__(0, r[1]["theta"][0] + 0.5)), 2, "theta differs"),
    "dropped not a list": (_set(0, "dropped", {}), 1, "'dropped' must be a list"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_resume_names_the_file_and_line_of_a_malformed_history_line(tmp_path, case):
    make, line, complaint = BROKEN[case]
    path = write_history(tmp_path, make())
    with pytest.raises(CheckpointError) as error:
        resume(tmp_path, 2, spec=CLI_SPEC)
    assert str(error.value).startswith(f"{path}, line {line}: ") and complaint in str(error.value)


@pytest.mark.parametrize(
    ("line", "complaint"),
    [("not json", "not a JSON record"), ("[1, 2]", "not a sweep record"), ('{"update": 1}', "not a sweep record"), ("{}", "not a sweep record")],
)
def test_resume_names_lines_that_are_not_records(tmp_path, line, complaint):
    path = write_history(tmp_path, valid_history()[:1], [line])
    with pytest.raises(CheckpointError, match=re.escape(f"{path}, line 2: {complaint}")):
        resume(tmp_path, 2)


def test_two_interleaved_drivers_are_named_at_the_first_repeated_update(tmp_path):
    records = valid_history()
    path = write_history(tmp_path, [records[0], records[1], records[0], records[2]])
    with pytest.raises(CheckpointError, match=re.escape(f"{path}, line 3: update 1 where 3 was expected")):
        resume(tmp_path, 2)


CORRUPT_RUN = {
    "not JSON": b"{",
    "a list": b"[]",
    "no reward": json.dumps({"n_layers": 2}).encode(),
    "bad staleness": json.dumps(CLI_SPEC.to_dict() | {"max_staleness": "x"}).encode(),
    "negative staleness": json.dumps(CLI_SPEC.to_dict() | {"max_staleness": -1}).encode(),
    "binary": b"\xff\xfe\x00",
}


@pytest.mark.parametrize("case", sorted(CORRUPT_RUN))
def test_tune_cli_exits_1_on_a_corrupt_run_json(tmp_path, capsys, no_work, case):
    pytest.importorskip("ray")
    (tmp_path / RUN).write_bytes(CORRUPT_RUN[case])
    code, err = tune_cli([*TUNE, "--out", str(tmp_path)], capsys)
    assert code == 1
    one_line_error(err, "santa tune budgets", tmp_path / RUN)


@pytest.mark.parametrize("case", ["missing theta", "theta of 5 layers", "update a string", "episode id reused", "schedule of floats"])
def test_tune_cli_exits_1_naming_a_malformed_history_line(tmp_path, capsys, no_work, case):
    ray = pytest.importorskip("ray")
    make, line, complaint = BROKEN[case]
    path = write_history(tmp_path, make())
    code, err = tune_cli([*TUNE, "--out", str(tmp_path)], capsys)
    assert code == 1
    one_line_error(err, "santa tune budgets", f"{path}, line {line}: ", complaint)
    assert not ray.is_initialized()


# --- 3. schedules of one file name ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("paths", "labels"),
    [
        (["learned.json"], ["learned"]),
        (["a/schedule.json", "b/schedule.json"], ["a/schedule", "b/schedule"]),
        (["x/run/schedule.json", "y/run/schedule.json", "z.json"], ["x/run/schedule", "y/run/schedule", "z"]),
        (["a/s.json", "b/t.json"], ["s", "t"]),
    ],
)
def test_schedule_labels_are_unique(tmp_path, paths, labels):
    from santa.budgets.tune_cli import schedule_labels

    assert list(schedule_labels([str(tmp_path / p) for p in paths])) == [f"schedule {label}" for label in labels]


def test_schedule_labels_of_one_stem_and_folder_fall_back_to_whole_paths(tmp_path):
    from santa.budgets.tune_cli import schedule_labels

    paths = [str(tmp_path / "a" / "s.json"), str(tmp_path / "a" / "s.txt")]
    assert list(schedule_labels(paths)) == [f"schedule {p}" for p in paths]


def test_evaluate_scores_two_schedules_of_one_file_name(tmp_path, capsys):
    first = write_schedule(tmp_path / "a" / "schedule.json", [6, 2])
    second = write_schedule(tmp_path / "b" / "schedule.json", [2, 6])
    out = tmp_path / "eval.jsonl"
    code, _ = tune_cli(["evaluate", "--schedule", str(first), "--schedule", str(second), "--out", str(out), *TINY_CELLS_FLAGS], capsys)
    assert code == 0
    cells = {(r["name"], tuple(r["schedule"])) for r in read_records(out)}
    assert cells == {("uniform", (4, 4)), ("schedule a/schedule", (6, 2)), ("schedule b/schedule", (2, 6))}


def test_evaluate_refuses_one_schedule_given_twice(tmp_path, capsys, no_work):
    from santa.budgets.tune_cli import main

    schedule = write_schedule(tmp_path / "a" / "schedule.json", [6, 2])
    again = tmp_path / "a" / ".." / "a" / "schedule.json"
    out = tmp_path / "e.jsonl"
    code, err = exit_code_and_stderr(main, ["evaluate", "--schedule", str(schedule), "--schedule", str(again), "--out", str(out), *TINY_CELLS_FLAGS], capsys)
    assert code == 2 and "given twice" in err and not out.exists()


# --- 4. every flag checked before any work -----------------------------------------------------------


needs_no_cuda = pytest.mark.skipif(CUDA, reason="CUDA is present")


CELL_FLAGS = [
    pytest.param(["--device", "cuda"], "--device", marks=needs_no_cuda),
    pytest.param(["--device", "cuda:0"], "--device", marks=needs_no_cuda),
    (["--device", "gpu"], "--device"),
    (["--prompts", "0-300000000"], "--prompts"),
    (["--prompts", "0-99999,200000"], "--prompts"),
    (["--seeds", "0-300000000"], "--seeds"),
    (["--seeds", str(2**63)], "--seeds"),
    (["--threads", str(2**40)], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--kl-tokens", "1"], "--kl-tokens"),
]


@pytest.mark.parametrize(("flags", "complaint"), [*CELL_FLAGS, (["--layers", "0-300000000"], "--layers"), (["--plot", "figure.xyz"], "--plot")])
def test_ablate_refuses_bad_flags_before_any_work(tmp_path, capsys, no_work, flags, complaint):
    from santa.budgets.ablate_cli import main

    if "--plot" in flags:
        pytest.importorskip("matplotlib")
        flags = ["--plot", str(tmp_path / flags[1])]
    out = tmp_path / "a.jsonl"
    assert complaint in refusal(main, ["layers", "--out", str(out), *TINY_CELLS_FLAGS, *flags], capsys)
    assert not out.exists()


@pytest.mark.parametrize(("flags", "complaint"), [*CELL_FLAGS, (["--ablation", "FOLDER"], "--ablation"), (["--ablation", "MISSING"], "--ablation")])
def test_evaluate_refuses_bad_flags_before_any_work(tmp_path, capsys, no_work, flags, complaint):
    from santa.budgets.tune_cli import main

    flags = [{"FOLDER": str(tmp_path), "MISSING": str(tmp_path / "missing.jsonl")}.get(f, f) for f in flags]
    schedule = write_schedule(tmp_path / "s.json", [6, 2])
    out = tmp_path / "e.jsonl"
    assert complaint in refusal(main, ["evaluate", "--schedule", str(schedule), "--out", str(out), *TINY_CELLS_FLAGS, *flags], capsys)
    assert not out.exists()


@pytest.mark.parametrize("command", ["ablate", "evaluate"])
@pytest.mark.parametrize("out", ["FOLDER", "cells.jsonl.gz", "file/below/a/file.jsonl", ""])
def test_cells_commands_refuse_an_out_that_is_not_a_writable_jsonl_file(tmp_path, capsys, no_work, command, out):
    from santa.budgets.ablate_cli import main as ablate_main
    from santa.budgets.tune_cli import main as tune_main

    (tmp_path / "file").write_text("x")
    out = str(tmp_path) if out == "FOLDER" else out and str(tmp_path / out)
    argv, _, _ = cell_command(tmp_path, command)
    assert "--out" in refusal(ablate_main if command == "ablate" else tune_main, [*argv, "--out", out], capsys)


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--out", "FILE"], "--out"),
        (["--out", "FILE/run"], "--out"),
        (["--train-prompts", "0-300000000"], "--train-prompts"),
        (["--threads", str(2**40)], "--threads"),
        (["--device", "cuda:0"], "--device"),
        (["--device", "tpu"], "--device"),
        pytest.param(["--device", "cuda"], "--device cuda: CUDA is not available", marks=needs_no_cuda),
        pytest.param(["--device", "cuda", "--reward", "kl", "--num-gpus", "1"], "--device cuda: CUDA is not available", marks=needs_no_cuda),
        (["--kl-tokens", "1", "--reward", "kl"], "--kl-tokens"),
    ],
)
def test_tune_budgets_refuses_bad_flags_before_any_work(tmp_path, capsys, no_work, flags, complaint):
    from santa.budgets.tune_cli import main

    (tmp_path / "file").write_text("x")
    flags = [str(tmp_path / "file") + f[len("FILE"):] if f.startswith("FILE") else f for f in flags]
    assert complaint in refusal(main, [*TUNE, "--out", str(tmp_path / "run"), *flags], capsys)
    assert not (tmp_path / "run").exists()


def test_tune_budgets_takes_cuda_on_a_cluster(tmp_path):
    """With --address the workers' GPUs are the cluster's: this machine's CUDA is not asked."""
    from santa.budgets.tune_cli import build_parser, check_workers

    parser = build_parser()
    args = parser.parse_args(["budgets", "--out", str(tmp_path), "--device", "cuda", "--address", "auto"])
    check_workers(parser, args)  # no SystemExit


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("garbage\n", "line 1: not a JSON record"),
        ('{"key": "k", "task": "niah_single", "method": "dense"}\n', "line 1: not a schedule cell record (no 'name' string)"),
        ('{"key": "k", "name": "uniform", "total": 8, "scores": {"0": "high"}}\n', "line 1: not a schedule cell record (scores must map"),
        ('{"key": "k", "name": "uniform", "total": 8.5, "scores": {"0": 1.0}}\n', "'total' must be an integer"),
    ],
)
@pytest.mark.parametrize("command", ["ablate", "evaluate"])
def test_cells_commands_exit_1_naming_a_malformed_out_line(tmp_path, capsys, no_work, command, content, complaint):
    argv, prog, main = cell_command(tmp_path, command)
    out = tmp_path / "cells.jsonl"
    out.write_text(content)
    code, err = main([*argv, "--out", str(out)], capsys)
    assert code == 1
    one_line_error(err, prog, f"{out}, {complaint}" if complaint.startswith("line") else complaint)
    assert out.read_text() == content


def test_cells_commands_refuse_to_append_to_gzip_data(tmp_path, capsys, no_work):
    out = tmp_path / "cells.jsonl"
    out.write_bytes(gzip.compress(b'{"key": "k", "name": "uniform", "total": 8, "scores": {"0": 1.0}}\n'))
    code, err = ablate(["layers", "--out", str(out), "--base", "4", *TINY_CELLS_FLAGS], capsys)
    assert code == 1
    one_line_error(err, "santa ablate layers", out, "gzip")


def ablation_file(tmp_path, **change):
    record = {"key": "k", "name": "layer 5", "layer": 5, "total": 8, "scores": {"0": 1.0}, "model": "tiny-random", "metric": "kl",
              "length": 160, "sampler": "systematic", "kl_tokens": 8}
    path = tmp_path / "ablation.jsonl"
    append_record(path, record | change)
    return path


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({}, "ablates layer 5, the schedules have 2 layers"),  # was an IndexError after every cell ran
        ({"layer": 0, "model": "smollm2-135m"}, "an ablation of 'smollm2-135m'"),
        ({"layer": 0, "metric": None}, "no metric"),
        ({"layer": 0, "name": 3}, "not a schedule cell record"),
    ],
)
def test_evaluate_exits_1_on_an_ablation_it_cannot_use_before_any_cell_runs(tmp_path, capsys, no_work, change, complaint):
    schedule = write_schedule(tmp_path / "s.json", [6, 2])
    path = ablation_file(tmp_path, **change)
    out = tmp_path / "e.jsonl"
    code, err = tune_cli(["evaluate", "--schedule", str(schedule), "--out", str(out), "--ablation", str(path), *TINY_CELLS_FLAGS], capsys)
    assert code == 1
    one_line_error(err, "santa tune evaluate", path, complaint)
    assert not out.exists()


def test_evaluate_refuses_an_ablation_of_two_settings(tmp_path, capsys, no_work):
    schedule = write_schedule(tmp_path / "s.json", [6, 2])
    path = ablation_file(tmp_path, layer=0)
    ablation_file(tmp_path, layer=0, length=320, key="k2")  # a second grid in the same file
    code, err = tune_cli(["evaluate", "--schedule", str(schedule), "--out", str(tmp_path / "e.jsonl"), "--ablation", str(path), *TINY_CELLS_FLAGS], capsys)
    assert code == 1
    one_line_error(err, "santa tune evaluate", path, "2 settings")


# --- 5. plain help texts -------------------------------------------------------------------------


def all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from all_parsers(sub)


@pytest.mark.parametrize("module", ["santa.budgets.ablate_cli", "santa.budgets.tune_cli"])
def test_help_texts_hold_no_markup(module):
    for parser in all_parsers(importlib.import_module(module).build_parser()):
        for text in [parser.description or "", parser.epilog or ""] + [a.help or "" for a in parser._actions]:
            assert not re.search(r"`|:(func|class|mod|meth|data):", text), text


# --- 6. integer arguments of the library ------------------------------------------------------------


def library_calls():
    from santa import schedule_file
    from santa.budgets import ablate, reinforce, rewards, schedule, scorers

    return {
        "uniform_schedule n_layers": lambda v: schedule.uniform_schedule(n_layers=v, total=8),
        "uniform_schedule total": lambda v: schedule.uniform_schedule(n_layers=2, total=v),
        "one_hot_schedule layer": lambda v: schedule.one_hot_schedule(n_layers=3, layer=v, base=4),
        "one_hot_schedule base": lambda v: schedule.one_hot_schedule(n_layers=3, layer=0, base=v),
        "rounded_schedule total": lambda v: schedule.rounded_schedule([0.5, 0.5], total=v),
        "as_layer_budgets entry": lambda v: schedule_file.as_layer_budgets([4, v]),
        "layer_cells n_layers": lambda v: ablate.layer_cells(n_layers=v, base=4),
        "layer_cells one_hot": lambda v: ablate.layer_cells(n_layers=2, base=4, one_hot=v),
        "layer_cells seeds": lambda v: ablate.layer_cells(n_layers=2, base=4, seeds=[v]),
        "free_samples total": lambda v: reinforce.free_samples(n_layers=2, total=v, floor=1),
        "PolicyState.initial": lambda v: reinforce.PolicyState.initial(v),
        "episode_seed": lambda v: reinforce.episode_seed(v, "0-0-0"),
        "synthetic_target": lambda v: rewards.synthetic_target(v),
        "RewardSpec questions": lambda v: rewards.RewardSpec(questions=v),
        "RewardSpec pool": lambda v: rewards.RewardSpec(pool=(1, v)),
        "TuneSpec total": lambda v: TuneSpec(reward=RewardSpec(), n_layers=2, total=v),
        "TuneSpec max_staleness": lambda v: TuneSpec(reward=RewardSpec(), n_layers=2, total=8, max_staleness=v),
        "chunks batch": lambda v: scorers.chunks([0, 1, 2], v),
        "resume n_layers": lambda v: resume("/nonexistent-santa-folder", v),
    }


@pytest.mark.parametrize("call", sorted(library_calls()))
@pytest.mark.parametrize("value", [2.0, "2", None, True])
def test_budgets_library_refuses_a_non_integer_with_a_type_error(call, value):
    if value is None and call == "TuneSpec max_staleness":
        pytest.skip("None is no limit")
    with pytest.raises(TypeError):
        library_calls()[call](value)


@pytest.mark.parametrize("call", sorted(library_calls()))
def test_budgets_library_takes_numpy_integers_and_refuses_bad_values(call):
    library_calls()[call](np.int64(2))
    with pytest.raises(ValueError):
        library_calls()[call](-1)


def test_write_schedule_refuses_a_fractional_budget(tmp_path):
    with pytest.raises(TypeError, match=r"layer_budgets\[1\]"):
        write_schedule(tmp_path / "s.json", {0: 4, 1: 2.7})  # was written as 2
    assert not (tmp_path / "s.json").exists()
