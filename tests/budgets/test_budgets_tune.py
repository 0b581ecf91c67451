"""``santa tune budgets`` on a 2-CPU local Ray: the asynchronous REINFORCE driver, killed workers,
a stopped and a killed driver resumed from the history, and the tiny model's −KL reward.

No test depends on timing: faults are injected at fixed episodes and updates (``Hooks``), and the
assertions hold for any order in which the workers' results land.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import SYNTHETIC_SPEC, assert_consistent_history, refusal, tune_history

ray = pytest.importorskip("ray")

from santa.budgets import tune_cli  # noqa: E402
from santa.budgets.distributed import Hooks, desired_workers, tune  # noqa: E402
from santa.budgets.rewards import RewardSpec  # noqa: E402
from santa.budgets.run_folder import HISTORY, TuneSpec  # noqa: E402
from santa.schedule_file import load_layer_budgets  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    # Ray's memory monitor kills workers when the machine (shared with other jobs) is nearly full:
    # a kill these tests did not inject. Their workers are small; switch the monitor off.
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def run(out, *, iterations, workers=2, hooks=None, spec=SYNTHETIC_SPEC):
    hooks = hooks or Hooks()
    return tune(spec, out=out, iterations=iterations, workers=workers, device="cpu", poll_s=0.2, progress=False, hooks=hooks)


def episode_ids(updates):
    return [e["id"] for u in updates for e in u["episodes"]]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain")
    return out, run(out, iterations=4)


def test_run_reaches_the_iterations_plus_at_most_the_runs_in_flight(plain_run):
    out, result = plain_run
    assert 4 <= result.state.version <= 4 + 1  # the other worker's run in flight is accepted at the end
    assert len(tune_history(out)) == result.state.version


def test_run_history_replays_to_its_logits(plain_run):
    out, _ = plain_run
    assert_consistent_history(tune_history(out))


def test_every_update_holds_whole_runs_of_e_episodes(plain_run):
    out, _ = plain_run
    assert all(len(u["episodes"]) % SYNTHETIC_SPEC.episodes == 0 for u in tune_history(out))  # one run, or two landing together


def test_run_writes_a_schedule_that_santa_config_takes(plain_run):
    import santa.hf

    out, result = plain_run
    budgets = load_layer_budgets(out / "schedule.json")
    assert sum(budgets.values()) == SYNTHETIC_SPEC.total and list(budgets.values()) == result.schedule
    assert santa.hf.SantaConfig(layer_budgets=budgets).budget_for(3) == result.schedule[3]


@pytest.fixture(scope="module")
def killed_workers_run(tmp_path_factory):
    """Both first workers os._exit on their 2nd episode (of E = 3): each run keeps only episode 0."""
    out = tmp_path_factory.mktemp("killed")
    run(out, iterations=3, hooks=Hooks(worker_faults={0: 2, 1: 2}))
    return tune_history(out)


def test_killed_worker_loses_only_its_episode_in_flight(killed_workers_run):
    ids = set(episode_ids(killed_workers_run))
    assert {"0-0-0", "0-1-0"} <= ids  # finished before the kill: accepted
    assert not ids & {"0-0-1", "0-0-2", "0-1-1", "0-1-2"}  # in flight / never started: lost


def test_killed_workers_are_replaced(killed_workers_run):
    workers = {e["worker"] for u in killed_workers_run for e in u["episodes"]}
    assert workers - {"0-w0", "0-w1"}  # the two first workers give at most 2 updates of 3


def test_killed_workers_history_is_consistent(killed_workers_run):
    assert len(killed_workers_run) >= 3
    assert_consistent_history(killed_workers_run)


class Stop(Exception):
    pass


def stop_at(k):
    def on_update(u):
        if u == k:
            raise Stop

    return on_update


def test_stopped_driver_resumes_with_another_worker_count(tmp_path):
    with pytest.raises(Stop):
        run(tmp_path, iterations=10, hooks=Hooks(on_update=stop_at(2)))
    before = (tmp_path / HISTORY).read_bytes()
    assert len(tune_history(tmp_path)) == 2
    run(tmp_path, iterations=4, workers=1)
    updates = tune_history(tmp_path)
    assert (tmp_path / HISTORY).read_bytes().startswith(before)  # accepted lines untouched
    assert len(updates) == 4  # one worker: nothing in flight at the end
    assert [u["session"] for u in updates] == [0, 0, 1, 1]
    assert_consistent_history(updates)


KILLED_DRIVER = """
import os, sys
from santa.budgets.run_folder import TuneSpec
from santa.budgets.distributed import Hooks, tune
from santa.budgets.rewards import RewardSpec

