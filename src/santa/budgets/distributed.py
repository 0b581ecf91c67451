"""``santa tune budgets`` on Ray: workers evaluate episodes, the driver is the aggregator.

Workers are Ray actors (one per GPU, or CPU workers), each building its model once. A *run* is
``E`` episodes drawn from one policy snapshot: the driver gives an idle worker the newest θ and
sends it the run's episodes one at a time (the next as soon as the last one's
``(id, schedule, reward)`` has arrived: one episode in flight per worker). When
one or more runs have resolved, the driver makes one REINFORCE update from all their episodes (a
double batch when two land together, as in the paper), writes it to the history
(:mod:`santa.budgets.run_folder`), and hands the freed workers a new run with the new θ. It never
waits for a slow worker.

Faults: a worker that dies (killed, OOM, preempted) loses its one episode in flight; the episodes
of its run that had arrived are accepted with the run, and a new worker replaces it.
A killed driver loses the runs in flight; re-running the command resumes from the history.
Worker count: ``--workers N`` (a resume may use another N), ``auto`` (one per GPU of the cluster,
else one per ``threads`` CPUs, re-read as nodes join or leave), or an integer written to
``OUT/workers`` at any time (extra workers retire when their run ends).
Mixed workers: with GPU workers, ``cpu_workers`` (``--cpu-workers N``) adds N CPU workers beside
them, each of ``threads`` torch threads on as many Ray CPUs; ``--workers`` and ``OUT/workers``
count the GPU workers only, and a dead CPU worker is replaced by a CPU worker. Every episode
records its worker's device (``"cuda"`` or ``"cpu"``), process and end time, so that episodes
per minute can be read per kind of worker from the history.
At the end (``iterations`` updates reached, or ``max_seconds`` of this session spent) the driver
stops dispatching and accepts the runs still in flight (at most W − 1 more updates).
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from santa import install_hint
from santa.budgets.reinforce import Episode, PolicyState, episode_seed, reinforce_step, sample_schedule, softmax
from santa.budgets.run_folder import (
    POLICY,
    SCHEDULE,
    CheckpointError,
    Resumed,
    TuneSpec,
    append_update,
    history_lock,
    prepare,
    resume,
    update_record,
)
from santa.budgets.schedule import rounded_schedule
from santa.checks import integer
from santa.schedule_file import write_json_atomic, write_schedule

WORKERS_FILE = "workers"
INSTALL_HINT = f"santa tune needs Ray: {install_hint('tune')}"


class RayMissing(ImportError):
    pass


def import_ray():
    """The ``ray`` module, or :class:`RayMissing` saying how to install it."""
    try:
        import ray
    except ImportError as error:
        raise RayMissing(INSTALL_HINT) from error
    return ray


@dataclass(frozen=True)
class Hooks:
    """Deterministic fault injection for tests.

    worker_faults: ``{k: e}``: the k-th worker this driver session creates (0, 1, …) calls
    ``os._exit`` as its e-th episode (1-based) starts. on_update(u): called after update u is written.
    """

    worker_faults: Mapping[int, int] = field(default_factory=dict)
    on_update: Callable[[int], None] | None = None


class EpisodeWorker:
    """A worker: builds the reward (and its model) once, then evaluates episodes in call order."""

    def __init__(self, spec: dict, name: str, device: str, threads: int | None, die_on_episode: int | None = None) -> None:
        from santa.budgets.rewards import build_reward

        self.spec, self.name, self.die_on_episode = TuneSpec.from_dict(spec), name, die_on_episode
        self.device = worker_kind(device)
        self.reward = build_reward(self.spec.reward, n_layers=self.spec.n_layers, device=device, threads=threads)
        self.started = 0

    def episode(self, theta: list[float], version: int, episode_id: str, seed: int) -> dict:
        """Draw ``s ~ floor + Multinomial(N′, softmax θ)`` with the episode seed and evaluate it."""
        self.started += 1
        if self.die_on_episode == self.started:
            os._exit(1)  # a killed worker: no cleanup, no reply
        schedule = sample_schedule(theta, total=self.spec.total, floor=self.spec.floor, rng=np.random.default_rng(seed))
        start = time.perf_counter()
        reward = float(self.reward([int(s) for s in schedule], seed))
        seconds = time.perf_counter() - start
        episode = Episode(
            episode_id, tuple(int(s) for s in schedule), reward, version, self.name, seconds, self.device, os.getpid(), time.time()
        )
        return asdict(episode)


def worker_kind(device: str) -> str:
    """``"cuda"`` for any CUDA device (``cuda``, ``cuda:1``), else ``"cpu"``: the kind an episode records."""
    return "cuda" if device.startswith("cuda") else "cpu"


def actor_options(device: str, threads: int) -> dict:
    """Ray resources of one worker: a GPU and one CPU for a CUDA worker, ``threads`` CPUs for a CPU one."""
    if worker_kind(device) == "cuda":
        return {"num_cpus": 1, "num_gpus": 1}
    return {"num_cpus": threads}


def worker_lost(ray) -> tuple[type[BaseException], ...]:
    """Ray's errors for a worker that went away (killed, crashed, OOM-killed, its node lost)."""
    names = ("RayActorError", "WorkerCrashedError", "OutOfMemoryError", "NodeDiedError", "ActorUnavailableError")
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


