"""Mixed workers for ``santa tune budgets``: GPU workers plus ``--cpu-workers N`` CPU workers.

A CUDA worker cannot run here, but its scheduling can: the local Ray of this module declares one
GPU (``num_gpus=1``) that no process uses, and the ``synthetic`` reward ignores its device. The
driver's spawn/replace logic is also checked against a fake Ray, with no timing at all.
"""

import json
import math
import os

import pytest

from helpers import REPO, SYNTHETIC_SPEC, assert_consistent_history, refusal, tune_history

ray = pytest.importorskip("ray")

from santa.budgets import tune_cli  # noqa: E402
from santa.budgets.distributed import Driver, Hooks, actor_options, missing_resources, tune, worker_kind  # noqa: E402
from santa.budgets.run_folder import HISTORY  # noqa: E402


@pytest.fixture(scope="module")
def fake_gpu_ray():
    """A local Ray with 2 CPUs and one declared (fake) GPU."""
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"  # see test_budgets_tune.py
    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def episodes(updates):
    return [e for u in updates for e in u["episodes"]]


# --- pure functions -------------------------------------------------------------------------------


def test_actor_options_give_a_cuda_worker_one_gpu_and_a_cpu_worker_its_threads():
    assert actor_options("cuda", 4) == {"num_cpus": 1, "num_gpus": 1}
    assert actor_options("cuda:1", 4) == {"num_cpus": 1, "num_gpus": 1}
    assert actor_options("cpu", 4) == {"num_cpus": 4}
    assert [worker_kind(d) for d in ("cuda", "cuda:3", "cpu")] == ["cuda", "cuda", "cpu"]


@pytest.mark.parametrize(
    ("cluster", "kwargs", "complaint"),
    [
        ({"CPU": 16, "GPU": 1}, dict(device="cuda", workers=1, cpu_workers=3, threads=4), None),  # 1 + 3·4 = 13 ≤ 16
        ({"CPU": 16, "GPU": 1}, dict(device="cuda", workers=None, cpu_workers=4, threads=4), "need 17 CPUs"),
        ({"CPU": 16}, dict(device="cuda", workers=None, cpu_workers=0, threads=1), "need 1 GPU"),
        ({"CPU": 16, "GPU": 1}, dict(device="cuda", workers=2, cpu_workers=0, threads=1), "need 2 GPU"),
        ({"CPU": 2}, dict(device="cpu", workers=3, cpu_workers=0, threads=1), "need 3 CPUs"),
        ({"CPU": 2}, dict(device="cpu", workers=None, cpu_workers=0, threads=2), None),
    ],
)
def test_missing_resources(cluster, kwargs, complaint):
    problem = missing_resources(cluster, **kwargs)
    assert problem is None if complaint is None else complaint in problem


def test_cpu_workers_need_cuda_workers(tmp_path):
    with pytest.raises(ValueError, match="device cuda"):
        tune(SYNTHETIC_SPEC, out=tmp_path, iterations=1, device="cpu", cpu_workers=1)


# --- the driver against a fake Ray: which workers it starts and how it replaces them ----------------


class FakeActor:
    def __init__(self, options, args):
        self.options, self.args = options, args
        self.episode = self

    def remote(self, *args):  # episode.remote(...): a reference nobody waits for here
        return object()


class FakeRemote:
    def __init__(self, log):
        self.log, self.next_options = log, {}

    def options(self, **options):
        self.next_options = options
        return self

    def remote(self, *args):
        actor = FakeActor(self.next_options, args)
        self.log.append(actor)
        return actor


class FakeRay:
    def __init__(self):
        self.started, self.killed = [], []

    def remote(self, cls):
        return FakeRemote(self.started)

    def kill(self, actor):
        self.killed.append(actor)

    def cluster_resources(self):
        return {"CPU": 16, "GPU": 1}


def fake_driver(tmp_path, **kwargs):
    fake = FakeRay()
    driver = Driver(fake, SYNTHETIC_SPEC, out=tmp_path, hooks=Hooks(), poll_s=0.1, **kwargs)
    return fake, driver