spec = TuneSpec(reward=RewardSpec(kind="synthetic", model="tiny-random"), n_layers=4, total=16, floor=1, alpha=0.5, episodes=3)
def die(u):
    if u == 2:
        os._exit(9)  # a killed driver: no cleanup, runs in flight lost
tune(spec, out=sys.argv[1], iterations=10, workers=2, num_cpus=2, device="cpu", poll_s=0.2, progress=False, hooks=Hooks(on_update=die))
"""


def test_killed_driver_resumes_from_its_history(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(KILLED_DRIVER), str(tmp_path)], capture_output=True, timeout=300, env=os.environ | {"RAY_memory_monitor_refresh_ms": "0"}
    )
    assert done.returncode == 9, done.stderr.decode()[-2000:]
    accepted = tune_history(tmp_path)
    assert [u["update"] for u in accepted] == [1, 2]
    run(tmp_path, iterations=3, workers=1)
    updates = tune_history(tmp_path)
    assert updates[:2] == accepted
    assert set(episode_ids(accepted)) <= set(episode_ids(updates))
    assert_consistent_history(updates)


def test_resume_refuses_other_settings(tmp_path):
    from santa.budgets.run_folder import CheckpointError, prepare

    prepare(tmp_path, SYNTHETIC_SPEC)
    other = TuneSpec(reward=SYNTHETIC_SPEC.reward, n_layers=4, total=20, episodes=3)
    with pytest.raises(CheckpointError, match="total"):
        prepare(tmp_path, other)


def test_tiny_model_kl_reward_run(tmp_path):
    reward = RewardSpec(kind="kl", model="tiny-random", length=160, questions=2, pool=(0, 1), kl_tokens=8)
    spec = TuneSpec(reward=reward, n_layers=2, total=8, floor=1, alpha=0.02, episodes=2)
    result = run(tmp_path, iterations=2, spec=spec)
    rewards = [e["reward"] for u in result.updates for e in u["episodes"]]
    assert rewards and all(-10 < r <= 0 for r in rewards)  # −KL
    assert_consistent_history(result.updates, spec)


def test_desired_workers_file_overrides_the_request(tmp_path):
    assert desired_workers(requested=2, out=tmp_path, cluster={}, gpu=False, threads=1) == 2
    (tmp_path / "workers").write_text("5\n")
    assert desired_workers(requested=2, out=tmp_path, cluster={}, gpu=False, threads=1) == 5


def test_desired_workers_file_is_capped_by_what_the_cluster_can_place(tmp_path):
    (tmp_path / "workers").write_text("1000000\n")  # would start a million actors that wait forever
    assert desired_workers(requested=2, out=tmp_path, cluster={"CPU": 8}, gpu=False, threads=2) == 4
    assert desired_workers(requested=None, out=tmp_path, cluster={"CPU": 64, "GPU": 2}, gpu=True, threads=1) == 2


def test_desired_workers_auto_is_one_per_gpu_else_per_threads_cpus(tmp_path):
    assert desired_workers(requested=None, out=tmp_path, cluster={"CPU": 64, "GPU": 8}, gpu=True, threads=1) == 8
    assert desired_workers(requested=None, out=tmp_path, cluster={"CPU": 16}, gpu=False, threads=4) == 4


# --- the command line (no Ray started: every flag is checked first) -------------------------------


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--alpha", "-1"], "--alpha"),
        (["--workers", "0"], "--workers"),
        (["--episodes", "x"], "--episodes"),
        (["--questions", "8", "--train-prompts", "0-3"], "--questions"),
        (["--reward", "nope"], "argument --reward: invalid choice: 'nope'"),
        (["--model", "gpt-17"], "--model"),
        (["--total", "3", "--floor", "2"], "--total"),  # tiny-random has 2 layers: 3 < 2 × 2
        (["--train-prompts", "5-2"], "--train-prompts"),
    ],
)
def test_tune_cli_refuses_bad_flags(tmp_path, capsys, flags, complaint):
    err = refusal(tune_cli.main, ["budgets", "--out", str(tmp_path), "--model", "tiny-random", "--no-plots", *flags], capsys)
    assert complaint in err


def test_tune_cli_without_ray_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    err = refusal(tune_cli.main, ["budgets", "--out", str(tmp_path), "--model", "tiny-random", "--no-plots"], capsys)
    assert "pip install 'santa-attention[tune]'" in err


def test_tune_cli_refuses_a_folder_of_another_run(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps(SYNTHETIC_SPEC.to_dict()))
    err = refusal(tune_cli.main, ["budgets", "--out", str(tmp_path), "--model", "tiny-random", "--reward", "synthetic", "--no-plots"], capsys)
    assert "other settings" in err