@dataclass
class Run:
    """E episodes on one worker with one policy version, sent one at a time (each after the last
    one's result arrived, so a worker has one episode in flight). ``results``: those finished."""

    id: int
    worker: str
    version: int
    theta: tuple[float, ...]
    size: int
    results: list[dict] = field(default_factory=list)
    sent: int = 0
    worker_died: bool = False

    @property
    def resolved(self) -> bool:
        return self.worker_died or len(self.results) == self.size


@dataclass(frozen=True)
class TuneResult:
    state: PolicyState
    schedule: list[int]
    updates: list[dict]
    out: Path


def missing_resources(cluster: Mapping[str, float], *, device: str, workers: int | None, cpu_workers: int, threads: int) -> str | None:
    """Why the workers asked for can never all run on ``cluster`` (its Ray resources), or None.

    workers: the main kind's count (None: auto, at least one); ``cpu_workers`` CPU workers of
    ``threads`` CPUs come beside CUDA workers. A worker Ray cannot place would wait forever.
    """
    gpus, cpus = cluster.get("GPU", 0), cluster.get("CPU", 0)
    cuda = worker_kind(device) == "cuda"
    main = workers if workers is not None else max(1, int(gpus)) if cuda else 1
    if cuda and gpus < main:
        return f"{main} CUDA worker(s) need {main} GPU(s), and the Ray cluster has {gpus:g}"
    need = main * actor_options(device, threads)["num_cpus"] + cpu_workers * threads
    if need > cpus:
        kinds = f"{main} {worker_kind(device)} worker(s)" + (f" + {cpu_workers} CPU worker(s) of {threads} threads" if cpu_workers else "")
        return f"{kinds} need {need} CPUs, and the Ray cluster has {cpus:g}"
    return None