def test_driver_starts_gpu_workers_then_cpu_workers_with_their_resources(tmp_path):
    fake, driver = fake_driver(tmp_path, requested=1, device="cuda", threads=4, cpu_workers=3)
    driver.rescale()
    assert [a.options for a in fake.started] == [{"num_cpus": 1, "num_gpus": 1, "max_restarts": 0}] + [{"num_cpus": 4, "max_restarts": 0}] * 3
    assert [a.args[2] for a in fake.started] == ["cuda", "cpu", "cpu", "cpu"]  # the device each worker builds its model on
    assert driver.counts() == {"cuda": 1, "cpu": 3}
    driver.rescale()  # nothing more to start
    assert len(fake.started) == 4


def test_driver_replaces_a_dead_worker_with_one_of_its_kind(tmp_path):
    fake, driver = fake_driver(tmp_path, requested=1, device="cuda", threads=2, cpu_workers=2)
    driver.rescale()
    for kind in ("cpu", "cuda"):
        run = next(r for r in driver.runs.values() if driver.devices[r.worker] == kind)
        dead = driver.actors[run.worker]
        del driver.runs[run.id]
        run.worker_died = True
        driver.release([run], more=True)
        assert fake.killed[-1] is dead and fake.started[-1].args[2] == kind
        assert run.worker not in driver.actors and driver.counts() == {"cuda": 1, "cpu": 2}
    assert [a.options.get("num_gpus", 0) for a in fake.started] == [1, 0, 0, 0, 1]


def test_workers_file_scales_the_gpu_workers_only(tmp_path):
    fake, driver = fake_driver(tmp_path, requested=None, device="cuda", threads=1, cpu_workers=1)
    driver.rescale()
    assert driver.counts() == {"cuda": 1, "cpu": 1}  # auto: one per GPU of the (fake) cluster
    (tmp_path / "workers").write_text("2\n")
    driver.rescale()
    assert driver.counts() == {"cuda": 1, "cpu": 1}  # a second GPU worker could never be placed
    fake.cluster_resources = lambda: {"CPU": 16, "GPU": 2}  # a GPU node joins
    driver.rescale()
    assert driver.counts() == {"cuda": 2, "cpu": 1}
    (tmp_path / "workers").write_text("0\n")
    driver.rescale()  # the GPU workers retire when their run ends; the CPU worker stays
    assert {driver.devices[w] for w in driver.actors if w not in driver.retiring} == {"cpu"}


def test_driver_without_cpu_workers_starts_as_before(tmp_path):
    fake, driver = fake_driver(tmp_path, requested=2, device="cpu", threads=3)
    driver.rescale()
    assert [a.options for a in fake.started] == [{"num_cpus": 3, "max_restarts": 0}] * 2
    assert driver.counts() == {"cpu": 2}


# --- a mixed run on a local Ray with a declared GPU -------------------------------------------------