def desired_workers(*, requested: int | None, out: Path, cluster: Mapping[str, float], gpu: bool, threads: int) -> int:
    """Workers wanted now: ``OUT/workers`` if it holds an integer ≥ 0 (at most what the cluster can
    place: a worker per GPU (``gpu``) or per ``threads`` CPUs; more would wait forever), else
    ``requested``, else that capacity. An empty ``cluster`` (not known) caps nothing."""
    capacity = max(1, int(cluster.get("GPU", 0))) if gpu else max(1, int(cluster.get("CPU", 1)) // max(threads, 1))
    try:
        text = (out / WORKERS_FILE).read_text().strip()
        if text.isascii() and text.isdigit():  # "²".isdigit() holds too, and int("²") fails
            return min(int(text), capacity) if cluster else int(text)
    except OSError:
        pass
    return requested if requested is not None else capacity


class Driver:
    """The aggregator's loop over Ray (see the module docstring)."""

    def __init__(
        self, ray, spec: TuneSpec, *, out: Path, requested: int | None, device: str, threads: int, hooks: Hooks, poll_s: float,
        cpu_workers: int = 0, max_seconds: float | None = None, resumed: Resumed | None = None,
    ) -> None:
        """resumed: the state read from ``out``'s history (read here when None)."""
        self.ray, self.spec, self.out, self.requested = ray, spec, out, requested
        self.device, self.threads, self.hooks, self.poll_s = device, threads, hooks, poll_s
        self.cpu_workers = cpu_workers  # CPU workers beside the GPU workers (device cuda)
        self.deadline = None if max_seconds is None else time.monotonic() + max_seconds
        resumed = resumed or resume(out, spec.n_layers, spec=spec)
        self.state, self.thetas, self.session = resumed.state, dict(resumed.thetas), resumed.session
        self.updates = list(resumed.updates)
        self.dropped: list[Episode] = []  # too stale for the gradient; written with the next update
        self.non_finite = 0  # episodes left out for a NaN or infinite reward
        self.actors: dict[str, object] = {}
        self.devices: dict[str, str] = {}  # worker → its device (self.device, or "cpu" for the extra CPU workers)
        self.retiring: set[str] = set()
        self.runs: dict[int, Run] = {}
        self.pending: dict[object, tuple[int, int]] = {}  # object ref → (run id, episode index)
        self.created = self.next_run = 0
        self.failures = 0  # workers lost in a row without one finished episode
        self.last_error: str | None = None
        self.remote = ray.remote(EpisodeWorker)

    # --- workers ---------------------------------------------------------------------------------

    def spawn(self, device: str) -> str:
        """Start a worker on ``device`` (its Ray resources: :func:`actor_options`) → its name."""
        name = f"{self.session}-w{self.created}"
        self.actors[name] = self.remote.options(**actor_options(device, self.threads), max_restarts=0).remote(
            self.spec.to_dict(), name, device, self.threads, self.hooks.worker_faults.get(self.created)
        )
        self.devices[name] = device
        self.created += 1
        return name

    def dispatch(self, worker: str) -> None:
        """Start a run of E episodes on ``worker`` with the newest policy."""
        run = Run(self.next_run, worker, self.state.version, self.state.theta, self.spec.episodes)
        self.next_run += 1
        self.runs[run.id] = run
        self.send(run)

    def send(self, run: Run) -> None:
        """Send the run's next episode to its worker."""
        episode_id = f"{self.session}-{run.id}-{run.sent}"
        seed = episode_seed(self.spec.seed, episode_id)
        ref = self.actors[run.worker].episode.remote(list(run.theta), run.version, episode_id, seed)
        self.pending[ref] = (run.id, run.sent)
        run.sent += 1

    def busy(self) -> set[str]:
        return {r.worker for r in self.runs.values()}

    def active(self, device: str) -> list[str]:
        """The workers on ``device`` that are not retiring, oldest first."""
        return [w for w in self.actors if self.devices[w] == device and w not in self.retiring]

    def rescale(self) -> None:
        """Start or retire workers to match :func:`desired_workers` (and top the CPU workers up to ``cpu_workers``)."""
        cluster = self.ray.cluster_resources()
        wanted = desired_workers(requested=self.requested, out=self.out, cluster=cluster, gpu=worker_kind(self.device) == "cuda", threads=self.threads)
        active = self.active(self.device)
        for worker in active[wanted:]:
            self.retiring.add(worker)
            if worker not in self.busy():
                self.stop(worker)
        for _ in range(wanted - len(active)):
            self.dispatch(self.spawn(self.device))
        if self.cpu_workers:
            for _ in range(self.cpu_workers - len(self.active("cpu"))):
                self.dispatch(self.spawn("cpu"))

    def stop(self, worker: str) -> None:
        actor = self.actors.pop(worker, None)
        self.devices.pop(worker, None)
        self.retiring.discard(worker)
        if actor is not None:
            self.ray.kill(actor)

    def counts(self) -> dict[str, int]:
        """Workers per device now, e.g. ``{"cuda": 1, "cpu": 3}``."""
        out: dict[str, int] = {}
        for device in self.devices.values():
            out[worker_kind(device)] = out.get(worker_kind(device), 0) + 1
        return out

    # --- the loop --------------------------------------------------------------------------------

    def collect(self, timeout: float) -> list[Run]:
        """Results that have landed (waiting up to ``timeout`` for the first) → runs now resolved."""
        ray = self.ray
        if not self.pending:
            time.sleep(timeout)
            return []
        ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=timeout)
        if not ready:
            return []
        ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0)  # all that landed
        for ref in ready:
            run_id, _ = self.pending.pop(ref)
            run = self.runs[run_id]
            try:
                run.results.append(ray.get(ref))
                self.failures = 0
            except worker_lost(ray) as error:
                run.worker_died = True
                self.last_error = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                continue
            if not run.resolved:
                self.send(run)
        resolved = [r for r in self.runs.values() if r.resolved]
        for run in resolved:
            del self.runs[run.id]
        return resolved

    def accept(self, runs: list[Run]) -> None:
        """One REINFORCE update from every finished episode of ``runs`` drawn at most
        ``spec.max_staleness`` versions ago, written before anything else; older ones are dropped
        (kept for the next update's record, so that their ids stay used)."""
        episodes = [Episode(**{**d, "schedule": tuple(d["schedule"])}) for r in runs for d in r.results]
        episodes = self.finite_rewards(episodes)
        limit = self.spec.max_staleness
        fresh = []
        for e in episodes:
            (fresh if limit is None or self.state.version - e.version <= limit else self.dropped).append(e)
        if not fresh:
            return
        step = reinforce_step(
            self.state, fresh, theta_of=self.thetas.__getitem__, total=self.spec.total, floor=self.spec.floor,
            alpha=self.spec.alpha, baseline=self.spec.baseline,
        )
        record = update_record(
            state=step.state, session=self.session, baseline=step.baseline, gradient=step.gradient,
            episodes=fresh, workers=len(self.actors), time=time.time(), devices=self.counts(), dropped=self.dropped,
        )
        append_update(self.out, record)  # accepted from here on
        self.dropped = []
        self.state = step.state
        self.thetas[self.state.version] = self.state.theta
        self.updates.append(record)
        write_outputs(self.out, self.spec, self.state)
        if self.hooks.on_update is not None:
            self.hooks.on_update(self.state.version)

    def finite_rewards(self, episodes: list[Episode]) -> list[Episode]:
        """``episodes`` without those whose reward is NaN or ±inf (a broken evaluation: one would turn
        θ into NaN for good); each one left out is one warning line naming its id and worker."""
        for e in episodes:
            if not math.isfinite(e.reward):
                self.non_finite += 1
                print(f"santa tune: warning: episode {e.id} from worker {e.worker} has reward {e.reward}; left out of the update", file=sys.stderr)
        return [e for e in episodes if math.isfinite(e.reward)]

    def release(self, runs: list[Run], *, more: bool) -> None:
        """Replace dead workers, retire extra ones, and give the others a new run if ``more``."""
        for run in runs:
            if run.worker_died:
                device = self.devices[run.worker]
                self.stop(run.worker)
                if not run.results:
                    self.failures += 1
                if self.failures > 3 + len(self.actors):
                    raise RuntimeError(f"workers keep dying before finishing an episode; the last said: {self.last_error}")
                if more:
                    self.dispatch(self.spawn(device))  # a worker of the same kind replaces it
            elif run.worker in self.retiring:
                self.stop(run.worker)
            elif more:
                self.dispatch(run.worker)

    def more(self, iterations: int) -> bool:
        """Whether to dispatch more runs: fewer than ``iterations`` updates and time left."""
        return self.state.version < iterations and (self.deadline is None or time.monotonic() < self.deadline)

    def loop(self, iterations: int, progress: bool) -> None:
        from tqdm import tqdm

        bar = tqdm(total=iterations, initial=min(self.state.version, iterations), desc="santa tune", unit="update", disable=not progress)
        last_rescale = 0.0
        while self.more(iterations):
            if time.monotonic() - last_rescale > self.poll_s:
                self.rescale()
                last_rescale = time.monotonic()
            runs = self.collect(self.poll_s)
            if not runs:
                continue
            before = self.state.version
            self.accept(runs)
            self.release(runs, more=self.more(iterations))
            bar.update(min(self.state.version, iterations) - min(before, iterations))
            if self.updates and self.state.version > before:
                rewards = [e["reward"] for e in self.updates[-1]["episodes"]]
                workers = " + ".join(f"{n} {d}" for d, n in sorted(self.counts().items()))
                bar.set_postfix_str(
                    f"reward {np.mean(rewards):.4f} (mean {self.state.running_mean:.4f}), workers {workers}, episodes {self.state.reward_count}"
                )
        bar.close()
        while self.runs:  # drain: the runs in flight are accepted, not thrown away
            runs = self.collect(self.poll_s)
            if runs:
                self.accept(runs)
                self.release(runs, more=False)

    def shutdown(self) -> None:
        for worker in list(self.actors):
            self.stop(worker)