@pytest.fixture(scope="module")
def mixed_run(fake_gpu_ray, tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed")
    result = tune(SYNTHETIC_SPEC, out=out, iterations=4, workers=1, cpu_workers=1, device="cuda", threads=1, poll_s=0.2, progress=False)
    return out, result


def test_mixed_run_records_the_kind_of_worker_of_every_episode(mixed_run):
    out, _ = mixed_run
    updates = tune_history(out)
    kinds = {e["worker"]: e["device"] for e in episodes(updates)}
    assert sorted(kinds.values()) == ["cpu", "cuda"]  # both first runs are accepted (the drain keeps the run in flight)
    assert all(u["devices"] == {"cuda": 1, "cpu": 1} for u in updates)
    pids = {e["device"]: e["pid"] for e in episodes(updates)}
    assert pids["cuda"] != pids["cpu"] and all(p > 0 for p in pids.values())
    assert all(e["finished"] > 0 and e["seconds"] >= 0 for e in episodes(updates))


def test_mixed_run_history_is_consistent(mixed_run):
    out, result = mixed_run
    assert 4 <= result.state.version <= 5
    assert_consistent_history(tune_history(out))


def test_mixed_run_replaces_a_killed_cpu_worker_with_a_cpu_worker(fake_gpu_ray, tmp_path):
    # Both first workers (0: cuda, 1: cpu) die as their 2nd episode starts: each run keeps episode 0,
    # two updates at most, so replacements must finish the third.
    tune(SYNTHETIC_SPEC, out=tmp_path, iterations=3, workers=1, cpu_workers=1, device="cuda", threads=1, poll_s=0.2, progress=False,
         hooks=Hooks(worker_faults={0: 2, 1: 2}))
    updates = tune_history(tmp_path)
    kinds = {e["worker"]: e["device"] for e in episodes(updates)}
    assert {"0-0-0", "0-1-0"} <= {e["id"] for e in episodes(updates)}
    assert kinds.get("0-w0") == "cuda" and kinds.get("0-w1") == "cpu"
    assert set(kinds) - {"0-w0", "0-w1"}  # a replacement worked
    assert_consistent_history(updates)


def test_max_seconds_ends_a_run_and_a_resume_goes_on(fake_gpu_ray, tmp_path):
    result = tune(SYNTHETIC_SPEC, out=tmp_path, iterations=10**6, workers=1, device="cpu", poll_s=0.2, progress=False, max_seconds=1.0)
    assert 1 <= result.state.version < 10**6
    first = result.state.version
    result = tune(SYNTHETIC_SPEC, out=tmp_path, iterations=first + 2, workers=1, device="cpu", poll_s=0.2, progress=False)
    assert result.state.version == first + 2
    assert_consistent_history(tune_history(tmp_path))


def test_old_histories_without_the_new_fields_replay(tmp_path, fake_gpu_ray):
    tune(SYNTHETIC_SPEC, out=tmp_path, iterations=2, workers=1, device="cpu", poll_s=0.2, progress=False)
    updates = tune_history(tmp_path)
    for u in updates:
        u.pop("devices")
        for e in u["episodes"]:
            for key in ("device", "pid", "finished"):
                e.pop(key)
    (tmp_path / HISTORY).write_text("".join(json.dumps(u) + "\n" for u in updates))
    assert_consistent_history(tune_history(tmp_path))
    assert tune(SYNTHETIC_SPEC, out=tmp_path, iterations=3, workers=1, device="cpu", poll_s=0.2, progress=False).state.version == 3


# --- the command line --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--cpu-workers", "2"], "--cpu-workers"),  # the default --device auto
        (["--device", "cpu", "--cpu-workers", "2"], "needs --device cuda"),
        (["--device", "cuda", "--cpu-workers", "-1"], "--cpu-workers"),
        (["--device", "cuda", "--cpu-workers", "x"], "--cpu-workers"),
        (["--device", "cuda", "--cpu-workers", "3", "--threads", "4", "--num-cpus", "8"], "need 13 CPUs"),
        (["--device", "cuda", "--num-gpus", "1", "--workers", "2", "--num-cpus", "8"], "need 2 GPU"),
        (["--device", "cpu", "--workers", "3", "--num-cpus", "2"], "need 3 CPUs"),
        (["--num-gpus", "-1"], "--num-gpus"),
        (["--address", "auto", "--num-gpus", "1"], "--num-gpus"),
        (["--max-seconds", "0"], "--max-seconds"),
        (["--max-seconds", "nan"], "--max-seconds"),
        (["--max-staleness", "-1"], "--max-staleness"),
        (["--max-staleness", "two"], "--max-staleness"),
    ],
)
def test_tune_cli_refuses_bad_worker_flags(tmp_path, capsys, flags, complaint):
    err = refusal(tune_cli.main, ["budgets", "--out", str(tmp_path), "--model", "tiny-random", "--reward", "synthetic", "--no-plots", *flags], capsys)
    assert complaint in err