def write_outputs(out: Path, spec: TuneSpec, state: PolicyState) -> None:
    """``policy.json`` (θ, p) and ``schedule.json`` (the rounded mean of the policy), atomically."""
    probs = softmax(state.theta)
    write_json_atomic(out / POLICY, {"theta": list(state.theta), "probs": probs.tolist(), "version": state.version})
    schedule = rounded_schedule(probs, total=spec.total, floor=spec.floor)
    write_schedule(
        out / SCHEDULE, schedule, total=spec.total, floor=spec.floor, updates=state.version, episodes=state.reward_count,
        model=spec.reward.model, reward=spec.reward.kind, length=spec.reward.length, sampler=spec.reward.sampler,
        probs=probs.tolist(), source="santa tune budgets",
    )


def tune(
    spec: TuneSpec,
    *,
    out: str | Path,
    iterations: int,
    workers: int | None = None,
    address: str | None = None,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    device: str = "auto",
    threads: int = 1,
    cpu_workers: int = 0,
    max_seconds: float | None = None,
    poll_s: float = 2.0,
    progress: bool = True,
    hooks: Hooks = Hooks(),
) -> TuneResult:
    """Run (or resume) Algorithm 1 until ``iterations`` updates are in ``out``'s history, or until
    ``max_seconds`` have passed (then the runs in flight are accepted and the run ends; resumable).

    Ray: an already initialised Ray is used as it is; else ``address`` joins a cluster, and
    without one a local Ray with ``num_cpus`` CPUs and ``num_gpus`` GPUs (None: all it finds) is
    started (and stopped at the end).
    device ``"auto"``: CUDA workers (one GPU each) when the cluster has GPUs, else CPU workers
    of ``threads`` torch threads (one Ray CPU each thread). cpu_workers: CPU workers beside the
    CUDA workers (device ``"cuda"`` only). Workers the cluster can never place raise RuntimeError.
    One driver per ``out``: the history is locked for the whole run (a second driver raises
    :class:`~santa.budgets.run_folder.RunLocked`), and ``run.json`` and every history line are
    checked before Ray starts (:class:`~santa.budgets.run_folder.CheckpointError` naming the file and line).
    """
    iterations = integer("iterations", iterations, low=1)
    threads = integer("threads", threads, low=1)
    cpu_workers = integer("cpu_workers", cpu_workers, low=0)
    if workers is not None:
        workers = integer("workers", workers, low=1)
    num_cpus = None if num_cpus is None else integer("num_cpus", num_cpus, low=1)
    num_gpus = None if num_gpus is None else integer("num_gpus", num_gpus, low=0)
    if cpu_workers and worker_kind(device) != "cuda":
        raise ValueError(f"cpu_workers ({cpu_workers}) come beside CUDA workers: they need device cuda, got {device!r}")
    ray = import_ray()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: exists and is not a folder; a tuning run needs a folder")
    out.mkdir(parents=True, exist_ok=True)
    with history_lock(out):
        prepare(out, spec)
        resumed = resume(out, spec.n_layers, spec=spec)
        state, updates = _run_driver(
            ray, spec, out=out, iterations=iterations, workers=workers, address=address, num_cpus=num_cpus, num_gpus=num_gpus,
            device=device, threads=threads, cpu_workers=cpu_workers, max_seconds=max_seconds, poll_s=poll_s, progress=progress,
            hooks=hooks, resumed=resumed,
        )
        write_outputs(out, spec, state)
    schedule = rounded_schedule(softmax(state.theta), total=spec.total, floor=spec.floor)
    return TuneResult(state, schedule, updates, out)


def _run_driver(
    ray, spec: TuneSpec, *, out: Path, iterations: int, workers: int | None, address: str | None, num_cpus: int | None,
    num_gpus: int | None, device: str, threads: int, cpu_workers: int, max_seconds: float | None, poll_s: float,
    progress: bool, hooks: Hooks, resumed: Resumed,
) -> tuple[PolicyState, list[dict]]:
    """Start (or join) Ray, run the driver from ``resumed`` until ``iterations``, stop what it started
    → (the final state, every history record)."""
    connected = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False, log_to_driver=False)
        connected = True
    try:
        cluster = ray.cluster_resources()
        if device == "auto":  # one worker per GPU where the cluster has GPUs, CPU workers otherwise
            device = "cuda" if cluster.get("GPU", 0) >= 1 else "cpu"
        if connected and not address:  # a local Ray does not grow: a worker it cannot place would wait forever
            problem = missing_resources(cluster, device=device, workers=workers, cpu_workers=cpu_workers, threads=threads)
            if problem:
                raise RuntimeError(f"the local Ray cannot run these workers: {problem}")
    except BaseException:
        if connected:
            ray.shutdown()
        raise
    driver = Driver(
        ray, spec, out=out, requested=workers, device=device, threads=threads, hooks=hooks, poll_s=poll_s,
        cpu_workers=cpu_workers, max_seconds=max_seconds, resumed=resumed,
    )
    try:
        if driver.state.version < iterations:
            driver.loop(iterations, progress)
    finally:
        driver.shutdown()
        if connected:
            ray.shutdown()
    return driver.state, driver.updates