def test_tune_cli_mixed_run(fake_gpu_ray, tmp_path, capsys):
    from santa.budgets.tune_cli import main

    argv = ["budgets", "--out", str(tmp_path), "--model", "tiny-random", "--reward", "synthetic", "--no-plots", "--no-progress",
            "--device", "cuda", "--workers", "1", "--cpu-workers", "1", "--threads", "1", "--num-cpus", "2", "--num-gpus", "1",
            "--episodes", "2", "--iterations", "2"]
    assert main(argv) == 0
    assert {e["device"] for e in episodes(tune_history(tmp_path))} == {"cuda", "cpu"}
    from santa.budgets.tune_cli import DEFAULT_MAX_STALENESS

    assert json.loads((tmp_path / "run.json").read_text())["max_staleness"] == DEFAULT_MAX_STALENESS
    assert f"dropped as more than {DEFAULT_MAX_STALENESS} versions stale" in capsys.readouterr().out


# --- benchmarks/tune/tune_report.py: the analysis the device run relies on ------------------------


@pytest.fixture(scope="module")
def report():
    import importlib.util

    path = REPO / "benchmarks" / "tune" / "tune_report.py"
    spec = importlib.util.spec_from_file_location("tune_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_episode(worker, device, finished, pid=1, run=0, k=0):
    return {"id": f"0-{run}-{k}", "worker": worker, "device": device, "finished": finished, "seconds": 0.5, "pid": pid}


def test_report_union_length(report):
    assert report.union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert report.union_length([]) == 0


def test_report_rates_add_side_by_side_workers_and_chain_replacements(report):
    episodes = [fake_episode("0-w0", "cuda", t) for t in (10, 11, 12)]  # 2 steady episodes in 2 s, then killed
    episodes += [fake_episode("0-w2", "cuda", t) for t in (14, 15, 16)]  # its replacement: 2 in 2 s
    episodes += [fake_episode(w, "cpu", t) for w in ("0-w1", "0-w3") for t in (10, 16)]  # 1 each in 6 s
    r = report.rates(episodes)
    assert r["kinds"]["cuda"]["per_min"] == pytest.approx(4 / 4 * 60)  # not 2 × 60: the two never ran together
    assert r["kinds"]["cpu"]["per_min"] == pytest.approx(2 / 6 * 60)
    assert r["all"]["episodes"] == 10 and r["all"]["session_per_min"] == pytest.approx(10 / 6 * 60)


def test_report_kill_check_finds_the_victim_and_its_replacement(report):
    updates = [{"session": 1, "episodes": [fake_episode("1-w0", "cuda", 10, pid=7), fake_episode("1-w1", "cpu", 12, pid=8),
                                           fake_episode("1-w2", "cuda", 20, pid=9)]}]
    check = report.kill_check(updates, {"session": 1, "time": 11.0, "pid": 7, "device": "cuda"})
    assert check["worker"] == "1-w0" and check["episodes_after_kill"] == 0
    assert check["replaced"] and check["replacements"] == ["1-w2"]
    assert not report.kill_check(updates, {"session": 1, "time": 30.0, "pid": 7, "device": "cuda"})["replaced"]


def test_report_checks_a_mixed_run(report, mixed_run):
    out, _ = mixed_run
    result = report.summary({"mixed": out}, kill=None, eval_path=None)["runs"]["mixed"]
    check = result["check"]
    assert check["updates_contiguous"] and check["episode_ids_unique"] and check["replay_matches"]
    assert check["runs_are_prefixes"] and check["short_runs"] == {}
    assert set(result["sessions"]["0"]["kinds"]) == {"cuda", "cpu"}
    assert check["dropped"] == 0 and check["max_staleness"] is None and set(check["staleness"]) == {"cuda", "cpu"}


# --- the staleness limit ------------------------------------------------------------------------------


class Landed:
    """A finished run as :meth:`Driver.accept` sees it: its episodes' result dicts."""

    def __init__(self, *versions, start=0):
        self.results = [
            dict(id=f"9-{start}-{i}", schedule=[4, 4, 4, 4], reward=float(i + start), version=v, worker="9-w0", seconds=0.1,
                 device="cpu", pid=1, finished=1.0)
            for i, v in enumerate(versions)
        ]


def test_episodes_older_than_the_staleness_limit_are_recorded_but_not_learned_from(tmp_path, report):
    import dataclasses

    from santa.budgets.run_folder import prepare

    spec = dataclasses.replace(SYNTHETIC_SPEC, max_staleness=1)
    prepare(tmp_path, spec)
    driver = Driver(FakeRay(), spec, out=tmp_path, requested=1, device="cpu", threads=1, hooks=Hooks(), poll_s=0.1)
    driver.accept([Landed(0, 0)])
    driver.accept([Landed(0, 1, start=10)])  # at version 1: both within 1 version
    assert driver.state.version == 2 and not driver.dropped
    driver.accept([Landed(0, start=20)])  # at version 2, drawn at 0: too stale, and nothing else landed
    assert driver.state.version == 2 and [e.id for e in driver.dropped] == ["9-20-0"]
    driver.accept([Landed(2, 0, start=30)])  # one fresh, one stale: an update from the fresh one only
    updates = tune_history(tmp_path)
    assert [u["update"] for u in updates] == [1, 2, 3]
    assert [e["id"] for e in updates[2]["episodes"]] == ["9-30-0"]
    assert [e["id"] for e in updates[2]["dropped"]] == ["9-20-0", "9-30-1"]
    assert updates[2]["reward_count"] == 5 and not driver.dropped
    assert_consistent_history(updates, spec)  # replaying the accepted episodes gives the recorded θ
    from santa.budgets.run_folder import resume

    assert {"9-20-0", "9-30-1"} <= resume(tmp_path, spec.n_layers).episode_ids  # dropped ids stay used
    check = report.check_history(tmp_path, updates)
    assert check["dropped"] == 2 and check["max_staleness"] == 1 and check["episode_ids_unique"] and check["replay_matches"]
    assert check["staleness"] == {"cpu": {"mean": 0.2, "max": 1}}  # lags 0, 0 | 1, 0 | 0 of the accepted five


def test_no_staleness_limit_learns_from_every_episode(tmp_path):
    driver = Driver(FakeRay(), SYNTHETIC_SPEC, out=tmp_path, requested=1, device="cpu", threads=1, hooks=Hooks(), poll_s=0.1)
    for step in range(4):
        driver.accept([Landed(0, start=10 * step)])
    assert driver.state.version == 4 and all(not u["dropped"] for u in tune_history(tmp_path))


def test_cli_staleness_default_is_the_saved_value_on_resume(tmp_path):
    from santa.budgets.tune_cli import DEFAULT_MAX_STALENESS, resolve_staleness

    assert resolve_staleness("auto", tmp_path / "new") == DEFAULT_MAX_STALENESS
    assert resolve_staleness(None, tmp_path) is None and resolve_staleness(3, tmp_path) == 3
    (tmp_path / "run.json").write_text(json.dumps(SYNTHETIC_SPEC.to_dict() | {"max_staleness": 7}))
    assert resolve_staleness("auto", tmp_path) == 7
    old = SYNTHETIC_SPEC.to_dict()
    old.pop("max_staleness")  # a run made before the limit existed keeps every episode
    (tmp_path / "run.json").write_text(json.dumps(old))
    assert resolve_staleness("auto", tmp_path) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_an_episode_with_a_non_finite_reward_is_left_out_with_a_warning(tmp_path, capsys, bad):
    """A NaN/inf reward would make θ NaN for good (and the history unresumable): it is left out, named."""
    from santa.budgets.run_folder import prepare

    prepare(tmp_path, SYNTHETIC_SPEC)
    driver = Driver(FakeRay(), SYNTHETIC_SPEC, out=tmp_path, requested=1, device="cpu", threads=1, hooks=Hooks(), poll_s=0.1)
    landed = Landed(0, 0)
    landed.results[1]["reward"] = bad
    driver.accept([landed])
    assert driver.state.version == 1 and driver.non_finite == 1
    assert all(math.isfinite(x) for x in driver.state.theta)
    [update] = tune_history(tmp_path)
    assert [e["id"] for e in update["episodes"]] == ["9-0-0"]
    assert "episode 9-0-1 from worker 9-w0 has reward" in capsys.readouterr().err
    driver.accept([Landed(0, start=5)])  # the next update still works
    assert driver.state.version == 2
